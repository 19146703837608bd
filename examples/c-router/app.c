/* c-router: a Ringmaster router in C (Zig's C compiler, wit-bindgen's C bindings). The decision
 * itself lives in policy.c, which includes nothing generated, so `make test` tests it without
 * Wasm; this file only asks the host, hands the answers to it as the SDK's structs (pointing
 * at the same bytes) and answers.
 *
 * Memory and handles, as the component model's C bindings have it: the request is a borrowed
 * handle, read through its getters and dropped before the call returns; every list the host
 * returns belongs to this call and is freed before it returns; the decision's string is
 * allocated here and freed by the bindings once the host has read it. */
#include <stdlib.h>

#include "policy.h"
#include "router.h"

static rm_str as_str(const router_string_t *s) {
  rm_str out = {s->ptr, s->len};
  return out;
}

static void answer(router_decision_t *ret, uint8_t tag, rm_str text) {
  ret->tag = tag;
  router_string_dup_n(tag == ROUTER_DECISION_ROUTE ? &ret->val.route : &ret->val.reject,
                      (const char *)text.ptr, text.len);
}

void exports_router_route(router_borrow_request_t req, router_decision_t *ret) {
  uint32_t prefix_hashes = ringmaster_policy_types_method_request_prefix_hash_count(req);
  uint32_t prompt_tokens = ringmaster_policy_types_method_request_prompt_tokens(req);
  uint64_t routing_key = ringmaster_policy_types_method_request_routing_key(req);
  ringmaster_policy_types_request_drop_borrow(req);

  ringmaster_policy_cluster_list_server_t listed;
  ringmaster_policy_cluster_servers(&listed);
  router_list_tuple2_string_u32_t matched = {NULL, 0};
  if (prefix_hashes > 0) ringmaster_policy_cluster_prefix_matches(&matched);
  router_list_tuple2_string_u64_t queued;
  ringmaster_policy_cluster_prefill_backlog(&queued);
  router_list_string_t ring;
  ringmaster_policy_ring_candidates(routing_key, (uint32_t)listed.len, &ring);

  /* One allocation for the SDK's views of all four lists (calloc(0) may give NULL). */
  size_t bytes = listed.len * sizeof(rm_server) + matched.len * sizeof(rm_match) +
                 queued.len * sizeof(rm_backlog) + ring.len * sizeof(rm_str);
  void *views = bytes > 0 ? malloc(bytes) : NULL;
  if (bytes > 0 && views == NULL) {
    answer(ret, ROUTER_DECISION_REJECT, rm_cstr("c-router: out of memory"));
  } else {
    rm_server *servers = views;
    rm_match *matches = (rm_match *)(servers + listed.len);
    rm_backlog *backlogs = (rm_backlog *)(matches + matched.len);
    rm_str *order = (rm_str *)(backlogs + queued.len);
    for (size_t i = 0; i < listed.len; i++) {
      const ringmaster_policy_cluster_server_t *s = &listed.ptr[i];
      rm_server view = {as_str(&s->id), s->healthy, s->weight, s->in_flight, s->waiting,
                        s->kv_blocks_used, s->kv_blocks_total, (rm_role)s->role};
      servers[i] = view;
    }
    for (size_t i = 0; i < matched.len; i++) {
      matches[i].id = as_str(&matched.ptr[i].f0);
      matches[i].hashes = matched.ptr[i].f1;
    }
    for (size_t i = 0; i < queued.len; i++) {
      backlogs[i].id = as_str(&queued.ptr[i].f0);
      backlogs[i].tokens = queued.ptr[i].f1;
    }
    for (size_t i = 0; i < ring.len; i++) order[i] = as_str(&ring.ptr[i]);

    const rm_server *server =
        choose(servers, listed.len, matches, matched.len, backlogs, queued.len, prompt_tokens,
               prefix_hashes, order, ring.len);
    if (server == NULL) {
      answer(ret, ROUTER_DECISION_REJECT, rm_cstr("no healthy GPU server"));
    } else {
      answer(ret, ROUTER_DECISION_ROUTE, server->id);
    }
    free(views);
  }
  router_list_string_free(&ring);
  router_list_tuple2_string_u64_free(&queued);
  if (matched.ptr != NULL) router_list_tuple2_string_u32_free(&matched);
  ringmaster_policy_cluster_list_server_free(&listed);
}
