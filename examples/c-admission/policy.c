/* c-admission's decision: refuse prompts over a size limit and requests when the queue is
 * full, queue while every server is busy, else run with the tier's priority. */
#include <stdio.h>

#include "policy.h"

admit_answer admit(rm_str tier, uint32_t prompt_tokens, uint32_t in_flight, uint32_t queued,
                   uint32_t queue_capacity, uint32_t servers) {
  admit_answer answer = {ADMIT_ACCEPT, 0, ""};
  if (prompt_tokens > MAX_PROMPT_TOKENS) {
    answer.kind = ADMIT_REJECT;
    snprintf(answer.reason, sizeof answer.reason,
             "a prompt of %u tokens is over the %u this gateway admits", (unsigned)prompt_tokens,
             MAX_PROMPT_TOKENS);
  } else if (queued >= queue_capacity) {
    answer.kind = ADMIT_REJECT;
    snprintf(answer.reason, sizeof answer.reason, "the gateway's queue is full");
  } else if ((uint64_t)in_flight >= (uint64_t)servers * MAX_IN_FLIGHT_PER_SERVER) {
    answer.kind = ADMIT_QUEUE;
  } else if (rm_str_eq(tier, rm_cstr("premium"))) {
    answer.priority = 3;
  } else if (rm_str_eq(tier, rm_cstr("standard"))) {
    answer.priority = 1;
  }
  return answer;
}
