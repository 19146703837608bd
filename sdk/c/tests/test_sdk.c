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

int main(void) {
  strings_compare_by_bytes();
  lookups_default_to_none();
  cache_arithmetic();
  least_in_flight_breaks_ties_by_ring_then_id();
  cheapest_prefill_weighs_cache_against_backlog();
  return rm_test_finish("ringmaster_policy.h");
}
