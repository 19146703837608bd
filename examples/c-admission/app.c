/* c-admission: a Ringmaster admission policy in C (Zig's C compiler, wit-bindgen's C bindings).
 * The decision itself lives in policy.c, which includes nothing generated, so `make test` tests
 * it without Wasm; this file only translates it to the WIT verdict. The request belongs to the
 * call and is freed before it returns; a rejection's reason is allocated here and freed by the
 * bindings once the host has read it. */
#include "admission.h"
#include "policy.h"

void exports_admission_admit(admission_request_t *req, admission_load_t *current,
                             admission_verdict_t *ret) {
  rm_str tier = {req->tier.ptr, req->tier.len};
  admit_answer answer = admit(tier, req->prompt_tokens, current->in_flight, current->queued,
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
  admission_request_free(req);
}
