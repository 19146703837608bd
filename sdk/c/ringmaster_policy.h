/*
 * ringmaster_policy.h: Ringmaster's C policy SDK, the same pure decision helpers as the Rust
 * SDK's `decide` module and the Python and JavaScript SDKs.
 *
 * Header-only and free of the generated bindings: a policy converts what the host returns
 * (the `cluster.servers()` list, `cluster.prefix-matches()`, `cluster.prefill-backlog()`,
 * `ring.candidates(...)`) into the plain structs below once, pointing at the same bytes, and
 * decides on those. So its logic compiles and unit-tests natively with any C compiler, and
 * the same source goes into the component.
 *
 * Conventions: only healthy servers are ever picked; ties end with the ring order, then the
 * lower id, so every helper is deterministic for a given input. Strings are WIT strings:
 * UTF-8 bytes with a length, not NUL-terminated. Nothing here allocates.
 */
#ifndef RINGMASTER_POLICY_H
#define RINGMASTER_POLICY_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A rank for a server that is not in the order given. */
#define RM_NO_RANK ((uint64_t)1 << 62)

/* A string as the host passes it: bytes and a length. */
typedef struct rm_str {
  const uint8_t *ptr;
  size_t len;
} rm_str;

/* What a server does in a disaggregated fleet: the WIT `role` enum, in its order. */
typedef enum rm_role {
  RM_ROLE_BOTH = 0,
  RM_ROLE_PREFILL = 1,
  RM_ROLE_DECODE = 2,
} rm_role;

/* One server, with the fields of the WIT `server` record (its `role` last, so initialisers
 * written before ringmaster:policy@0.3.0 keep compiling: zero is `both`). */
typedef struct rm_server {
  rm_str id;
  bool healthy;
  uint32_t weight;
  uint32_t in_flight;
  uint32_t waiting;
  uint32_t kv_blocks_used;
  uint32_t kv_blocks_total;
  rm_role role;
} rm_server;

/* One `cluster.prefix-matches()` entry: how many leading prefix hashes a server holds. */
typedef struct rm_match {
  rm_str id;
  uint32_t hashes;
} rm_match;

/* One `cluster.prefill-backlog()` entry: a server's queued prompt tokens. */
typedef struct rm_backlog {
  rm_str id;
  uint64_t tokens;
} rm_backlog;

/* What `rm_cheapest_prefill` weighs, with the other SDKs' defaults from `rm_prefill_defaults`. */
typedef struct rm_prefill_weights {
  /* How much a token the server's cache holds is worth against one it must compute. */
  double cache_weight;
  /* The bounded-load factor c of `rm_bounded_cap`. */
  double load_factor;
  /* Requests a server may carry over its bounded-load cap. */
  uint32_t slack;
} rm_prefill_weights;

/* cache_weight 1, load_factor 1.25, slack 2: the other SDKs' defaults. */
static inline rm_prefill_weights rm_prefill_defaults(void) {
  rm_prefill_weights w = {1.0, 1.25, 2};
  return w;
}

/* A NUL-terminated C string as an `rm_str` (for tests and fixed names). */
static inline rm_str rm_cstr(const char *text) {
  rm_str s = {(const uint8_t *)text, strlen(text)};
  return s;
}

