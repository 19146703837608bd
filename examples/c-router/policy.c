/* c-router's decision: the healthy server where the request's prefill would start soonest
 * (the prompt tokens queued there plus the part of this prompt its cache does not hold). */
#include "policy.h"

const rm_server *choose(const rm_server *servers, size_t n, const rm_match *matches,
                        size_t n_matches, const rm_backlog *backlogs, size_t n_backlogs,
                        uint32_t prompt_tokens, size_t prefix_hashes, const rm_str *order,
                        size_t n_order) {
  rm_prefill_weights weights = rm_prefill_defaults(); /* cache weight 1, slack 2 */
  return rm_cheapest_prefill(servers, n, matches, n_matches, backlogs, n_backlogs, prompt_tokens,
                             prefix_hashes, order, n_order, weights);
}
