// Ringmaster's policy SDK for JavaScript (componentize-js): the pure decision helpers of the
// Rust SDK's `decide` module, over the values a policy gathered from the host. They import
// nothing generated, so a policy's logic runs under `node --test` without Wasm.
//
// A server is an object with the WIT record's fields in camelCase (`id`, `role`, `healthy`,
// `weight`, `inFlight`, `waiting`, `kvBlocksUsed`, `kvBlocksTotal`), as componentize-js gives
// them; `testing.server` builds one. u64 values (the routing key, a prefill backlog) arrive as
// BigInt: the helpers take either.
//
// Conventions: only healthy servers are ever picked; ties end with the ring order, then the
// lower id, so every helper is deterministic for a given input.

export const NO_RANK = Number.MAX_SAFE_INTEGER;

/** The healthy servers, in the order given. */
export function healthy(servers) {
  return servers.filter((s) => s.healthy);
}

/** How many leading prefix hashes `id` holds, by `matches` ([id, n] pairs; none if absent). */
export function matched(matches, id) {
  const found = matches.find(([sid]) => sid === id);
  return found ? Number(found[1]) : 0;
}

/** `id`'s prefill backlog in prompt tokens, by `backlogs` ([id, tokens] pairs). */
export function backlog(backlogs, id) {
  const found = backlogs.find(([sid]) => sid === id);
  return found ? Number(found[1]) : 0;
}

/** Where `id` stands in `order` (the ring's candidates for the key); NO_RANK if absent. */
export function ringRank(order, id) {
  const i = order.indexOf(id);
  return i < 0 ? NO_RANK : i;
}

/** The fraction of a request's `total` prefix hashes that `matchedHashes` covers. */
export function coverage(matchedHashes, total) {
  return total <= 0 ? 0 : Math.min(matchedHashes / total, 1);
}

/** Of `promptTokens`, those a server holding `matchedHashes` of `total` still computes. */
export function uncachedTokens(promptTokens, matchedHashes, total) {
  return Math.round(promptTokens * (1 - coverage(matchedHashes, total)));
}

/** The bounded-load cap `ceil(c × (total + 1) × weight / totalWeight) + slack`. */
export function boundedCap(server, totalInFlight, totalWeight, loadFactor = 1.25, slack = 0) {
  const share = ((totalInFlight + 1) * server.weight) / Math.max(totalWeight, 1);
  return Math.ceil(loadFactor * share) + slack;
}

/** The item with the smallest key (arrays compared element by element); each key is computed once. */
function minBy(items, key) {
  let best = null;
  let bestKey = null;
  for (const item of items) {
    const k = key(item);
    if (bestKey === null || less(k, bestKey)) {
      best = item;
      bestKey = k;
    }
  }
  return best;
}

function less(a, b) {
  for (let i = 0; i < a.length; i++) {
    if (a[i] < b[i]) return true;
    if (a[i] > b[i]) return false;
  }
  return false;
}

/** The healthy server with the fewest requests in flight (ties: ring order, then id). */
export function leastInFlight(servers, order = []) {
  const candidates = healthy(servers);
  if (candidates.length === 0) return null;
  return minBy(candidates, (s) => [s.inFlight, ringRank(order, s.id), s.id]);
}

/**
 * The healthy server with room under the bounded-load cap (with `slack`) where the request
 * costs the least prefill: its backlog plus the prompt, less `cacheWeight` × the tokens its
 * cache holds. Ties: fewer in flight, then ring order. With no room anywhere, the least
 * loaded; null when none is healthy.
 */
export function cheapestPrefill(servers, matches, backlogs, promptTokens, prefixHashes, order = [],
  { cacheWeight = 1, loadFactor = 1.25, slack = 2 } = {}) {
  const candidates = healthy(servers);
  if (candidates.length === 0) return null;
  const total = candidates.reduce((n, s) => n + s.inFlight, 0);
  const weight = candidates.reduce((n, s) => n + s.weight, 0);
  const roomy = candidates.filter((s) => s.inFlight < boundedCap(s, total, weight, loadFactor, slack));
  if (roomy.length === 0) return leastInFlight(candidates, order);
  const cost = (s) => {
    const cached = promptTokens - uncachedTokens(promptTokens, matched(matches, s.id), prefixHashes);
    return backlog(backlogs, s.id) + promptTokens - cacheWeight * cached;
  };
  return minBy(roomy, (s) => [cost(s), s.inFlight, ringRank(order, s.id), s.id]);
}

