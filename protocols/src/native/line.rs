//! Framing shared by both decoders: finding control lines, splitting arguments, reading sized
//! payloads, and the limits that bound how much a decoder lets a peer make it buffer.
//!
//! Owns: the `\r\n` (or bare `\n`) terminator rule, the control-line limit (checked even before
//! the terminator arrives), decimal size syntax, the "UTF-8 without control characters" rule for
//! tokens, and the `\r\n` that must follow every payload.
//!
//! Must never: rescan bytes already scanned for a terminator, look past
//! `max_control_line + 2` bytes for one, or index input without a bounds check.

use bytes::{Buf, Bytes, BytesMut};

use super::error::ProtocolError;

/// Bounds on what a peer may make a decoder buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest control line in bytes, not counting its `\r\n` (nats-server default 4096).
    pub max_control_line: usize,
    /// Largest payload in bytes, headers included (nats-server default 1 MiB).
    pub max_payload: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_control_line: 4096,
            max_payload: 1024 * 1024,
        }
    }
}

/// Finds control lines in a stream, remembering how far it already looked.
#[derive(Debug, Default, Clone)]
pub(crate) struct LineReader {
    /// Bytes at the front of the buffer known to hold no `\n`.
    scanned: usize,
}

impl LineReader {
    /// Takes the next control line out of `buf`, without its terminator (`\n` or `\r\n`).
    ///
    /// `Ok(None)` means no complete line yet; the caller must keep the same buffer and append.
    pub(crate) fn next_line(
        &mut self,
        buf: &mut BytesMut,
        limits: &Limits,
    ) -> Result<Option<Bytes>, ProtocolError> {
        let max = limits.max_control_line;
        // A line of `max` bytes plus `\r\n`: the `\n` is at index `max + 1` at the latest.
        let window_end = buf.len().min(max.saturating_add(2));
        let start = self.scanned.min(window_end);
        let found = buf
            .get(start..window_end)
            .and_then(|w| w.iter().position(|&b| b == b'\n'));
        let Some(offset) = found else {
            if buf.len() > max.saturating_add(1) {
                self.scanned = 0;
                return Err(ProtocolError::MaxControlLineExceeded);
            }
            self.scanned = window_end;
            return Ok(None);
        };
        self.scanned = 0;
        let newline = start + offset;
        let mut line = buf
            .split_to(newline.saturating_add(1).min(buf.len()))
            .freeze();
        line.truncate(newline);
        if line.last() == Some(&b'\r') {
            line.truncate(newline.saturating_sub(1));
        }
        if line.len() > max {
            return Err(ProtocolError::MaxControlLineExceeded);
        }
        Ok(Some(line))
    }

    pub(crate) fn reset(&mut self) {
        self.scanned = 0;
    }
}

/// Takes `size` payload bytes and the `\r\n` after them out of `buf`, or `Ok(None)` until all
/// `size + 2` bytes are there.
pub(crate) fn take_payload(
    buf: &mut BytesMut,
    size: usize,
) -> Result<Option<Bytes>, ProtocolError> {
    let Some(need) = size.checked_add(2) else {
        return Err(ProtocolError::parser("payload size overflows"));
    };
    if buf.len() < need {
        return Ok(None);
    }
    if buf.get(size..need) != Some(b"\r\n".as_slice()) {
        return Err(ProtocolError::parser(
            "payload must be followed by CRLF: the declared size does not match the bytes sent",
        ));
    }
    let payload = buf.split_to(size).freeze();
    buf.advance(2);
    Ok(Some(payload))
}

fn is_space(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Splits a control line into its operation name and the index where arguments start.
pub(crate) fn split_op(line: &[u8]) -> (&[u8], usize) {
    let end = line.iter().position(|&b| is_space(b)).unwrap_or(line.len());
    (line.get(..end).unwrap_or_default(), end)
}

/// Everything after the operation name with surrounding spaces and tabs removed (JSON bodies,
/// `-ERR` texts).
pub(crate) fn rest_of(line: &Bytes, from: usize) -> Bytes {
    let bytes = line.get(from..).unwrap_or_default();
    let lead = bytes.iter().take_while(|&&b| is_space(b)).count();
    let trail = bytes.iter().rev().take_while(|&&b| is_space(b)).count();
    let start = from.saturating_add(lead).min(line.len());
    let end = line.len().saturating_sub(trail).max(start);
    line.slice(start..end)
}

/// Most arguments any operation takes (`HMSG subject sid reply hdr total`).
const MAX_ARGS: usize = 5;

/// The argument tokens of a control line, as spans, without allocating.
pub(crate) struct Args<'a> {
    line: &'a Bytes,
    spans: [(usize, usize); MAX_ARGS],
    /// Number of tokens seen; may exceed `MAX_ARGS` (only the first `MAX_ARGS` are kept).
    count: usize,
}

impl<'a> Args<'a> {
    /// Splits `line[from..]` on runs of spaces and tabs.
    pub(crate) fn split(line: &'a Bytes, from: usize) -> Self {
        let mut spans = [(0, 0); MAX_ARGS];
        let mut count = 0;
        let mut i = from;
        let len = line.len();
        while i < len {
            while line.get(i).is_some_and(|&b| is_space(b)) {
                i += 1;
            }
            if i >= len {
                break;
            }
            let start = i;
            while line.get(i).is_some_and(|&b| !is_space(b)) {
                i += 1;
            }
            if let Some(slot) = spans.get_mut(count) {
                *slot = (start, i);
            }
            count += 1;
        }
        Self { line, spans, count }
    }

