/* c-safety's decision, apart from the generated bindings so that `make test` checks it
 * natively (any C compiler, no Wasm). */
#ifndef POLICY_H
#define POLICY_H

#include "ringmaster_policy.h"

/* The patterns blocked when the config names none. */
#define DEFAULT_PATTERNS "rm -rf /, drop table"

/* Whether `text` contains one of `patterns` (comma- or newline-separated; spaces around each
 * are ignored, and so is ASCII case); when it does, `*which` is the pattern. */
bool blocked_by(rm_str text, rm_str patterns, rm_str *which);

#endif
