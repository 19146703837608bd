//! Turning one request's generated tokens into the text it streams.
//!
//! This module owns two per-request concerns: assembling token bytes into UTF-8 text (a token
//! of a byte-level vocabulary can hold part of a character), and stop sequences (text that
//! might be the start of a stop sequence is held back until it is known not to be, and a
//! matched stop sequence is never emitted). It must not know about tokens' ids, blocks or
//! steps: the engine feeds it bytes and forwards what it returns.

/// What one pushed token released.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Released {
    /// Text safe to stream now (possibly empty).
    pub text: String,
    /// The stop sequence the output now contains, if any: generation must end.
    pub stop: Option<String>,
}

/// One request's output text state.
#[derive(Debug)]
pub(crate) struct OutputText {
    /// Bytes of an incomplete UTF-8 character.
    partial: Vec<u8>,
    /// Text held back because it could be the start of a stop sequence.
    held: String,
    stops: Vec<String>,
}

impl OutputText {
    /// A fresh state for these stop sequences (empty ones are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            partial: Vec::new(),
            held: String::new(),
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
        }
    }

    /// Adds one token's bytes.
    pub fn push(&mut self, bytes: &[u8]) -> Released {
        self.partial.extend_from_slice(bytes);
        let text = take_utf8(&mut self.partial);
        self.held.push_str(&text);

        let earliest = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, s)| (at, std::cmp::Reverse(s.len())));
        if let Some((at, stop)) = earliest {
            let stop = stop.clone();
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            return Released {
                text,
                stop: Some(stop),
            };
        }

        let keep = self.partial_match_len();
        let split = self.held.len() - keep;
        let rest = self.held.split_off(split);
        Released {
            text: std::mem::replace(&mut self.held, rest),
            stop: None,
        }
    }

    /// Everything held back, at the end of generation (an incomplete character becomes
    /// U+FFFD).
    pub fn flush(&mut self) -> String {
        let mut text = std::mem::take(&mut self.held);
        if !self.partial.is_empty() {
            text.push_str(&String::from_utf8_lossy(&self.partial));
            self.partial.clear();
        }
        text
    }

    /// Length in bytes of the longest suffix of the held text that is a proper prefix of a
    /// stop sequence.
    fn partial_match_len(&self) -> usize {
        let longest = self.stops.iter().map(|s| s.len() - 1).max().unwrap_or(0);
        let max = longest.min(self.held.len());
        (1..=max)
            .rev()
            .find(|&k| {
                let start = self.held.len() - k;
                self.held.is_char_boundary(start)
                    && self
                        .stops
                        .iter()
                        .any(|s| s.starts_with(&self.held[start..]))
            })
            .unwrap_or(0)
    }
}

/// Takes the complete UTF-8 characters from the front of `bytes`, leaving an incomplete
/// trailing character; invalid bytes become U+FFFD.
fn take_utf8(bytes: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut rest: &[u8] = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                rest = &[];
                break;
            }
            Err(e) => {
                let (valid, after) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(valid).expect("checked by valid_up_to"));
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        rest = &after[n..];
                    }
                    None => {
                        rest = after;
                        break;
                    }
                }
            }
        }
    }
    let keep = rest.to_vec();
    *bytes = keep;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(stops: &[&str], tokens: &[&str]) -> (String, Option<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut o = OutputText::new(&stops);
        let mut text = String::new();
        for t in tokens {
            let r = o.push(t.as_bytes());
            text.push_str(&r.text);
            if r.stop.is_some() {
                return (text, r.stop);
            }
        }
        text.push_str(&o.flush());
        (text, None)
    }

    #[test]
    fn without_stops_text_passes_through() {
        assert_eq!(stream(&[], &[" a", " b"]), (" a b".into(), None));
    }

    #[test]
    fn stop_sequences_end_output_and_are_not_emitted() {
        assert_eq!(
            stream(&["STOP"], &[" a", " ST", "OP", " c"]),
            (" a ".into(), Some("STOP".into()))
        );
        assert_eq!(
            stream(&[" b"], &[" a", " b"]),
            (" a".into(), Some(" b".into()))
        );
        // Within one token.
        assert_eq!(stream(&["x"], &["abxcd"]), ("ab".into(), Some("x".into())));
        // The earliest match wins.
        assert_eq!(
            stream(&["cd", "b"], &["abcd"]),
            ("a".into(), Some("b".into()))
        );
    }

    #[test]
    fn partial_matches_are_held_back_then_released() {
        let stops = vec!["STOP".to_string()];
        let mut o = OutputText::new(&stops);
        assert_eq!(o.push(b" aST").text, " a");
        assert_eq!(o.push(b"O").text, "");
        assert_eq!(o.push(b"x").text, "STOx");
        assert_eq!(o.push(b" S").text, " ");
        assert_eq!(o.flush(), "S");
    }

    #[test]
    fn utf8_is_assembled_across_tokens() {
        let mut o = OutputText::new(&[]);
        let bytes = "é漢".as_bytes();
        assert_eq!(o.push(&bytes[..1]).text, "");
        assert_eq!(o.push(&bytes[1..3]).text, "é");
        assert_eq!(o.push(&bytes[3..]).text, "漢");
        assert_eq!(o.push(&[0xFF, b'a']).text, "\u{FFFD}a");
        o.push(&bytes[..1]);
        assert_eq!(o.flush(), "\u{FFFD}");
    }
}
