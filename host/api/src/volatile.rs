//! [`VolatileLines`]: the system-prompt lines that change from request to request without
//! changing what is asked (`[routing] volatile_prefix`), such as Claude Code's billing line
//! `x-anthropic-billing-header: cc_version=…; cc_entrypoint=…; cch=…;`. Left in, such a line
//! gives two turns of one conversation different prefix hashes and different routing keys,
//! and makes every engine's prefix cache miss from its first block on. The doors take these
//! lines out of the request they make (so routing, explain and servers never see them) and
//! keep them aside for a server that wants them back (Anthropic's own API checks the line).

use regex::RegexSet;

/// Claude Code's per-request billing line (anthropics/claude-code#24168, #50085).
pub const CLAUDE_CODE_BILLING_LINE: &str = r"^x-anthropic-billing-header:";

/// Patterns of system-prompt lines to take out, compiled once.
#[derive(Clone, Debug, Default)]
pub struct VolatileLines {
    set: Option<RegexSet>,
}

impl VolatileLines {
    /// No volatile lines: every system prompt is kept as it came.
    pub const NONE: VolatileLines = VolatileLines { set: None };

    /// Lines matching any of `patterns` (regular expressions, matched against one line
    /// without its line break).
    pub fn new<I, S>(patterns: I) -> Result<Self, regex::Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let set = RegexSet::new(patterns)?;
        Ok(Self {
            set: (!set.is_empty()).then_some(set),
        })
    }

    /// Whether there is any pattern.
    pub fn is_empty(&self) -> bool {
        self.set.is_none()
    }

    /// Whether `line` is volatile.
    pub fn matches(&self, line: &str) -> bool {
        self.set.as_ref().is_some_and(|set| set.is_match(line))
    }

    /// Takes the volatile lines out of `text`: what remains, and the lines taken (each with
    /// its line break), `None` when there were none.
    pub fn take_out(&self, text: String) -> (String, Option<String>) {
        let Some(set) = &self.set else {
            return (text, None);
        };
        if !text
            .split_inclusive('\n')
            .any(|line| set.is_match(line.trim_end_matches(['\r', '\n'])))
        {
            return (text, None);
        }
        let mut kept = String::with_capacity(text.len());
        let mut taken = String::new();
        for line in text.split_inclusive('\n') {
            if set.is_match(line.trim_end_matches(['\r', '\n'])) {
                taken.push_str(line);
            } else {
                kept.push_str(line);
            }
        }
        (kept, Some(taken))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_billing_line_is_taken_out_and_the_rest_kept() {
        let lines = VolatileLines::new([CLAUDE_CODE_BILLING_LINE]).unwrap();
        let (kept, taken) = lines.take_out(
            "x-anthropic-billing-header: cc_version=2.1.328.593; cc_entrypoint=cli; cch=3f2a1;\nYou are Claude Code.\nBe brief."
                .to_owned(),
        );
        assert_eq!(kept, "You are Claude Code.\nBe brief.");
        assert_eq!(
            taken.as_deref(),
            Some(
                "x-anthropic-billing-header: cc_version=2.1.328.593; cc_entrypoint=cli; cch=3f2a1;\n"
            )
        );
        // Only whole lines that begin with it.
        let (kept, taken) = lines.take_out("say x-anthropic-billing-header: no".to_owned());
        assert_eq!(kept, "say x-anthropic-billing-header: no");
        assert!(taken.is_none());
        let (kept, taken) =
            VolatileLines::NONE.take_out("x-anthropic-billing-header: a".to_owned());
        assert_eq!(kept, "x-anthropic-billing-header: a");
        assert!(taken.is_none());
    }

    #[test]
    fn a_bad_pattern_is_an_error() {
        assert!(VolatileLines::new(["("]).is_err());
        assert!(VolatileLines::new(Vec::<String>::new()).unwrap().is_empty());
    }
}
