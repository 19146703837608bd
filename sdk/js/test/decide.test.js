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

test("pair helpers follow the peers' rules", () => {
  const servers = [server("d1", { role: "decode", inFlight: 3 }), server("w"),
    server("d2", { role: "decode", inFlight: 1, healthy: false })];
  assert.deepEqual(decide.decodeServers(servers).map((s) => s.id), ["d1"]);
  const prefill = [server("p1", { role: "prefill" }), server("p2", { role: "prefill" })];
  // p2 holds half the prompt: 500 tokens to do against p1's 100 + 1000.
  const best = decide.leastPrefillWork(prefill, [["p2", 5]], [["p1", 100n]], 1000, 10);
  assert.deepEqual([best.server.id, best.work, best.uncached], ["p2", 500, 500]);
  assert.equal(decide.leastPrefillWork([], [], [], 1000, 10), null);
  assert.ok(decide.worthSplitting(1000, 0, 500, 256));
  assert.ok(!decide.worthSplitting(100, 0, 50, 256), "under the threshold");
  assert.ok(!decide.worthSplitting(1000, 0, 2000, 256), "prefill busier");
  assert.ok(decide.worthSplitting(1000, 0, 2000, 256, true), "waits for it");
  assert.ok(decide.llmDSplits(16, 10, 16, 0));
  assert.ok(!decide.llmDSplits(15, 10, 16, 0));
  assert.ok(!decide.llmDSplits(100, 10, 0, 20));
  // Dynamo: 1,000 of 10,000 tokens to compute is local; 3,000 of 4,000 is split.
  assert.ok(decide.dynamoPrefillsLocally(1000, 10000, 2048, 0.7));
  assert.ok(!decide.dynamoPrefillsLocally(3000, 4000, 2048, 0.7));
  assert.ok(!decide.dynamoPrefillsLocally(1500, 2000, 2048, 0.7), "over 0.7 of the raw");
});

test("power of two draws as the Rust SDK does", () => {
  const servers = [server("a", { inFlight: 5 }), server("b", { inFlight: 1 }), server("c", { inFlight: 3 })];
  // seed 7 on 3 servers: first 7 % 3 = 1 (b), second (7 / 3 + 1 + 1) % 3 = 1 (b).
  assert.equal(decide.powerOfTwo(servers, 7n).id, "b");
  // seed 3: first a, second (1 + 1 + 0) % 3 = 2 (c), which has fewer in flight.
  assert.equal(decide.powerOfTwo(servers, 3).id, "c");
  // The largest u64 wraps as Rust's wrapping_add does.
  assert.ok(decide.powerOfTwo(servers, (1n << 64n) - 1n) !== null);
  assert.equal(decide.powerOfTwo([], 1n), null);
});
