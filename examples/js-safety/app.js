// js-safety: a Ringmaster safety filter in JavaScript (componentize-js). The decision itself
// lives in policy.js, which imports nothing generated, so `node --test` tests it without
// Wasm; this file reads the configuration (`patterns`) once per instance and answers.
import { get } from "ringmaster:policy/config@0.3.0";
import { blockedBy, patternsOf } from "./policy.js";

let patterns = null;

function verdict(text, what) {
  patterns ??= patternsOf(get("patterns"));
  const pattern = blockedBy(text, patterns);
  if (pattern === null) {
    return { tag: "allow" };
  }
  return { tag: "block", val: `the ${what} contains "${pattern}"` };
}

export function checkInput(text) {
  return verdict(text, "prompt");
}

export function checkOutput(window, final) {
  return verdict(window, "reply");
}
