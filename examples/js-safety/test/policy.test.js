// js-safety's decision, tested natively: node --test test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { blockedBy, patternsOf } from "../policy.js";

test("a pattern in any case is found and named", () => {
  const patterns = patternsOf(undefined);
  assert.equal(blockedBy("please DROP TABLE users", patterns), "drop table");
  assert.equal(blockedBy("x; rm -rf / now", patterns), "rm -rf /");
});

test("clean text and empty patterns pass", () => {
  assert.equal(blockedBy("a table for two", patternsOf(undefined)), null);
  assert.equal(blockedBy("anything", patternsOf(" , ,\n")), null);
  assert.equal(blockedBy("the SECRET word", patternsOf("nope\n secret ")), "secret");
});
