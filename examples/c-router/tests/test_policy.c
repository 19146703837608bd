/* c-router's decision, tested natively: make test */

#include "../policy.h"

static void the_server_holding_the_prompt_wins_until_its_queue_is_long(void) {
  rm_server servers[] = {rm_test_server("a"), rm_test_server("b")};
  rm_match matches[] = {{rm_cstr("a"), 8}};
  rm_str order[] = {rm_cstr("b"), rm_cstr("a")};
  const rm_server *pick = choose(servers, 2, matches, 1, NULL, 0, 1000, 10, order, 2);
  RM_CHECK(pick != NULL && rm_str_eq(pick->id, rm_cstr("a")));
  rm_backlog backlogs[] = {{rm_cstr("a"), 5000}};
  pick = choose(servers, 2, matches, 1, backlogs, 1, 1000, 10, order, 2);
  RM_CHECK(pick != NULL && rm_str_eq(pick->id, rm_cstr("b")));
}

static void unhealthy_servers_are_never_chosen(void) {
  rm_server servers[] = {rm_test_server("a")};
  servers[0].healthy = false;
  RM_CHECK(choose(servers, 1, NULL, 0, NULL, 0, 10, 0, NULL, 0) == NULL);
}

static void a_full_server_gives_way_and_ties_follow_the_ring(void) {
  rm_server servers[] = {rm_test_server("a"), rm_test_server("b")};
  servers[0].in_flight = 10; /* over its bounded-load cap of ceil(1.25 * 11 / 2) + 2 = 9 */
  rm_match matches[] = {{rm_cstr("a"), 10}};
  const rm_server *pick = choose(servers, 2, matches, 1, NULL, 0, 1000, 10, NULL, 0);
  RM_CHECK(pick != NULL && rm_str_eq(pick->id, rm_cstr("b")));
  rm_server idle[] = {rm_test_server("a"), rm_test_server("b")};
  rm_str order[] = {rm_cstr("b"), rm_cstr("a")};
  pick = choose(idle, 2, NULL, 0, NULL, 0, 100, 0, order, 2);
  RM_CHECK(pick != NULL && rm_str_eq(pick->id, rm_cstr("b")));
}

int main(void) {
  the_server_holding_the_prompt_wins_until_its_queue_is_long();
  unhealthy_servers_are_never_chosen();
  a_full_server_gives_way_and_ties_follow_the_ring();
  return rm_test_finish("c-router");
}
