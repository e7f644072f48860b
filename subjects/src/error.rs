//! The one error type of this crate: what was wrong with a subject, topic, pattern or filter.
//!
//! Owns the wording clients see when their subject is refused. Must never hold anything but
//! owned, cloneable data, and must never echo an unbounded string back (see [`shown`]).

/// Why a subject, MQTT topic, pattern or MQTT filter was refused.
///
/// Every message names the offending text (cut to 120 bytes) and, where there is one, the fix.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum SubjectError {
    /// The subject, topic, pattern or filter was the empty string.
    #[error("empty subject: a subject needs at least one token")]
    Empty,
    /// The native subject or pattern `%`: one empty token, which MQTT cannot name (its topic
    /// would be the empty string).
    #[error("subject `%` is a single empty token, which has no MQTT rendering; add a token")]
    LoneEmptyToken,
    /// Longer than the configured (or MQTT's 65,535-byte) limit.
    #[error("subject `{subject}` is {len} bytes, over the limit of {max}")]
    TooLong {
        /// The offending text (shortened).
        subject: String,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More tokens than the configured limit.
    #[error("subject `{subject}` has {count} tokens, over the limit of {max}")]
    TooManyTokens {
        /// The offending text (shortened).
        subject: String,
        /// Its number of tokens.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// `a..b`, `.a` or `a.` in the native syntax.
    #[error("empty token in subject `{subject}`; write an empty token as `%`")]
    EmptyToken {
        /// The offending text (shortened).
        subject: String,
    },
    /// A whole token `*` or `>` where a literal subject was expected.
    #[error(
        "wildcard `{token}` in subject `{subject}`: a subject names one token at each level \
         (write a literal `{token}` token as `{escaped}`)"
    )]
    WildcardInSubject {
        /// The offending text (shortened).
        subject: String,
        /// `*` or `>`.
        token: char,
        /// Its escaped literal form.
        escaped: &'static str,
    },
    /// ASCII whitespace or a control character in the native syntax.
    #[error("character 0x{byte:02X} in subject `{subject}` must be escaped as `%{byte:02X}`")]
    NeedsEscape {
        /// The offending text (shortened).
        subject: String,
        /// The offending byte.
        byte: u8,
    },
    /// A `%XX` escape of a character that the syntax would write plainly (`%41` for `A`).
    #[error(
        "`{escape}` escapes a character that needs no escape here; write `{plain}` (in `{subject}`)"
    )]
    NonCanonicalEscape {
        /// The offending text (shortened).
        subject: String,
        /// The escape as written, e.g. `%41`.
        escape: String,
        /// What to write instead.
        plain: String,
    },
    /// `%00`: NUL cannot be part of any subject.
    #[error("`%00` in `{subject}` escapes NUL, which no subject may contain")]
    EscapedNul {
        /// The offending text (shortened).
        subject: String,
    },
    /// A NUL character: no subject, topic, pattern or filter may contain one.
    #[error("NUL character in `{subject}`: no subject may contain NUL")]
    Nul {
        /// The offending text (shortened).
        subject: String,
    },
    /// `+` or `#` in an MQTT topic name.
    #[error(
        "`{wildcard}` in MQTT topic name `{subject}`: wildcards belong in subscription filters \
         only (write a literal `{wildcard}` as `{escaped}`)"
    )]
    WildcardInTopic {
        /// The offending text (shortened).
        subject: String,
        /// `+` or `#`.
        wildcard: char,
        /// Its escaped literal form.
        escaped: &'static str,
    },
    /// `>` before the last token of a native pattern.
    #[error("`>` must be the last token of pattern `{pattern}`")]
    MisplacedOneOrMore {
        /// The offending text (shortened).
        pattern: String,
    },
    /// `#` before the last level of an MQTT filter.
    #[error("`#` must be the last level of MQTT filter `{pattern}`")]
    MisplacedZeroOrMore {
        /// The offending text (shortened).
        pattern: String,
    },
    /// `+` or `#` sharing a level with other characters (`a+/b`), forbidden by MQTT.
    #[error("`{wildcard}` must fill a whole level in MQTT filter `{pattern}`")]
    PartialWildcard {
        /// The offending text (shortened).
        pattern: String,
        /// `+` or `#`.
        wildcard: char,
    },
}

/// Longest piece of client input echoed back in an error message.
const SHOWN_MAX: usize = 120;

/// `s` cut to at most [`SHOWN_MAX`] bytes on a character boundary, with `…` when cut.
pub(crate) fn shown(s: &str) -> String {
    if s.len() <= SHOWN_MAX {
        return s.to_owned();
    }
    let mut end = SHOWN_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + 3);
    out.push_str(&s[..end]);
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_cuts_on_char_boundary() {
        let s = "é".repeat(100);
        let cut = shown(&s);
        assert!(cut.ends_with('…'));
        assert!(cut.len() <= SHOWN_MAX + '…'.len_utf8());
        assert_eq!(shown("a.b"), "a.b");
    }
}
