//! The one error enum of the native protocol layer.
//!
//! Owns: what can be wrong with bytes on the wire, and the exact `-ERR` text nats-server sends
//! for each kind.
//!
//! Must never: represent "need more bytes" (that is `Ok(None)`), or carry I/O errors.

/// A violation of the native protocol. Every one is fatal: the server sends
/// `-ERR '<nats_text>'` and closes the connection.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// The control line does not start with an operation this side accepts.
    #[error("unknown protocol operation: the line must start with a known verb (PUB, SUB, ...)")]
    UnknownOperation,
    /// The control line is longer than [`Limits::max_control_line`](crate::native::Limits).
    #[error(
        "control line exceeds the maximum length: use shorter subjects or raise max_control_line"
    )]
    MaxControlLineExceeded,
    /// A message announces more payload bytes than allowed.
    #[error(
        "payload of {size} bytes exceeds the maximum of {max} bytes: split the message or raise max_payload"
    )]
    MaxPayloadViolation {
        /// Declared size in bytes (headers included).
        size: usize,
        /// The limit in force.
        max: usize,
    },
    /// The bytes break the syntax of a known operation; the text says what was wrong.
    #[error("parser error: {0}")]
    Parser(String),
}

impl ProtocolError {
    /// The exact text nats-server puts between the quotes of `-ERR '...'`.
    pub fn nats_text(&self) -> &'static str {
        match self {
            Self::UnknownOperation => "Unknown Protocol Operation",
            Self::MaxControlLineExceeded => "Maximum Control Line Exceeded",
            Self::MaxPayloadViolation { .. } => "Maximum Payload Violation",
            Self::Parser(_) => "Parser Error",
        }
    }

    pub(crate) fn parser(msg: impl Into<String>) -> Self {
        Self::Parser(msg.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_texts_are_exact() {
        assert_eq!(
            ProtocolError::UnknownOperation.nats_text(),
            "Unknown Protocol Operation"
        );
        assert_eq!(
            ProtocolError::MaxControlLineExceeded.nats_text(),
            "Maximum Control Line Exceeded"
        );
        assert_eq!(
            ProtocolError::MaxPayloadViolation { size: 2, max: 1 }.nats_text(),
            "Maximum Payload Violation"
        );
        assert_eq!(ProtocolError::parser("x").nats_text(), "Parser Error");
    }

    #[test]
    fn display_says_what_was_wrong() {
        let e = ProtocolError::MaxPayloadViolation { size: 10, max: 5 };
        assert!(e.to_string().contains("10"));
        assert!(e.to_string().contains("max_payload"));
    }
}
