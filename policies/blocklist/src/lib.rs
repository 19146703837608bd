//! A blocklist safety filter: refuses text that contains a configured substring.
//!
//! The `patterns` config value lists substrings separated by newlines or commas (each
//! trimmed; empty ones ignored). A prompt (`check-input`) or a window of streamed output
//! (`check-output`) that contains one of them, ignoring case, is blocked. The reason names
//! the rule by its index among the non-empty patterns (`blocklist rule 0` is the first), never by its
//! text, so the client and the logs do not learn the list. Each block is counted
//! (`blocked_input`, `blocked_output`). Without patterns everything passes.

use ringmaster_policy_sdk::config::{ConfigSource, HostConfig, get_list};
use ringmaster_policy_sdk::decide::{first_match, lowercase_patterns};
use ringmaster_policy_sdk::host;
use ringmaster_policy_sdk::safety::{Guest, Verdict};

/// The lower-cased patterns from `source`, in configuration order.
pub fn patterns(source: &(impl ConfigSource + ?Sized)) -> Vec<String> {
    lowercase_patterns(&get_list(source, "patterns"))
}

/// The verdict for `text` under `patterns` (lower-cased, from [`patterns`]).
pub fn check(text: &str, patterns: &[String]) -> Verdict {
    match first_match(text, patterns) {
        Some(index) => Verdict::Block(format!("blocked by blocklist rule {index}")),
        None => Verdict::Allow,
    }
}

fn check_and_count(text: &str, counter: &str) -> Verdict {
    let verdict = check(text, &patterns(&HostConfig));
    if let Verdict::Block(reason) = &verdict {
        host::count(counter);
        host::info(reason);
    }
    verdict
}

/// The component's export.
#[derive(Debug)]
pub struct Blocklist;

impl Guest for Blocklist {
    fn check_input(text: String) -> Verdict {
        check_and_count(&text, "blocked_input")
    }

    fn check_output(window: String, _final: bool) -> Verdict {
        check_and_count(&window, "blocked_output")
    }
}

ringmaster_policy_sdk::safety::export!(Blocklist);

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(raw: &str) -> Vec<String> {
        patterns(&[("patterns", raw)][..])
    }

    #[test]
    fn blocks_the_first_matching_rule_by_index() {
        let p = rules("alpha, Bravo\n charlie ");
        assert_eq!(
            check("say BRAVO now", &p),
            Verdict::Block("blocked by blocklist rule 1".into())
        );
        assert_eq!(
            check("Charlie and alpha", &p),
            Verdict::Block("blocked by blocklist rule 0".into())
        );
        assert_eq!(check("delta", &p), Verdict::Allow);
    }

    #[test]
    fn the_reason_never_contains_the_pattern() {
        let p = rules("top-secret");
        let Verdict::Block(reason) = check("this is TOP-SECRET", &p) else {
            panic!("expected a block");
        };
        assert!(!reason.to_lowercase().contains("top-secret"));
    }

    #[test]
    fn empty_or_missing_patterns_allow_everything() {
        assert_eq!(check("anything", &rules(" , \n ")), Verdict::Allow);
        let none: [(&str, &str); 0] = [];
        assert!(patterns(&none[..]).is_empty());
        assert_eq!(check("anything", &[]), Verdict::Allow);
    }

    #[test]
    fn indices_count_only_non_empty_patterns() {
        // Empty items are dropped while splitting, so indices count the non-empty patterns.
        let p = rules("a1,,b2");
        assert_eq!(
            check("xb2", &p),
            Verdict::Block("blocked by blocklist rule 1".into())
        );
    }
}
