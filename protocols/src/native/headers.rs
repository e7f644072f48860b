//! NATS header blocks (`NATS/1.0[ status [description]]\r\nKey: Value\r\n...\r\n`), as carried
//! by HPUB and HMSG.
//!
//! Owns: parsing a raw block into a [`HeaderMap`] and writing one back; keys are case-sensitive
//! and repeatable, in order.
//!
//! Must never: be called by the decoders on the publish path (the server forwards raw blocks
//! untouched), or panic on any input.

use bytes::{BufMut, BytesMut};

use super::encode::put_decimal;

/// A header block that does not follow the `NATS/1.0` syntax.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum HeaderError {
    /// The block does not start with `NATS/1.0`.
    #[error("header block must start with NATS/1.0")]
    MissingVersion,
    /// The status after `NATS/1.0` is not three digits.
    #[error("header status must be three digits, got {0:?}")]
    BadStatus(String),
    /// A header line has no `:` or an invalid name.
    #[error("malformed header line {0:?}: expected `Name: value`")]
    MalformedLine(String),
    /// A name or value is not UTF-8.
    #[error("header names and values must be UTF-8")]
    InvalidUtf8,
    /// The block does not end with an empty line.
    #[error("header block must end with an empty line (CRLF CRLF)")]
    Unterminated,
    /// Bytes follow the empty line that ends the block.
    #[error("bytes after the end of the header block")]
    TrailingBytes,
}

/// Parsed NATS headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderMap {
    /// Status code of the first line, e.g. 503 for "no responders".
    pub status: Option<u16>,
    /// Text after the status code.
    pub description: Option<String>,
    /// Entries in order; names are case-sensitive and may repeat.
    pub entries: Vec<(String, String)>,
}

/// The block a server sends when a request has no responders.
pub fn no_responders_block() -> &'static [u8] {
    b"NATS/1.0 503\r\n\r\n"
}

/// Splits off one line ending in `\n` (a `\r` before it is dropped).
fn split_line(input: &[u8]) -> Option<(&[u8], &[u8])> {
    let nl = input.iter().position(|&b| b == b'\n')?;
    let line = input.get(..nl)?;
    let rest = input.get(nl + 1..)?;
    Some((line.strip_suffix(b"\r").unwrap_or(line), rest))
}

fn trim(bytes: &[u8]) -> &[u8] {
    bytes.trim_ascii()
}

fn utf8(bytes: &[u8]) -> Result<String, HeaderError> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| HeaderError::InvalidUtf8)
}

impl HeaderMap {
    /// An empty map (no status, no entries).
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses a raw block, from `NATS/1.0` through the blank line. An empty block is an
    /// empty map: on the wire (`<#hdr>` 0) nats-server reads it as a message without headers.
    pub fn parse(block: &[u8]) -> Result<HeaderMap, HeaderError> {
        if block.is_empty() {
            return Ok(HeaderMap::default());
        }
        let rest = block
            .strip_prefix(b"NATS/1.0")
            .ok_or(HeaderError::MissingVersion)?;
        let (first, mut rest) = split_line(rest).ok_or(HeaderError::Unterminated)?;
        let mut map = HeaderMap::default();
        if !first.is_empty() {
            if !first.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
                return Err(HeaderError::MissingVersion);
            }
            let first = trim(first);
            let code_end = first
                .iter()
                .position(|b| b.is_ascii_whitespace())
                .unwrap_or(first.len());
            let (code, desc) = first.split_at(code_end);
            if code.len() != 3 || !code.iter().all(u8::is_ascii_digit) {
                return Err(HeaderError::BadStatus(
                    String::from_utf8_lossy(code).into_owned(),
                ));
            }
            map.status = utf8(code)?.parse().ok();
            let desc = trim(desc);
            if !desc.is_empty() {
                map.description = Some(utf8(desc)?);
            }
        }
        loop {
            let (line, next) = split_line(rest).ok_or(HeaderError::Unterminated)?;
            rest = next;
            if line.is_empty() {
                break;
            }
            let colon = line
                .iter()
                .position(|&b| b == b':')
                .ok_or_else(|| HeaderError::MalformedLine(String::from_utf8_lossy(line).into()))?;
            let (name, value) = line.split_at(colon);
            let value = value.get(1..).unwrap_or_default();
            if name.is_empty() || name.iter().any(|&b| b <= b' ' || b == 0x7f) {
                return Err(HeaderError::MalformedLine(
                    String::from_utf8_lossy(line).into(),
                ));
            }
            map.entries.push((utf8(name)?, utf8(trim(value))?));
        }
        if !rest.is_empty() {
            return Err(HeaderError::TrailingBytes);
        }
        Ok(map)
    }

    /// Appends the block, ending with the blank line. CR and LF inside names, values or the
    /// description are written as spaces so they cannot break the framing.
    pub fn encode(&self, out: &mut BytesMut) {
        out.put_slice(b"NATS/1.0");
        if let Some(status) = self.status {
            out.put_u8(b' ');
            put_decimal(out, u64::from(status));
            if let Some(desc) = &self.description {
                out.put_u8(b' ');
                put_clean(out, desc.as_bytes());
            }
        }
        out.put_slice(b"\r\n");
        for (name, value) in &self.entries {
            put_clean(out, name.as_bytes());
            out.put_slice(b": ");
            put_clean(out, value.as_bytes());
            out.put_slice(b"\r\n");
        }
        out.put_slice(b"\r\n");
    }

    /// The first value of `name` (case-sensitive).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether `Content-Type` says the payload is JSON.
    pub fn says_json(&self) -> bool {
        self.get("Content-Type")
            .is_some_and(|t| t.trim().starts_with("application/json"))
    }

    /// Every value of `name` (case-sensitive), in order.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.entries
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Replaces every value of `name` with `value`.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let name = name.into();
        self.entries.retain(|(n, _)| *n != name);
        self.entries.push((name, value.into()));
    }

    /// Adds a value of `name`, keeping the others.
    pub fn append(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.entries.push((name.into(), value.into()));
    }

    /// Removes every value of `name`; returns how many were removed.
    pub fn remove(&mut self, name: &str) -> usize {
        let before = self.entries.len();
        self.entries.retain(|(n, _)| n != name);
        before - self.entries.len()
    }

    /// No status and no entries.
    pub fn is_empty(&self) -> bool {
        self.status.is_none() && self.entries.is_empty()
    }
}

