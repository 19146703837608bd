/* c-admission's decision, tested natively: make test */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../policy.h"

static int failures = 0;

#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                        \
    }                                                                    \
  } while (0)

static void runs_with_the_tiers_priority(void) {
  admit_answer a = admit(rm_cstr("premium"), 100, 0, 0, 256, 4);
  CHECK(a.kind == ADMIT_ACCEPT && a.priority == 3);
  a = admit(rm_cstr("anonymous"), 100, 0, 0, 256, 4);
  CHECK(a.kind == ADMIT_ACCEPT && a.priority == 0);
}

static void queues_while_busy_and_refuses_when_full_or_too_long(void) {
  CHECK(admit(rm_cstr("standard"), 100, 256, 0, 256, 4).kind == ADMIT_QUEUE);
  CHECK(admit(rm_cstr("standard"), 100, 0, 256, 256, 4).kind == ADMIT_REJECT);
  admit_answer a = admit(rm_cstr("standard"), 200000, 0, 0, 256, 4);
  CHECK(a.kind == ADMIT_REJECT && strstr(a.reason, "200000 tokens") != NULL);
}

int main(void) {
  runs_with_the_tiers_priority();
  queues_while_busy_and_refuses_when_full_or_too_long();
  if (failures > 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return EXIT_FAILURE;
  }
  printf("c-admission: all tests passed\n");
  return EXIT_SUCCESS;
}
