/* c-safety's decision: text containing a configured pattern, in any ASCII case, is blocked. */
#include "policy.h"

static uint8_t lower(uint8_t c) { return c >= 'A' && c <= 'Z' ? (uint8_t)(c + 32) : c; }

static bool is_space(uint8_t c) { return c == ' ' || c == '\t' || c == '\r'; }

/* Whether `needle` (not empty) occurs in `haystack`, ignoring ASCII case. */
static bool contains(rm_str haystack, rm_str needle) {
  if (needle.len > haystack.len) return false;
  for (size_t at = 0; at + needle.len <= haystack.len; at++) {
    size_t i = 0;
    while (i < needle.len && lower(haystack.ptr[at + i]) == lower(needle.ptr[i])) i++;
    if (i == needle.len) return true;
  }
  return false;
}

bool blocked_by(rm_str text, rm_str patterns, rm_str *which) {
  size_t start = 0;
  while (start <= patterns.len) {
    size_t end = start;
    while (end < patterns.len && patterns.ptr[end] != ',' && patterns.ptr[end] != '\n') end++;
    size_t lo = start, hi = end;
    while (lo < hi && is_space(patterns.ptr[lo])) lo++;
    while (hi > lo && is_space(patterns.ptr[hi - 1])) hi--;
    rm_str pattern = {patterns.ptr + lo, hi - lo};
    if (pattern.len > 0 && contains(text, pattern)) {
      *which = pattern;
      return true;
    }
    start = end + 1;
  }
  return false;
}
