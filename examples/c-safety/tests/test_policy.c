/* c-safety's decision, tested natively: make test */
#include <stdio.h>
#include <stdlib.h>

#include "../policy.h"

static int failures = 0;

#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                        \
    }                                                                    \
  } while (0)

static void a_pattern_in_any_case_is_found_and_named(void) {
  rm_str which = {NULL, 0};
  CHECK(blocked_by(rm_cstr("please DROP TABLE users"), rm_cstr(DEFAULT_PATTERNS), &which));
  CHECK(rm_str_eq(which, rm_cstr("drop table")));
  CHECK(blocked_by(rm_cstr("x; rm -rf / now"), rm_cstr(DEFAULT_PATTERNS), &which));
  CHECK(rm_str_eq(which, rm_cstr("rm -rf /")));
}

static void clean_text_and_empty_patterns_pass(void) {
  rm_str which = {NULL, 0};
  CHECK(!blocked_by(rm_cstr("a table for two"), rm_cstr(DEFAULT_PATTERNS), &which));
  CHECK(!blocked_by(rm_cstr("anything"), rm_cstr(" , ,\n"), &which));
  CHECK(!blocked_by(rm_cstr(""), rm_cstr("secret"), &which));
  CHECK(blocked_by(rm_cstr("the SECRET word"), rm_cstr("nope\n secret "), &which));
}

int main(void) {
  a_pattern_in_any_case_is_found_and_named();
  clean_text_and_empty_patterns_pass();
  if (failures > 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return EXIT_FAILURE;
  }
  printf("c-safety: all tests passed\n");
  return EXIT_SUCCESS;
}
