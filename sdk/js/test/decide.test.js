// The JavaScript SDK's decision helpers: the same cases as the Rust and Python SDKs'.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as decide from "../ringmaster-policy.js";

const { server } = decide.testing;

test("lookups default to nothing, BigInt or not", () => {
  assert.equal(decide.matched([["a", 5]], "a"), 5);
  assert.equal(decide.matched([["a", 5]], "b"), 0);
  assert.equal(decide.backlog([["a", 900n]], "a"), 900);
  assert.equal(decide.backlog([["a", 900n]], "b"), 0);
  assert.equal(decide.ringRank(["b", "a"], "a"), 1);
  assert.equal(decide.ringRank(["b"], "a"), decide.NO_RANK);
});

test("uncached tokens and the cap", () => {
  assert.equal(decide.uncachedTokens(1000, 0, 10), 1000);
  assert.equal(decide.uncachedTokens(1000, 4, 10), 600);
  assert.equal(decide.uncachedTokens(1000, 12, 10), 0);
  assert.equal(decide.uncachedTokens(1000, 0, 0), 1000);
  assert.equal(decide.boundedCap(server("a"), 4, 2, 1.25, 2), 6);
});

test("unhealthy servers are never picked", () => {
  const servers = [server("a", { healthy: false }), server("b", { inFlight: 9 })];
  assert.equal(decide.leastInFlight(servers).id, "b");
  assert.equal(decide.leastInFlight([server("a", { healthy: false })]), null);
  assert.equal(decide.cheapestPrefill(servers, [["a", 10]], [], 1000, 10).id, "b");
});

test("the queue of prefill work outweighs a small saving", () => {
  const servers = [server("a"), server("b")];
  assert.equal(decide.cheapestPrefill(servers, [["a", 6]], [["a", 2000n]], 1000, 10, ["a", "b"]).id, "b");
  assert.equal(decide.cheapestPrefill(servers, [["a", 6]], [["a", 300n]], 1000, 10, ["b", "a"]).id, "a");
  assert.equal(decide.cheapestPrefill(servers, [["a", 6]], [["a", 2000n]], 1000, 10, ["a", "b"], { cacheWeight: 16 }).id, "a");
});

test("ties follow the ring", () => {
  const servers = [server("a"), server("b"), server("c")];
  assert.equal(decide.cheapestPrefill(servers, [], [], 100, 0, ["c", "a", "b"]).id, "c");
});
