/* c-admission: a Ringmaster admission policy in C (Zig's C compiler, wit-bindgen's C bindings).
 * The decision itself lives in policy.c, which includes nothing generated, so `make test` tests
 * it without Wasm; this file only translates it to the WIT verdict. The request is a borrowed
 * handle, read through its getters and dropped before the call returns (the tier's string
 * with it); a rejection's reason is allocated here and freed by the bindings once the host has
 * read it. */
#include "admission.h"
#include "policy.h"

void exports_admission_admit(admission_borrow_request_t req, admission_load_t *current,
                             admission_verdict_t *ret) {
  admission_string_t tier_text;
  ringmaster_policy_types_method_request_tier(req, &tier_text);
  uint32_t prompt_tokens = ringmaster_policy_types_method_request_prompt_tokens(req);
  ringmaster_policy_types_request_drop_borrow(req);
  rm_str tier = {tier_text.ptr, tier_text.len};
  admit_answer answer = admit(tier, prompt_tokens, current->in_flight, current->queued,
                              current->queue_capacity, current->servers);
  switch (answer.kind) {
    case ADMIT_ACCEPT:
      ret->tag = ADMISSION_VERDICT_ACCEPT;
      ret->val.accept = answer.priority;
      break;
    case ADMIT_QUEUE:
      ret->tag = ADMISSION_VERDICT_QUEUE;
      break;
    case ADMIT_REJECT:
      ret->tag = ADMISSION_VERDICT_REJECT;
      admission_string_dup(&ret->val.reject.reason, answer.reason);
      ret->val.reject.retry_after_ms = 1000;
      break;
  }
  admission_string_free(&tier_text);
}