    pub(crate) fn len(&self) -> usize {
        self.count
    }

    fn raw(&self, i: usize) -> Result<&'a [u8], ProtocolError> {
        self.spans
            .get(i)
            .filter(|_| i < self.count)
            .and_then(|&(s, e)| self.line.get(s..e))
            .ok_or_else(|| ProtocolError::parser("missing argument"))
    }

    /// Argument `i` as a zero-copy token: UTF-8 without control characters.
    pub(crate) fn token(&self, i: usize, what: &str) -> Result<Bytes, ProtocolError> {
        let raw = self.raw(i)?;
        if raw.iter().any(|&b| b < 0x20 || b == 0x7f) {
            return Err(ProtocolError::parser(format!(
                "{what} contains a control character"
            )));
        }
        if std::str::from_utf8(raw).is_err() {
            return Err(ProtocolError::parser(format!("{what} is not valid UTF-8")));
        }
        let (s, e) = self.spans.get(i).copied().unwrap_or_default();
        Ok(self.line.slice(s..e))
    }

    /// Argument `i` as a plain decimal size.
    pub(crate) fn size(&self, i: usize, what: &str) -> Result<u64, ProtocolError> {
        parse_decimal(self.raw(i)?)
            .ok_or_else(|| ProtocolError::parser(format!("{what} must be a decimal number")))
    }
}

/// Plain ASCII digits, no sign, no overflow.
pub(crate) fn parse_decimal(raw: &[u8]) -> Option<u64> {
    if raw.is_empty() {
        return None;
    }
    raw.iter().try_fold(0u64, |acc, &b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Converts a declared size to `usize` and checks it against the payload limit.
pub(crate) fn check_payload(size: u64, limits: &Limits) -> Result<usize, ProtocolError> {
    let max = limits.max_payload;
    match usize::try_from(size) {
        Ok(size) if size <= max => Ok(size),
        Ok(size) => Err(ProtocolError::MaxPayloadViolation { size, max }),
        Err(_) => Err(ProtocolError::MaxPayloadViolation {
            size: usize::MAX,
            max,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(line: usize) -> Limits {
        Limits {
            max_control_line: line,
            max_payload: 16,
        }
    }

    #[test]
    fn finds_crlf_and_bare_lf() {
        let mut r = LineReader::default();
        let mut buf = BytesMut::from(&b"PING\r\nPONG\nX"[..]);
        let l = limits(16);
        assert_eq!(r.next_line(&mut buf, &l).unwrap().unwrap(), "PING");
        assert_eq!(r.next_line(&mut buf, &l).unwrap().unwrap(), "PONG");
        assert_eq!(r.next_line(&mut buf, &l).unwrap(), None);
        assert_eq!(&buf[..], b"X");
    }

    #[test]
    fn line_limit_counts_only_the_line() {
        let l = limits(4);
        let mut r = LineReader::default();
        let mut ok = BytesMut::from(&b"abcd\r\n"[..]);
        assert_eq!(r.next_line(&mut ok, &l).unwrap().unwrap(), "abcd");
        let mut long = BytesMut::from(&b"abcde\r\n"[..]);
        assert_eq!(
            r.next_line(&mut long, &l),
            Err(ProtocolError::MaxControlLineExceeded)
        );
    }

    #[test]
    fn line_limit_applies_before_the_terminator() {
        let l = limits(4);
        let mut r = LineReader::default();
        let mut buf = BytesMut::from(&b"abcd\r"[..]);
        assert_eq!(r.next_line(&mut buf, &l), Ok(None));
        buf.extend_from_slice(b"x");
        assert_eq!(
            r.next_line(&mut buf, &l),
            Err(ProtocolError::MaxControlLineExceeded)
        );
    }

    #[test]
    fn decimal_rules() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_decimal(b"18446744073709551616"), None);
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"+1"), None);
        assert_eq!(parse_decimal(b"-1"), None);
        assert_eq!(parse_decimal(b"1a"), None);
    }

    #[test]
    fn args_split_on_runs_of_blanks() {
        let line = Bytes::from_static(b"PUB \t a  b\t\t3 ");
        let (op, from) = split_op(&line);
        assert_eq!(op, b"PUB");
        let args = Args::split(&line, from);
        assert_eq!(args.len(), 3);
        assert_eq!(args.token(0, "s").unwrap(), "a");
        assert_eq!(args.token(1, "s").unwrap(), "b");
        assert_eq!(args.size(2, "n").unwrap(), 3);
        assert!(args.token(3, "s").is_err());
    }

    #[test]
    fn too_many_args_are_counted() {
        let line = Bytes::from_static(b"X a b c d e f g");
        let args = Args::split(&line, 1);
        assert_eq!(args.len(), 7);
    }

    #[test]
    fn tokens_reject_control_chars_and_bad_utf8() {
        let line = Bytes::from_static(b"a\rb \xff");
        let args = Args::split(&line, 0);
        assert!(args.token(0, "subject").is_err());
        assert!(args.token(1, "subject").is_err());
    }

    #[test]
    fn payload_needs_crlf() {
        let mut buf = BytesMut::from(&b"abc\r"[..]);
        assert_eq!(take_payload(&mut buf, 3), Ok(None));
        buf.extend_from_slice(b"\n");
        assert_eq!(take_payload(&mut buf, 3).unwrap().unwrap(), "abc");
        let mut bad = BytesMut::from(&b"abcd\r\n"[..]);
        assert!(matches!(
            take_payload(&mut bad, 3),
            Err(ProtocolError::Parser(_))
        ));
    }
}
