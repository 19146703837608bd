// js-admission's decision: refuse prompts over a size limit and requests when the queue is
// full, queue while every server is busy, else run with the tier's priority.

export const MAX_PROMPT_TOKENS = 100_000;
export const MAX_IN_FLIGHT_PER_SERVER = 64;
const PRIORITY = { premium: 3, standard: 1 };

/** ["accept", priority], ["queue", null] or ["reject", reason]. */
export function decide(tier, promptTokens, inFlight, queued, queueCapacity, servers) {
  if (promptTokens > MAX_PROMPT_TOKENS) {
    return ["reject", `a prompt of ${promptTokens} tokens is over the ${MAX_PROMPT_TOKENS} this gateway admits`];
  }
  if (queued >= queueCapacity) {
    return ["reject", "the gateway's queue is full"];
  }
  if (inFlight >= servers * MAX_IN_FLIGHT_PER_SERVER) {
    return ["queue", null];
  }
  return ["accept", PRIORITY[tier] ?? 0];
}
