// js-router's decision: the healthy server where the request's prefill would start soonest
// (the prompt tokens queued there plus the part of this prompt its cache does not hold).
import { cheapestPrefill } from "./ringmaster-policy.js";

/** The server for a request, or null when no server is healthy. */
export function choose(servers, matches, backlogs, promptTokens, prefixHashes, order) {
  return cheapestPrefill(servers, matches, backlogs, promptTokens, prefixHashes, order, { cacheWeight: 1, slack: 2 });
}
