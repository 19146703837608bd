//! Server-sent events over bytes: splits a server's byte stream into the `data` payloads of
//! its events, without converting to text and without per-character work.
//!
//! What it accepts is what real servers send: lines ending in `\n` or `\r\n`, events ended by
//! a blank line, `data:` with or without the space, several `data` lines joined by `\n`,
//! comments (`:`) and the `event`, `id` and `retry` fields (ignored: OpenAI-compatible
//! servers put everything in `data`). At the end of the stream, a last event that was never
//! closed by a blank line still counts, because some servers end that way.
//!
//! Everything buffered is bounded by `limit`: a line or an event longer than that is an
//! [`SseError`], never a buffer that grows with whatever a server sends.

/// Why a stream could not be split into events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line (or an event's data) grew past the limit without ending.
    #[error("the server sent an event larger than {limit} bytes")]
    TooLarge {
        /// The limit, bytes.
        limit: usize,
    },
}

/// Splits SSE bytes into event payloads. Feed it with [`Self::push`], take events with
/// [`Self::next_event`] until it says `None`, and call [`Self::finish`] at the end of the stream.
#[derive(Debug)]
pub struct SseDecoder {
    buffer: Vec<u8>,
    /// Bytes of `buffer` already consumed.
    consumed: usize,
    /// The data lines of the event being read.
    data: Vec<u8>,
    /// Whether `data` holds an event already handed out (cleared on the next call).
    handed_out: bool,
    /// Whether the current event has a `data` field at all (an empty one still counts).
    has_data: bool,
    limit: usize,
}

impl SseDecoder {
    /// A decoder that refuses lines and events longer than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            buffer: Vec::new(),
            consumed: 0,
            data: Vec::new(),
            handed_out: false,
            has_data: false,
            limit,
        }
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.consumed > 0 {
            // Only the unread tail moves; in the common case (whole events per read) it is empty.
            self.buffer.drain(..self.consumed);
            self.consumed = 0;
        }
        self.buffer.extend_from_slice(bytes);
    }

    /// The next complete event's data, or `None` until more bytes arrive.
    pub fn next_event(&mut self) -> Option<Result<&[u8], SseError>> {
        self.reset_if_handed_out();
        loop {
            let rest = &self.buffer[self.consumed..];
            let Some(newline) = rest.iter().position(|&b| b == b'\n') else {
                if rest.len() > self.limit {
                    return Some(Err(SseError::TooLarge { limit: self.limit }));
                }
                return None;
            };
            let line_end = self.consumed + newline;
            self.consumed = line_end + 1;
            let mut line = &self.buffer[line_end - newline..line_end];
            if let [head @ .., b'\r'] = line {
                line = head;
            }
            if line.is_empty() {
                if self.has_data {
                    self.handed_out = true;
                    return Some(Ok(&self.data));
                }
                continue;
            }
            if let Err(e) = Self::field(line, &mut self.data, &mut self.has_data, self.limit) {
                return Some(Err(e));
            }
        }
    }

    /// At the end of the stream: the last event, when it was not closed by a blank line.
    pub fn finish(&mut self) -> Option<Result<&[u8], SseError>> {
        self.reset_if_handed_out();
        let rest = &self.buffer[self.consumed..];
        self.consumed = self.buffer.len();
        let mut line = rest;
        if let [head @ .., b'\r'] = line {
            line = head;
        }
        if !line.is_empty()
            && let Err(e) = Self::field(line, &mut self.data, &mut self.has_data, self.limit)
        {
            return Some(Err(e));
        }
        if self.has_data {
            self.handed_out = true;
            return Some(Ok(&self.data));
        }
        None
    }

    fn reset_if_handed_out(&mut self) {
        if self.handed_out {
            self.data.clear();
            self.has_data = false;
            self.handed_out = false;
        }
    }

    /// One non-empty line of an event.
    fn field(
        line: &[u8],
        data: &mut Vec<u8>,
        has_data: &mut bool,
        limit: usize,
    ) -> Result<(), SseError> {
        if line[0] == b':' {
            return Ok(());
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        if name == b"data" {
            if *has_data {
                data.push(b'\n');
            }
            *has_data = true;
            data.extend_from_slice(value);
            if data.len() > limit {
                return Err(SseError::TooLarge { limit });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(decoder: &mut SseDecoder) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(event) = decoder.next_event() {
            out.push(String::from_utf8(event.unwrap().to_vec()).unwrap());
        }
        out
    }

    #[test]
    fn splits_events_across_reads_in_every_line_ending() {
        let stream = b"data: {\"a\":1}\n\n: a comment\r\nevent: x\r\ndata:{\"b\":2}\r\n\r\nid: 7\ndata: one\ndata: two\n\ndata: [DONE]\n\n";
        for size in [1, 2, 3, 7, 64] {
            let mut decoder = SseDecoder::new(1024);
            let mut got = Vec::new();
            for piece in stream.chunks(size) {
                decoder.push(piece);
                got.extend(events(&mut decoder));
            }
            assert!(decoder.finish().is_none());
            assert_eq!(
                got,
                ["{\"a\":1}", "{\"b\":2}", "one\ntwo", "[DONE]"],
                "read {size} bytes at a time"
            );
        }
    }

    #[test]
    fn a_last_event_without_its_blank_line_still_counts() {
        let mut decoder = SseDecoder::new(1024);
        decoder.push(b"data: {\"a\":1}\n\ndata: {\"b\":2}");
        assert_eq!(events(&mut decoder), ["{\"a\":1}"]);
        assert_eq!(decoder.finish().unwrap().unwrap(), b"{\"b\":2}");
        assert!(decoder.finish().is_none());
    }

    #[test]
    fn an_endless_line_or_event_is_cut_off_at_the_limit() {
        let mut decoder = SseDecoder::new(64);
        decoder.push(&[b'x'; 65]);
        assert_eq!(
            decoder.next_event().unwrap(),
            Err(SseError::TooLarge { limit: 64 })
        );
        let mut decoder = SseDecoder::new(64);
        for _ in 0..10 {
            decoder.push(b"data: 0123456789\n");
        }
        assert!(matches!(
            decoder.next_event(),
            Some(Err(SseError::TooLarge { .. }))
        ));
    }

    #[test]
    fn the_buffer_holds_only_what_is_unread() {
        let mut decoder = SseDecoder::new(1 << 20);
        for _ in 0..10_000 {
            decoder.push(b"data: {\"choices\":[]}\n\n");
            assert_eq!(events(&mut decoder).len(), 1);
        }
        decoder.push(b"");
        assert!(decoder.buffer.len() < 64, "{}", decoder.buffer.len());
    }
}
