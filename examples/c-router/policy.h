/* c-router's decision, apart from the generated bindings so that `make test` checks it
 * natively (any C compiler, no Wasm). */
#ifndef POLICY_H
#define POLICY_H

#include "ringmaster_policy.h"

/* The server for a request: the healthy server where its prefill would start soonest (the
 * prompt tokens queued there plus the part of this prompt its cache does not hold), or NULL
 * when no server is healthy. */
const rm_server *choose(const rm_server *servers, size_t n, const rm_match *matches,
                        size_t n_matches, const rm_backlog *backlogs, size_t n_backlogs,
                        uint32_t prompt_tokens, size_t prefix_hashes, const rm_str *order,
                        size_t n_order);

#endif
