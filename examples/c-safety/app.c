/* c-safety: a Ringmaster safety filter in C (Zig's C compiler, wit-bindgen's C bindings). The
 * decision itself lives in policy.c, which includes nothing generated, so `make test` tests it
 * without Wasm; this file reads the configuration and answers.
 *
 * Config: `patterns`, comma- or newline-separated (default: DEFAULT_PATTERNS). It is read once
 * per instance and kept in the instance's memory; a gateway's warm instances each read it once.
 * The text the host passes belongs to the call and is freed before it returns; a block's
 * reason is allocated here and freed by the bindings once the host has read it. */
#include <stdio.h>
#include <stdlib.h>

#include "policy.h"
#include "safety_filter.h"

static rm_str patterns(void) {
  static bool read = false;
  static safety_filter_string_t configured;
  static rm_str chosen;
  if (!read) {
    safety_filter_string_t key;
    safety_filter_string_set(&key, "patterns");
    if (ringmaster_policy_config_get(&key, &configured)) {
      chosen.ptr = configured.ptr;
      chosen.len = configured.len;
    } else {
      chosen = rm_cstr(DEFAULT_PATTERNS);
    }
    read = true;
  }
  return chosen;
}

static void verdict(rm_str text, const char *what, safety_filter_verdict_t *ret) {
  rm_str which;
  if (!blocked_by(text, patterns(), &which)) {
    ret->tag = SAFETY_FILTER_VERDICT_ALLOW;
    return;
  }
  char reason[160];
  int n = snprintf(reason, sizeof reason, "the %s contains \"%.*s\"", what,
                   (int)(which.len > 100 ? 100 : which.len), (const char *)which.ptr);
  ret->tag = SAFETY_FILTER_VERDICT_BLOCK;
  safety_filter_string_dup_n(&ret->val.block, reason,
                             n < 0 ? 0 : (size_t)n < sizeof reason ? (size_t)n : sizeof reason - 1);
}

void exports_safety_filter_check_input(safety_filter_string_t *text, safety_filter_verdict_t *ret) {
  rm_str view = {text->ptr, text->len};
  verdict(view, "prompt", ret);
  safety_filter_string_free(text);
}

void exports_safety_filter_check_output(safety_filter_string_t *window, bool final,
                                        safety_filter_verdict_t *ret) {
  (void)final;
  rm_str view = {window->ptr, window->len};
  verdict(view, "reply", ret);
  safety_filter_string_free(window);
}
