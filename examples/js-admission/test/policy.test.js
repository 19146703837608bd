// js-admission's decision, tested natively: node --test test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { decide as admit } from "../policy.js";

test("runs with the tier's priority", () => {
  assert.deepEqual(admit("premium", 100, 0, 0, 256, 4), ["accept", 3]);
  assert.deepEqual(admit("anonymous", 100, 0, 0, 256, 4), ["accept", 0]);
});

test("queues while busy and refuses when full or too long", () => {
  assert.deepEqual(admit("standard", 100, 256, 0, 256, 4), ["queue", null]);
  assert.equal(admit("standard", 100, 0, 256, 256, 4)[0], "reject");
  const [kind, reason] = admit("standard", 200_000, 0, 0, 256, 4);
  assert.equal(kind, "reject");
  assert.match(reason, /200000 tokens/);
});
