/* The C SDK's helpers, natively: cc -std=c11 -I.. tests/test_sdk.c -lm && ./a.out
 * (tests/run runs it). The same cases as the Python and JavaScript SDKs' tests. */

#include "../ringmaster_policy.h"

static bool is(const rm_server *s, const char *id) {
  return s != NULL && rm_str_eq(s->id, rm_cstr(id));
}

static void strings_compare_by_bytes(void) {
  RM_CHECK(rm_str_eq(rm_cstr("gpu-1"), rm_cstr("gpu-1")));
  RM_CHECK(!rm_str_eq(rm_cstr("gpu-1"), rm_cstr("gpu-10")));
  RM_CHECK(rm_str_cmp(rm_cstr("gpu-1"), rm_cstr("gpu-10")) < 0);
  RM_CHECK(rm_str_cmp(rm_cstr("b"), rm_cstr("a")) > 0);
  RM_CHECK(rm_str_cmp(rm_cstr(""), rm_cstr("")) == 0);
}

static void lookups_default_to_none(void) {
  rm_match matches[] = {{rm_cstr("a"), 3}};
  rm_backlog backlogs[] = {{rm_cstr("b"), 700}};
  rm_str order[] = {rm_cstr("b"), rm_cstr("a")};
  RM_CHECK(rm_matched(matches, 1, rm_cstr("a")) == 3);
  RM_CHECK(rm_matched(matches, 1, rm_cstr("b")) == 0);
  RM_CHECK(rm_backlog_of(backlogs, 1, rm_cstr("b")) == 700);
  RM_CHECK(rm_backlog_of(backlogs, 1, rm_cstr("a")) == 0);
  RM_CHECK(rm_ring_rank(order, 2, rm_cstr("a")) == 1);
  RM_CHECK(rm_ring_rank(order, 2, rm_cstr("z")) == RM_NO_RANK);
}

static void cache_arithmetic(void) {
  RM_CHECK(rm_coverage(0, 0) == 0.0);
  RM_CHECK(rm_coverage(5, 10) == 0.5);
  RM_CHECK(rm_coverage(12, 10) == 1.0);
  RM_CHECK(rm_uncached_tokens(1000, 5, 10) == 500);
  RM_CHECK(rm_uncached_tokens(1000, 0, 0) == 1000);
  RM_CHECK(rm_uncached_tokens(3, 1, 2) == 2); /* 1.5 rounds away from zero, as in Rust */
  rm_server s = rm_test_server("a");
  /* ceil(1.25 x (3 + 1) x 1 / 2) + 0 = 3 */
  RM_CHECK(rm_bounded_cap(&s, 3, 2, 1.25, 0) == 3);
  RM_CHECK(rm_bounded_cap(&s, 3, 0, 1.25, 2) == 7);
}

static void least_in_flight_breaks_ties_by_ring_then_id(void) {
  rm_server servers[] = {rm_test_server("b"), rm_test_server("a"), rm_test_server("c")};
  servers[2].in_flight = 5;
  RM_CHECK(is(rm_least_in_flight(servers, 3, NULL, 0), "a"));
  rm_str order[] = {rm_cstr("b")};
  RM_CHECK(is(rm_least_in_flight(servers, 3, order, 1), "b"));
  servers[0].healthy = servers[1].healthy = servers[2].healthy = false;
  RM_CHECK(rm_least_in_flight(servers, 3, NULL, 0) == NULL);
}

static void cheapest_prefill_weighs_cache_against_backlog(void) {
  rm_server servers[] = {rm_test_server("a"), rm_test_server("b")};
  rm_match matches[] = {{rm_cstr("a"), 10}};
  rm_prefill_weights w = rm_prefill_defaults();
  RM_CHECK(is(rm_cheapest_prefill(servers, 2, matches, 1, NULL, 0, 1000, 10, NULL, 0, w), "a"));
  rm_backlog backlogs[] = {{rm_cstr("a"), 1500}};
  RM_CHECK(is(rm_cheapest_prefill(servers, 2, matches, 1, backlogs, 1, 1000, 10, NULL, 0, w), "b"));
  /* Nobody has room (slack 0, both over the cap): the least loaded. */
  servers[0].in_flight = 40;
  servers[1].in_flight = 30;
  w.slack = 0;
  w.load_factor = 0.5;
  RM_CHECK(is(rm_cheapest_prefill(servers, 2, matches, 1, NULL, 0, 1000, 10, NULL, 0, w), "b"));
}