/* Whether two strings hold the same bytes. */
static inline bool rm_str_eq(rm_str a, rm_str b) {
  return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* Byte-wise order of two strings (negative, zero or positive), shorter first on a tie. */
static inline int rm_str_cmp(rm_str a, rm_str b) {
  size_t n = a.len < b.len ? a.len : b.len;
  int c = n == 0 ? 0 : memcmp(a.ptr, b.ptr, n);
  if (c != 0) return c;
  return (a.len > b.len) - (a.len < b.len);
}

/* How many of the request's leading prefix hashes server `id` holds, by `matches` (a server
 * left out holds none). */
static inline uint32_t rm_matched(const rm_match *matches, size_t n, rm_str id) {
  for (size_t i = 0; i < n; i++) {
    if (rm_str_eq(matches[i].id, id)) return matches[i].hashes;
  }
  return 0;
}

/* Server `id`'s prefill backlog in prompt tokens, by `backlogs` (a server left out has none). */
static inline uint64_t rm_backlog_of(const rm_backlog *backlogs, size_t n, rm_str id) {
  for (size_t i = 0; i < n; i++) {
    if (rm_str_eq(backlogs[i].id, id)) return backlogs[i].tokens;
  }
  return 0;
}

/* Where server `id` stands in `order` (the ring's candidates for the key), for breaking ties;
 * RM_NO_RANK when it is not there. */
static inline uint64_t rm_ring_rank(const rm_str *order, size_t n, rm_str id) {
  for (size_t i = 0; i < n; i++) {
    if (rm_str_eq(order[i], id)) return (uint64_t)i;
  }
  return RM_NO_RANK;
}

/* The fraction of a request's `total` prefix hashes that `matched` covers (0 when it has
 * none). */
static inline double rm_coverage(uint32_t matched, size_t total) {
  if (total == 0) return 0.0;
  double c = (double)matched / (double)total;
  return c < 1.0 ? c : 1.0;
}

/* Of `prompt_tokens`, those a server holding `matched` of `total` leading prefix hashes still
 * has to compute (rounded half away from zero, as the Rust SDK does). */
static inline uint64_t rm_uncached_tokens(uint32_t prompt_tokens, uint32_t matched, size_t total) {
  return (uint64_t)round((double)prompt_tokens * (1.0 - rm_coverage(matched, total)));
}

/* The bounded-load cap ceil(c x (total + 1) x weight / total_weight) + slack: how many requests
 * `server` may carry when `total_in_flight` run on servers of `total_weight` in all. */
static inline uint64_t rm_bounded_cap(const rm_server *server, uint64_t total_in_flight,
                                      uint64_t total_weight, double load_factor, uint32_t slack) {
  double share = (double)(total_in_flight + 1) * (double)server->weight /
                 (double)(total_weight > 0 ? total_weight : 1);
  return (uint64_t)ceil(load_factor * share) + slack;
}

/* The healthy server with the fewest requests in flight (ties: ring order, then id); NULL when
 * none is healthy. */
static inline const rm_server *rm_least_in_flight(const rm_server *servers, size_t n,
                                                  const rm_str *order, size_t n_order) {
  const rm_server *best = NULL;
  uint64_t best_rank = 0;
  for (size_t i = 0; i < n; i++) {
    const rm_server *s = &servers[i];
    if (!s->healthy) continue;
    uint64_t rank = rm_ring_rank(order, n_order, s->id);
    if (best == NULL || s->in_flight < best->in_flight ||
        (s->in_flight == best->in_flight &&
         (rank < best_rank || (rank == best_rank && rm_str_cmp(s->id, best->id) < 0)))) {
      best = s;
      best_rank = rank;
    }
  }
  return best;
}

/* The healthy server with room under the bounded-load cap (with `w.slack`) where the request
 * costs the least prefill: its backlog plus the prompt, less `w.cache_weight` x the tokens its
 * cache holds. Ties: fewer in flight, then ring order, then id. When no server has room, the
 * least loaded. NULL when none is healthy. `prefix_hashes` is how many the request has. */
static inline const rm_server *rm_cheapest_prefill(const rm_server *servers, size_t n,
                                                   const rm_match *matches, size_t n_matches,
                                                   const rm_backlog *backlogs, size_t n_backlogs,
                                                   uint32_t prompt_tokens, size_t prefix_hashes,
                                                   const rm_str *order, size_t n_order,
                                                   rm_prefill_weights w) {
  uint64_t total = 0, weight = 0;
  size_t healthy = 0;
  for (size_t i = 0; i < n; i++) {
    if (!servers[i].healthy) continue;
    healthy++;
    total += servers[i].in_flight;
    weight += servers[i].weight;
  }
  if (healthy == 0) return NULL;
  const rm_server *best = NULL;
  double best_cost = 0.0;
  uint64_t best_rank = 0;
  for (size_t i = 0; i < n; i++) {
    const rm_server *s = &servers[i];
    if (!s->healthy) continue;
    if (s->in_flight >= rm_bounded_cap(s, total, weight, w.load_factor, w.slack)) continue;
    uint32_t held = rm_matched(matches, n_matches, s->id);
    uint64_t cached = prompt_tokens - rm_uncached_tokens(prompt_tokens, held, prefix_hashes);
    double cost = (double)rm_backlog_of(backlogs, n_backlogs, s->id) + (double)prompt_tokens -
                  w.cache_weight * (double)cached;
    uint64_t rank = rm_ring_rank(order, n_order, s->id);
    bool better = best == NULL || cost < best_cost ||
                  (cost == best_cost &&
                   (s->in_flight < best->in_flight ||
                    (s->in_flight == best->in_flight &&
                     (rank < best_rank || (rank == best_rank && rm_str_cmp(s->id, best->id) < 0)))));
    if (better) {
      best = s;
      best_cost = cost;
      best_rank = rank;
    }
  }
  return best != NULL ? best : rm_least_in_flight(servers, n, order, n_order);
}

/* ---- Disaggregated fleets: which servers split a request (ringmaster:policy@0.3.0's pairs) ----
 * A router answers a pair with the generated bindings' `decision` variant; these helpers
 * decide what goes in it. */

/* The first healthy decode server of `servers` at or after index `from` (iterate with the
 * index after the one returned); NULL when there is none. */
static inline const rm_server *rm_next_decode_server(const rm_server *servers, size_t n,
                                                     size_t *from) {
  for (size_t i = *from; i < n; i++) {
    if (servers[i].healthy && servers[i].role == RM_ROLE_DECODE) {
      *from = i + 1;
      return &servers[i];
    }
  }
  *from = n;
  return NULL;
}

/* Of the healthy `candidates` (for instance `cluster.prefill-servers()`), the one with the
 * least prefill work ahead for a prompt of `prompt_tokens` in `total` prefix hashes: its
 * backlog plus the tokens it does not hold. Ties go to the first in the order given. Its work
 * and uncached tokens go to `work` and `uncached` (either may be NULL); NULL when none is
 * healthy. */
static inline const rm_server *rm_least_prefill_work(const rm_server *candidates, size_t n,
                                                     const rm_match *matches, size_t n_matches,
                                                     const rm_backlog *backlogs, size_t n_backlogs,
                                                     uint32_t prompt_tokens, size_t total,
                                                     uint64_t *work, uint64_t *uncached) {
  const rm_server *best = NULL;
  uint64_t best_work = 0, best_uncached = 0;
  for (size_t i = 0; i < n; i++) {
    const rm_server *s = &candidates[i];
    if (!s->healthy) continue;
    uint64_t u = rm_uncached_tokens(prompt_tokens, rm_matched(matches, n_matches, s->id), total);
    uint64_t w = rm_backlog_of(backlogs, n_backlogs, s->id) + u;
    if (best == NULL || w < best_work) {
      best = s;
      best_work = w;
      best_uncached = u;
    }
  }
  if (best != NULL && work != NULL) *work = best_work;
  if (best != NULL && uncached != NULL) *uncached = best_uncached;
  return best;
}

/* Whether a request the decode server would prefill `uncached_on_decode` tokens of is worth
 * splitting by the gateway's own rule: at least `min_uncached_tokens`, and (unless
 * `wait_for_busy_prefill`) a prefill server with no more work ahead (`prefill_work`) than the
 * decode server would have doing the prompt itself (`decode_backlog + uncached_on_decode`). */
static inline bool rm_worth_splitting(uint64_t uncached_on_decode, uint64_t decode_backlog,
                                      uint64_t prefill_work, uint64_t min_uncached_tokens,
                                      bool wait_for_busy_prefill) {
  return uncached_on_decode >= min_uncached_tokens &&
         (wait_for_busy_prefill || prefill_work <= decode_backlog + uncached_on_decode);
}

/* llm-d's prefix-based decider: split iff the decode server would compute at least
 * `non_cached_tokens` of the prompt and the prompt has at least `min_prompt_tokens`. */
static inline bool rm_llm_d_splits(uint64_t uncached_on_decode, uint32_t prompt_tokens,
                                   uint64_t non_cached_tokens, uint32_t min_prompt_tokens) {
  return uncached_on_decode >= non_cached_tokens && prompt_tokens >= min_prompt_tokens;
}

/* NVIDIA Dynamo's `isl_bounding` rule: prefill on the decode server when the effective input
 * length (the tokens it would compute) is under `threshold` and under `ratio` of the raw
 * input length; split otherwise. */
static inline bool rm_dynamo_prefills_locally(uint64_t effective, uint32_t raw, uint64_t threshold,
                                              double ratio) {
  return raw > 0 && effective < threshold && (double)effective < ratio * (double)raw;
}

/* Of two servers drawn by `seed` from the healthy `servers`, the one with fewer requests in
 * flight (SMG's and vllm-router's `power_of_two`); ties go to the first drawn. The same draw
 * as the Rust SDK's (unsigned arithmetic wraps as its wrapping_add); NULL when none is
 * healthy. */
static inline const rm_server *rm_power_of_two(const rm_server *servers, size_t n, uint64_t seed) {
  uint64_t healthy = 0;
  for (size_t i = 0; i < n; i++) healthy += servers[i].healthy ? 1 : 0;
  if (healthy == 0) return NULL;
  uint64_t first_at = seed % healthy;
  uint64_t second_at = (seed / healthy + 1 + seed % healthy) % healthy;
  const rm_server *first = NULL, *second = NULL;
  uint64_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (!servers[i].healthy) continue;
    if (k == first_at) first = &servers[i];
    if (k == second_at) second = &servers[i];
    k++;
  }
  return second->in_flight < first->in_flight ? second : first;
}

/* For unit tests, natively: RM_CHECK(cond) counts and reports a failed check without stopping;
 * `return rm_test_finish("name");` at the end of main says how it went and gives the exit
 * status. */
static inline int *rm_test_failures(void) {
  static int failures = 0;
  return &failures;
}

#define RM_CHECK(cond)                                                   \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      ++*rm_test_failures();                                             \
    }                                                                    \
  } while (0)

static inline int rm_test_finish(const char *suite) {
  int failures = *rm_test_failures();
  if (failures > 0) {
    fprintf(stderr, "%s: %d check(s) failed\n", suite, failures);
    return EXIT_FAILURE;
  }
  printf("%s: all tests passed\n", suite);
  return EXIT_SUCCESS;
}

/* For unit tests: a healthy server called `id` (a C string) of weight 1 taking whole requests
 * with nothing in flight and 1024 KV blocks free; set the fields to change it. */
static inline rm_server rm_test_server(const char *id) {
  rm_server s = {rm_cstr(id), true, 1, 0, 0, 0, 1024, RM_ROLE_BOTH};
  return s;
}

#ifdef __cplusplus
}
#endif

#endif /* RINGMASTER_POLICY_H */
