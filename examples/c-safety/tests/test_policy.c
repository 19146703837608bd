/* c-safety's decision, tested natively: make test */

#include "../policy.h"

static void a_pattern_in_any_case_is_found_and_named(void) {
  rm_str which = {NULL, 0};
  RM_CHECK(blocked_by(rm_cstr("please DROP TABLE users"), rm_cstr(DEFAULT_PATTERNS), &which));
  RM_CHECK(rm_str_eq(which, rm_cstr("drop table")));
  RM_CHECK(blocked_by(rm_cstr("x; rm -rf / now"), rm_cstr(DEFAULT_PATTERNS), &which));
  RM_CHECK(rm_str_eq(which, rm_cstr("rm -rf /")));
}

static void clean_text_and_empty_patterns_pass(void) {
  rm_str which = {NULL, 0};
  RM_CHECK(!blocked_by(rm_cstr("a table for two"), rm_cstr(DEFAULT_PATTERNS), &which));
  RM_CHECK(!blocked_by(rm_cstr("anything"), rm_cstr(" , ,\n"), &which));
  RM_CHECK(!blocked_by(rm_cstr(""), rm_cstr("secret"), &which));
  RM_CHECK(blocked_by(rm_cstr("the SECRET word"), rm_cstr("nope\n secret "), &which));
}

int main(void) {
  a_pattern_in_any_case_is_found_and_named();
  clean_text_and_empty_patterns_pass();
  return rm_test_finish("c-safety");
}
