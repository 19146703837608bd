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
    /// The data of the event being read, once it has more than one `data` line (or its one
    /// line is about to leave the buffer); until then it is `line` inside `buffer`.
    data: Vec<u8>,
    /// Where the event's only `data` line lies in `buffer`, while it is the only one.
    line: Option<(usize, usize)>,
    /// Whether the current event's data is in `data` rather than at `line`.
    copied: bool,
    /// Whether the current event has been handed out (cleared on the next call).
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
            line: None,
            copied: false,
            handed_out: false,
            has_data: false,
            limit,
        }
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.reset_if_handed_out();
        if self.consumed > 0 {
            // A pending event's only line is about to move: keep a copy of it.
            if let Some((start, end)) = self.line.take() {
                self.data.clear();
                self.data.extend_from_slice(&self.buffer[start..end]);
                self.copied = true;
            }
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
            let start = self.consumed;
            let mut end = start + newline;
            self.consumed = end + 1;
            if end > start && self.buffer[end - 1] == b'\r' {
                end -= 1;
            }
            if end == start {
                if self.has_data {
                    self.handed_out = true;
                    return Some(Ok(self.event_data()));
                }
                continue;
            }
            if let Err(e) = self.field(start, end) {
                return Some(Err(e));
            }
        }
    }

    /// At the end of the stream: the last event, when it was not closed by a blank line.
    pub fn finish(&mut self) -> Option<Result<&[u8], SseError>> {
        self.reset_if_handed_out();
        let start = self.consumed;
        let mut end = self.buffer.len();
        self.consumed = end;
        if end > start && self.buffer[end - 1] == b'\r' {
            end -= 1;
        }
        if end > start
            && let Err(e) = self.field(start, end)
        {
            return Some(Err(e));
        }
        if self.has_data {
            self.handed_out = true;
            return Some(Ok(self.event_data()));
        }
        None
    }

    fn event_data(&self) -> &[u8] {
        match (self.copied, self.line) {
            (false, Some((start, end))) => &self.buffer[start..end],
            _ => &self.data,
        }
    }

    fn reset_if_handed_out(&mut self) {
        if self.handed_out {
            self.data.clear();
            self.line = None;
            self.copied = false;
            self.has_data = false;
            self.handed_out = false;
        }
    }

    /// One non-empty line of an event, `buffer[start..end]`.
    fn field(&mut self, start: usize, end: usize) -> Result<(), SseError> {
        let line = &self.buffer[start..end];
        if line[0] == b':' {
            return Ok(());
        }
        let (name, value_start) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let mut value = start + colon + 1;
                if self.buffer.get(value) == Some(&b' ') && value < end {
                    value += 1;
                }
                (&line[..colon], value)
            }
            None => (line, end),
        };
        if name != b"data" {
            return Ok(());
        }
        if !self.has_data {
            self.has_data = true;
            self.line = Some((value_start, end));
            self.copied = false;
            if end - value_start > self.limit {
                return Err(SseError::TooLarge { limit: self.limit });
            }
            return Ok(());
        }
        // A second data line: the event's data moves to its own buffer.
        if !self.copied {
            self.data.clear();
            if let Some((s, e)) = self.line.take() {
                self.data.extend_from_slice(&self.buffer[s..e]);
            }
            self.copied = true;
        }
        self.data.push(b'\n');
        self.data.extend_from_slice(&self.buffer[value_start..end]);
        if self.data.len() > self.limit {
            return Err(SseError::TooLarge { limit: self.limit });
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
