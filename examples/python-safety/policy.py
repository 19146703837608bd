"""python-safety's decision: text containing a configured pattern, in any case, is blocked."""

DEFAULT_PATTERNS = "rm -rf /, drop table"


def patterns_of(configured):
    """The patterns of a config value (comma- or newline-separated, spaces around each
    ignored), lower-cased; the defaults when there is none."""
    text = DEFAULT_PATTERNS if configured is None else configured
    return [p.strip().lower() for p in text.replace("\n", ",").split(",") if p.strip()]


def blocked_by(text, patterns):
    """The first of `patterns` (lower-case) that `text` contains, ignoring case; None if none."""
    lowered = text.lower()
    for pattern in patterns:
        if pattern in lowered:
            return pattern
    return None
