/* c-admission's decision, tested natively: make test */
#include <string.h>

#include "../policy.h"

static void runs_with_the_tiers_priority(void) {
  admit_answer a = admit(rm_cstr("premium"), 100, 0, 0, 256, 4);
  RM_CHECK(a.kind == ADMIT_ACCEPT && a.priority == 3);
  a = admit(rm_cstr("anonymous"), 100, 0, 0, 256, 4);
  RM_CHECK(a.kind == ADMIT_ACCEPT && a.priority == 0);
}

static void queues_while_busy_and_refuses_when_full_or_too_long(void) {
  RM_CHECK(admit(rm_cstr("standard"), 100, 256, 0, 256, 4).kind == ADMIT_QUEUE);
  RM_CHECK(admit(rm_cstr("standard"), 100, 0, 256, 256, 4).kind == ADMIT_REJECT);
  admit_answer a = admit(rm_cstr("standard"), 200000, 0, 0, 256, 4);
  RM_CHECK(a.kind == ADMIT_REJECT && strstr(a.reason, "200000 tokens") != NULL);
}

int main(void) {
  runs_with_the_tiers_priority();
  queues_while_busy_and_refuses_when_full_or_too_long();
  return rm_test_finish("c-admission");
}
