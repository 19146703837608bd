// js-router's decision, tested natively: node --test test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { choose } from "../policy.js";
import { testing } from "../ringmaster-policy.js";

const { server } = testing;

test("the server holding the prompt wins until its queue is long", () => {
  const servers = [server("a"), server("b")];
  assert.equal(choose(servers, [["a", 8]], [], 1000, 10, ["b", "a"]).id, "a");
  assert.equal(choose(servers, [["a", 8]], [["a", 5000n]], 1000, 10, ["b", "a"]).id, "b");
});

test("unhealthy servers are never chosen", () => {
  assert.equal(choose([server("a", { healthy: false })], [], [], 10, 0, []), null);
});
