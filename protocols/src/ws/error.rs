//! The error codes of the `/ws` API and the one error of its request decoder.
//!
//! Owns: the machine codes clients see in `{"op":"error","code":…}` (docs/websocket.md lists
//! them), and for a request that cannot be decoded, what was wrong ([`WsErrorKind`]), the
//! sentence that says so, and the request's `id` when one could be read.
//!
//! Must never: represent refusals that need the server's state (subjects, permissions,
//! quotas, the store): those are the server's, with the codes of [`ErrorCode`].

use std::fmt;

/// A machine code of an `error` frame. These strings are the API: clients match on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Not a request: bad JSON, a missing or mistyped field, an unknown op or field, bad
    /// base64, a bad header name, or a binary WebSocket message.
    BadRequest,
    /// The request, or the message or snapshot it carries, is over a limit.
    TooLarge,
    /// A pattern the subject syntax refuses.
    InvalidPattern,
    /// A subject the subject syntax refuses.
    InvalidSubject,
    /// The deny lists, the user's rules, or a `$` subject.
    Forbidden,
    /// No such subscription, message or snapshot.
    NotFound,
    /// A stale `expect_version`, or a snapshot past the subject's head.
    Conflict,
    /// The tenant's subscriptions, publish rate, stored bytes or subjects.
    QuotaExceeded,
    /// The payload does not match the schema bound to its subject.
    InvalidMessage,
    /// Too many publishes waiting for the store on this connection.
    Busy,
    /// The store is not open, closing, or failed.
    Unavailable,
    /// The server could not write its answer.
    Internal,
}

impl ErrorCode {
    /// The code as clients see it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::TooLarge => "too_large",
            Self::InvalidPattern => "invalid_pattern",
            Self::InvalidSubject => "invalid_subject",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::Conflict => "conflict",
            Self::QuotaExceeded => "quota_exceeded",
            Self::InvalidMessage => "invalid_message",
            Self::Busy => "busy",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        }
    }

    /// Every code, for tests and documentation.
    pub const ALL: &[ErrorCode] = &[
        Self::BadRequest,
        Self::TooLarge,
        Self::InvalidPattern,
        Self::InvalidSubject,
        Self::Forbidden,
        Self::NotFound,
        Self::Conflict,
        Self::QuotaExceeded,
        Self::InvalidMessage,
        Self::Busy,
        Self::Unavailable,
        Self::Internal,
    ];
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What was wrong with a request that could not be decoded. Field names are the JSON names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WsErrorKind {
    /// A binary WebSocket message: requests are text.
    NotText,
    /// The request text is longer than [`WsLimits::max_text`](super::WsLimits).
    TooLarge { size: usize, max: usize },
    /// The text is not JSON (a syntax error, or trailing characters).
    NotJson,
    /// JSON, but not an object.
    NotAnObject,
    /// A field no op has.
    UnknownField,
    /// A field given twice.
    DuplicateField { field: &'static str },
    /// A field of the wrong type, or a number out of its range.
    WrongType { field: &'static str },
    /// A field the op needs is missing (`op` itself, for a request without one).
    MissingField { field: &'static str },
    /// The op needs one of two fields and has neither.
    MissingOneOf { fields: [&'static str; 2] },
    /// Two fields that exclude each other are both given.
    Exclusive { fields: [&'static str; 2] },
    /// An op the API does not have.
    UnknownOp,
    /// `data_b64` is not standard base64.
    BadBase64,
    /// A `headers` name that a NATS header block cannot carry.
    BadHeaderName,
    /// The message (payload and the header block the server stores), or the snapshot, is
    /// larger than [`WsLimits::max_payload`](super::WsLimits).
    PayloadTooLarge { size: usize, max: usize },
}

impl WsErrorKind {
    /// The code the client is answered with. Every kind but the size limits is
    /// `bad_request`, as docs/websocket.md says (an unknown op included).
    pub fn code(self) -> ErrorCode {
        match self {
            Self::TooLarge { .. } | Self::PayloadTooLarge { .. } => ErrorCode::TooLarge,
            _ => ErrorCode::BadRequest,
        }
    }
}

/// A request the server cannot act on, answered with
/// `{"code":…,"id":…,"message":…,"op":"error"}` (see
/// [`encode_error`](super::encode_error)); the connection stays open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct WsDecodeError {
    /// What was wrong, for programs.
    pub kind: WsErrorKind,
    /// One sentence saying what was wrong, for people.
    pub message: String,
    /// The request's `id`, when the text has one that could be read, so the answer reaches
    /// the request that caused it.
    pub id: Option<String>,
}

impl WsDecodeError {
    pub(crate) fn new(kind: WsErrorKind, message: impl Into<String>) -> Self {
        WsDecodeError {
            kind,
            message: message.into(),
            id: None,
        }
    }

    /// The answer to a binary WebSocket message.
    pub fn not_text() -> Self {
        Self::new(WsErrorKind::NotText, "requests are JSON text messages")
    }

    /// The code the client is answered with.
    pub fn code(&self) -> ErrorCode {
        self.kind.code()
    }
}

/// At most this many characters of a client's text are quoted in an error message.
const QUOTED: usize = 64;

/// `text` cut to [`QUOTED`] characters, for quoting in a message.
pub(crate) fn quoted(text: &str) -> &str {
    match text.char_indices().nth(QUOTED) {
        Some((end, _)) => text.get(..end).unwrap_or(text),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_documented_strings() {
        let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            codes,
            [
                "bad_request",
                "too_large",
                "invalid_pattern",
                "invalid_subject",
                "forbidden",
                "not_found",
                "conflict",
                "quota_exceeded",
                "invalid_message",
                "busy",
                "unavailable",
                "internal"
            ]
        );
        assert_eq!(ErrorCode::QuotaExceeded.to_string(), "quota_exceeded");
    }

    #[test]
    fn only_size_limits_are_too_large() {
        assert_eq!(
            WsErrorKind::TooLarge { size: 2, max: 1 }.code(),
            ErrorCode::TooLarge
        );
        assert_eq!(
            WsErrorKind::PayloadTooLarge { size: 2, max: 1 }.code(),
            ErrorCode::TooLarge
        );
        assert_eq!(WsErrorKind::UnknownOp.code(), ErrorCode::BadRequest);
        assert_eq!(WsDecodeError::not_text().code(), ErrorCode::BadRequest);
    }

    #[test]
    fn quotes_are_cut_on_character_boundaries() {
        assert_eq!(quoted("short"), "short");
        let long = "é".repeat(100);
        assert_eq!(quoted(&long).chars().count(), QUOTED);
    }
}
