/* c-admission's decision, apart from the generated bindings so that `make test` checks it
 * natively (any C compiler, no Wasm). */
#ifndef POLICY_H
#define POLICY_H

#include "ringmaster_policy.h"

#define MAX_PROMPT_TOKENS 100000u
#define MAX_IN_FLIGHT_PER_SERVER 64u

/* What to do with a request. */
typedef enum { ADMIT_ACCEPT, ADMIT_QUEUE, ADMIT_REJECT } admit_kind;

typedef struct admit_answer {
  admit_kind kind;
  /* ADMIT_ACCEPT: the priority (0 = lowest). */
  uint8_t priority;
  /* ADMIT_REJECT: why, for the client (NUL-terminated). */
  char reason[128];
} admit_answer;

/* Refuse prompts over MAX_PROMPT_TOKENS and requests when the queue is full, queue while every
 * server carries MAX_IN_FLIGHT_PER_SERVER, else run with the tier's priority (premium 3,
 * standard 1, others 0). */
admit_answer admit(rm_str tier, uint32_t prompt_tokens, uint32_t in_flight, uint32_t queued,
                   uint32_t queue_capacity, uint32_t servers);

#endif
