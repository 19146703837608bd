//! {{name}}: a Ringmaster safety filter. Prompts and reply windows that contain one of the
//! configured `patterns` (comma- or newline-separated, any case) are blocked: the prompt gets a
//! 400, the reply ends with `stop_reason: "refusal"` before the pattern reaches the client.
//! Edit `blocked_by`; `cargo test` runs its tests natively, and `ringmaster policy build`
//! makes the component.

use ringmaster_policy_sdk::config::{HostConfig, get_list};
use ringmaster_policy_sdk::decide::{first_match, lowercase_patterns};
use ringmaster_policy_sdk::safety::{Guest, Verdict};

/// The patterns blocked when the config names none.
pub const DEFAULT_PATTERNS: [&str; 2] = ["rm -rf /", "drop table"];

/// The patterns of a config value (lower-cased; the defaults when there are none).
pub fn patterns(configured: Vec<String>) -> Vec<String> {
    let chosen = if configured.is_empty() {
        DEFAULT_PATTERNS.iter().map(|p| (*p).to_owned()).collect()
    } else {
        configured
    };
    lowercase_patterns(&chosen)
}

/// The first of `patterns` (lower-cased) that `text` contains, ignoring case.
pub fn blocked_by<'a>(text: &str, patterns: &'a [String]) -> Option<&'a str> {
    first_match(text, patterns).map(|i| patterns[i].as_str())
}

fn verdict(text: &str, what: &str) -> Verdict {
    // The config is fixed for a policy version; one instance reads it once.
    thread_local! {
        static PATTERNS: Vec<String> = patterns(get_list(&HostConfig, "patterns"));
    }
    PATTERNS.with(|patterns| match blocked_by(text, patterns) {
        Some(pattern) => Verdict::Block(format!("the {what} contains \"{pattern}\"")),
        None => Verdict::Allow,
    })
}

/// The component's export.
#[derive(Debug)]
pub struct Policy;

impl Guest for Policy {
    fn check_input(text: String) -> Verdict {
        verdict(&text, "prompt")
    }

    fn check_output(window: String, _final: bool) -> Verdict {
        verdict(&window, "reply")
    }
}

ringmaster_policy_sdk::safety::export!(Policy);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_in_any_case_is_found_and_named() {
        let patterns = patterns(Vec::new());
        assert_eq!(
            blocked_by("please DROP TABLE users", &patterns),
            Some("drop table")
        );
        assert_eq!(blocked_by("x; rm -rf / now", &patterns), Some("rm -rf /"));
    }

    #[test]
    fn clean_text_passes() {
        assert_eq!(blocked_by("a table for two", &patterns(Vec::new())), None);
        let custom = patterns(vec!["Secret".to_owned()]);
        assert_eq!(blocked_by("the SECRET word", &custom), Some("secret"));
    }
}