fn put_clean(out: &mut BytesMut, bytes: &[u8]) {
    if bytes.iter().any(|&b| b == b'\r' || b == b'\n') {
        out.extend(
            bytes
                .iter()
                .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
    } else {
        out.put_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_in_order() {
        let h = HeaderMap::parse(b"NATS/1.0\r\nA: 1\r\nb:2\r\nA:  3 \r\n\r\n").unwrap();
        assert_eq!(h.status, None);
        assert_eq!(h.get("A"), Some("1"));
        assert_eq!(h.get("a"), None);
        assert_eq!(h.get("b"), Some("2"));
        assert_eq!(h.get_all("A").collect::<Vec<_>>(), ["1", "3"]);
    }

    #[test]
    fn parses_status_lines() {
        let h = HeaderMap::parse(no_responders_block()).unwrap();
        assert_eq!(h.status, Some(503));
        assert_eq!(h.description, None);
        assert!(h.entries.is_empty());
        let h = HeaderMap::parse(b"NATS/1.0 408 Request Timeout\r\nX: y\r\n\r\n").unwrap();
        assert_eq!(h.status, Some(408));
        assert_eq!(h.description.as_deref(), Some("Request Timeout"));
    }

    #[test]
    fn an_empty_block_is_no_headers() {
        assert_eq!(HeaderMap::parse(b""), Ok(HeaderMap::new()));
        assert_eq!(
            HeaderMap::parse(b"\r\n\r\n"),
            Err(HeaderError::MissingVersion)
        );
    }

    #[test]
    fn rejects_bad_blocks() {
        assert_eq!(
            HeaderMap::parse(b"HTTP/1.1\r\n\r\n"),
            Err(HeaderError::MissingVersion)
        );
        assert_eq!(
            HeaderMap::parse(b"NATS/1.0\r\nA: 1\r\n"),
            Err(HeaderError::Unterminated)
        );
        assert!(matches!(
            HeaderMap::parse(b"NATS/1.0 50x\r\n\r\n"),
            Err(HeaderError::BadStatus(_))
        ));
        assert!(matches!(
            HeaderMap::parse(b"NATS/1.0\r\nnocolon\r\n\r\n"),
            Err(HeaderError::MalformedLine(_))
        ));
        assert!(matches!(
            HeaderMap::parse(b"NATS/1.0\r\n: v\r\n\r\n"),
            Err(HeaderError::MalformedLine(_))
        ));
        assert_eq!(
            HeaderMap::parse(b"NATS/1.0\r\n\r\nx"),
            Err(HeaderError::TrailingBytes)
        );
        assert_eq!(
            HeaderMap::parse(b"NATS/1.0\r\nA: \xff\r\n\r\n"),
            Err(HeaderError::InvalidUtf8)
        );
    }

    #[test]
    fn encode_round_trips() {
        let mut h = HeaderMap::new();
        assert!(h.is_empty());
        h.append("A", "1");
        h.append("A", "2");
        h.insert("B", "x");
        h.insert("B", "y");
        assert_eq!(h.get_all("B").collect::<Vec<_>>(), ["y"]);
        let mut out = BytesMut::new();
        h.encode(&mut out);
        assert_eq!(&out[..], b"NATS/1.0\r\nA: 1\r\nA: 2\r\nB: y\r\n\r\n");
        assert_eq!(HeaderMap::parse(&out).unwrap(), h);
        assert_eq!(h.remove("A"), 2);

        let status = HeaderMap {
            status: Some(503),
            ..HeaderMap::default()
        };
        let mut out = BytesMut::new();
        status.encode(&mut out);
        assert_eq!(&out[..], no_responders_block());
    }

    #[test]
    fn encode_neutralises_line_breaks() {
        let mut h = HeaderMap::new();
        h.append("A", "1\r\nEvil: yes");
        let mut out = BytesMut::new();
        h.encode(&mut out);
        let back = HeaderMap::parse(&out).unwrap();
        assert_eq!(back.entries.len(), 1);
        assert_eq!(back.get("Evil"), None);
    }
}