// ---- Disaggregated fleets: which servers split a request (ringmaster:policy@0.3.0's pairs) ----
//
// A router answers a pair as `{ tag: "pair", val: { decode, prefill, reason } }` (prefill
// undefined: served whole); these helpers decide what goes in it. A server's `role` is the
// WIT enum as componentize-js gives it: "both", "prefill" or "decode".

const U64 = (1n << 64n) - 1n;

/** The healthy servers that can decode a request another server prefilled. */
export function decodeServers(servers) {
  return healthy(servers).filter((s) => s.role === "decode");
}

/**
 * Of the healthy `candidates` (for instance `cluster.prefillServers()`), the one with the
 * least prefill work ahead for a prompt of `promptTokens` in `total` prefix hashes: its
 * backlog plus the tokens it does not hold. Ties go to the first in the order given.
 * `{ server, work, uncached }`, or null when none is healthy.
 */
export function leastPrefillWork(candidates, matches, backlogs, promptTokens, total) {
  let best = null;
  for (const server of healthy(candidates)) {
    const uncached = uncachedTokens(promptTokens, matched(matches, server.id), total);
    const work = backlog(backlogs, server.id) + uncached;
    if (best === null || work < best.work) best = { server, work, uncached };
  }
  return best;
}

/**
 * Whether a request the decode server would prefill `uncachedOnDecode` tokens of is worth
 * splitting by the gateway's own rule: at least `minUncachedTokens`, and (unless
 * `waitForBusyPrefill`) a prefill server with no more work ahead (`prefillWork`) than the
 * decode server would have doing the prompt itself (`decodeBacklog + uncachedOnDecode`).
 */
export function worthSplitting(uncachedOnDecode, decodeBacklog, prefillWork, minUncachedTokens,
  waitForBusyPrefill = false) {
  return uncachedOnDecode >= minUncachedTokens
    && (waitForBusyPrefill || prefillWork <= decodeBacklog + uncachedOnDecode);
}

/**
 * llm-d's prefix-based decider: split iff the decode server would compute at least
 * `nonCachedTokens` of the prompt and the prompt has at least `minPromptTokens`.
 */
export function llmDSplits(uncachedOnDecode, promptTokens, nonCachedTokens, minPromptTokens = 0) {
  return uncachedOnDecode >= nonCachedTokens && promptTokens >= minPromptTokens;
}

/**
 * NVIDIA Dynamo's `isl_bounding` rule: prefill on the decode server when the effective input
 * length (the tokens it would compute) is under `threshold` and under `ratio` of the raw
 * input length; split otherwise.
 */
export function dynamoPrefillsLocally(effective, raw, threshold = 2048, ratio = 0.7) {
  return raw > 0 && effective < threshold && effective < ratio * raw;
}

/**
 * Of two servers drawn by `seed` (a u64, BigInt or number) from the healthy `servers`, the
 * one with fewer requests in flight (SMG's and vllm-router's `power_of_two`); ties go to the
 * first drawn. The same draw as the Rust SDK's; null when none is healthy.
 */
export function powerOfTwo(servers, seed) {
  const candidates = healthy(servers);
  if (candidates.length === 0) return null;
  const n = BigInt(candidates.length);
  const s = BigInt(seed) & U64;
  const first = candidates[Number(s % n)];
  const second = candidates[Number(((s / n + 1n + (s % n)) & U64) % n)];
  return second.inFlight < first.inFlight ? second : first;
}

/** Servers shaped like the WIT record, for unit tests. */
export const testing = {
  server(id, fields = {}) {
    return {
      id, role: "both", healthy: true, weight: 1, inFlight: 0, waiting: 0, kvBlocksUsed: 0,
      kvBlocksTotal: 1024, ...fields,
    };
  },
};
