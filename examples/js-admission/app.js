// js-admission: a Ringmaster admission policy in JavaScript (componentize-js). The decision
// itself lives in policy.js, which imports nothing generated, so `node --test` tests it
// without Wasm; this file only translates it to the WIT verdict.
import { decide } from "./policy.js";

export function admit(req, current) {
  const [kind, value] = decide(req.tier(), req.promptTokens(), current.inFlight, current.queued,
    current.queueCapacity, current.servers);
  if (kind === "accept") {
    return { tag: "accept", val: value };
  }
  if (kind === "queue") {
    return { tag: "queue" };
  }
  return { tag: "reject", val: { reason: value, retryAfterMs: 1000 } };
}
