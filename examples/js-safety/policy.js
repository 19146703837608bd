// js-safety's decision: text containing a configured pattern, in any case, is blocked.

export const DEFAULT_PATTERNS = "rm -rf /, drop table";

/** The patterns of a config value (comma- or newline-separated, spaces around each ignored),
 * lower-cased; the defaults when there is none. */
export function patternsOf(configured) {
  const text = configured ?? DEFAULT_PATTERNS;
  return text.split(/[,\n]/).map((p) => p.trim().toLowerCase()).filter((p) => p.length > 0);
}

/** The first of `patterns` (lower-case) that `text` contains, ignoring case; null if none. */
export function blockedBy(text, patterns) {
  const lowered = text.toLowerCase();
  return patterns.find((p) => lowered.includes(p)) ?? null;
}