static void pair_helpers_follow_the_peers_rules(void) {
  rm_server servers[] = {rm_test_server("d1"), rm_test_server("w"), rm_test_server("d2")};
  servers[0].role = RM_ROLE_DECODE;
  servers[0].in_flight = 3;
  servers[2].role = RM_ROLE_DECODE;
  servers[2].healthy = false;
  size_t at = 0;
  RM_CHECK(is(rm_next_decode_server(servers, 3, &at), "d1"));
  RM_CHECK(rm_next_decode_server(servers, 3, &at) == NULL);
  rm_server prefill[] = {rm_test_server("p1"), rm_test_server("p2")};
  prefill[0].role = prefill[1].role = RM_ROLE_PREFILL;
  rm_match matches[] = {{rm_cstr("p2"), 5}};
  rm_backlog backlogs[] = {{rm_cstr("p1"), 100}};
  /* p2 holds half the prompt: 500 tokens to do against p1's 100 + 1000. */
  uint64_t work = 0, uncached = 0;
  RM_CHECK(is(rm_least_prefill_work(prefill, 2, matches, 1, backlogs, 1, 1000, 10, &work, &uncached),
              "p2"));
  RM_CHECK(work == 500 && uncached == 500);
  RM_CHECK(rm_least_prefill_work(prefill, 0, NULL, 0, NULL, 0, 1000, 10, NULL, NULL) == NULL);
  RM_CHECK(rm_worth_splitting(1000, 0, 500, 256, false));
  RM_CHECK(!rm_worth_splitting(100, 0, 50, 256, false));  /* under the threshold */
  RM_CHECK(!rm_worth_splitting(1000, 0, 2000, 256, false)); /* prefill busier */
  RM_CHECK(rm_worth_splitting(1000, 0, 2000, 256, true));   /* waits for it */
  RM_CHECK(rm_llm_d_splits(16, 10, 16, 0));
  RM_CHECK(!rm_llm_d_splits(15, 10, 16, 0));
  RM_CHECK(!rm_llm_d_splits(100, 10, 0, 20));
  /* Dynamo: 1,000 of 10,000 tokens to compute is local; 3,000 of 4,000 is split. */
  RM_CHECK(rm_dynamo_prefills_locally(1000, 10000, 2048, 0.7));
  RM_CHECK(!rm_dynamo_prefills_locally(3000, 4000, 2048, 0.7));
  RM_CHECK(!rm_dynamo_prefills_locally(1500, 2000, 2048, 0.7)); /* over 0.7 of the raw */
}

static void power_of_two_draws_as_the_rust_sdk_does(void) {
  rm_server servers[] = {rm_test_server("a"), rm_test_server("b"), rm_test_server("c")};
  servers[0].in_flight = 5;
  servers[1].in_flight = 1;
  servers[2].in_flight = 3;
  /* seed 7 on 3 servers: first 7 % 3 = 1 (b), second (7 / 3 + 1 + 1) % 3 = 1 (b). */
  RM_CHECK(is(rm_power_of_two(servers, 3, 7), "b"));
  /* seed 3: first a, second (1 + 1 + 0) % 3 = 2 (c), which has fewer in flight. */
  RM_CHECK(is(rm_power_of_two(servers, 3, 3), "c"));
  RM_CHECK(rm_power_of_two(servers, 3, UINT64_MAX) != NULL); /* wraps, as Rust's wrapping_add */
  RM_CHECK(rm_power_of_two(servers, 0, 1) == NULL);
}

int main(void) {
  strings_compare_by_bytes();
  lookups_default_to_none();
  cache_arithmetic();
  least_in_flight_breaks_ties_by_ring_then_id();
  cheapest_prefill_weighs_cache_against_backlog();
  pair_helpers_follow_the_peers_rules();
  power_of_two_draws_as_the_rust_sdk_does();
  return rm_test_finish("ringmaster_policy.h");
}
