//! Literal subjects: parsing and validating both renderings, and converting between them.
//!
//! Owns [`Subject`] (always held in its canonical native rendering), [`Limits`], and
//! [`validate_native_subject`], the check every publish goes through. Must never accept a
//! subject holding a wildcard, never allocate in [`validate_native_subject`], and never
//! lose information between the native and MQTT renderings (see [`crate::escape`]).

use std::fmt;

use crate::error::{SubjectError, shown};
use crate::escape::{self, TokenError};

/// MQTT's own ceiling on a topic's length in bytes.
pub const MQTT_MAX_LEN: usize = 65_535;

/// Size limits of a subject, pattern, topic or filter.
///
/// `max_len` bounds the byte length of the native rendering (and of the MQTT text when the
/// input is MQTT); `max_tokens` bounds the number of tokens (the same in both renderings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest subject in bytes. Default 4096.
    pub max_len: usize,
    /// Most tokens in a subject. Default 128.
    pub max_tokens: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_len: 4096,
            max_tokens: 128,
        }
    }
}

/// A literal subject, held in its canonical native rendering (`a.b.c`).
///
/// Built only by the parsers, so it is always valid: non-empty tokens, no wildcards,
/// canonical escapes.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Subject {
    native: Box<str>,
}

/// Turns a token's error into the subject-level error, naming `whole`.
pub(crate) fn token_error(whole: &str, token: &str, err: TokenError) -> SubjectError {
    let subject = shown(whole);
    match err {
        TokenError::Empty => SubjectError::EmptyToken { subject },
        TokenError::Wildcard(w) => {
            let (token, escaped) = if w == b'*' {
                ('*', "%2A")
            } else {
                ('>', "%3E")
            };
            SubjectError::WildcardInSubject {
                subject,
                token,
                escaped,
            }
        }
        TokenError::NeedsEscape(byte) => SubjectError::NeedsEscape { subject, byte },
        TokenError::NonCanonical(at) => {
            let (escape, plain) = escape::plain_for(token, at);
            SubjectError::NonCanonicalEscape {
                subject,
                escape,
                plain,
            }
        }
        TokenError::EscapedNul => SubjectError::EscapedNul { subject },
        TokenError::Nul => SubjectError::Nul { subject },
        TokenError::WildcardChar(w) => {
            let (wildcard, escaped) = if w == b'+' {
                ('+', "%2B")
            } else {
                ('#', "%23")
            };
            SubjectError::WildcardInTopic {
                subject,
                wildcard,
                escaped,
            }
        }
    }
}

/// Checks the length of `s` against `limits` (and `extra_max`, MQTT's own ceiling).
pub(crate) fn check_len(s: &str, limits: &Limits, extra_max: usize) -> Result<(), SubjectError> {
    if s.is_empty() {
        return Err(SubjectError::Empty);
    }
    let max = limits.max_len.min(extra_max);
    if s.len() > max {
        return Err(SubjectError::TooLong {
            subject: shown(s),
            len: s.len(),
            max,
        });
    }
    Ok(())
}

/// Checks the token count `count` of `s` against `limits`.
pub(crate) fn check_tokens(s: &str, count: usize, limits: &Limits) -> Result<(), SubjectError> {
    if count > limits.max_tokens {
        return Err(SubjectError::TooManyTokens {
            subject: shown(s),
            count,
            max: limits.max_tokens,
        });
    }
    Ok(())
}

/// Checks that `s` is a valid native subject (no wildcards) within `limits`.
///
/// The subject `%` (one empty token) is refused: its MQTT rendering would be the empty
/// topic, which MQTT forbids, so it could not cross between the renderings.
///
/// This is the check every publish goes through: one pass over the bytes, no allocation
/// unless it fails.
pub fn validate_native_subject(s: &str, limits: &Limits) -> Result<(), SubjectError> {
    check_len(s, limits, usize::MAX)?;
    if s == "%" {
        return Err(SubjectError::LoneEmptyToken);
    }
    let mut count = 0usize;
    for token in s.split('.') {
        count += 1;
        if count > limits.max_tokens {
            return check_tokens(s, s.split('.').count(), limits);
        }
        escape::check_native(token).map_err(|e| token_error(s, token, e))?;
    }
    Ok(())
}

/// Appends the native rendering of the MQTT text `text` (topic or literal filter levels
/// already validated), using `raw` as scratch.
pub(crate) fn push_mqtt_level_as_native(level: &str, raw: &mut String, out: &mut String) {
    raw.clear();
    escape::decode(level, false, raw);
    escape::encode_native(raw, out);
}

/// Appends the MQTT rendering of one native token, using `raw` as scratch.
pub(crate) fn push_native_token_as_mqtt(token: &str, raw: &mut String, out: &mut String) {
    raw.clear();
    escape::decode(token, true, raw);
    escape::encode_mqtt(raw, out);
}

impl Subject {
    /// Parses a native subject (`a.b.c`) within the default [`Limits`].
    pub fn parse_native(s: &str) -> Result<Subject, SubjectError> {
        Self::parse_native_with(s, &Limits::default())
    }

    /// Parses a native subject (`a.b.c`) within `limits`.
    pub fn parse_native_with(s: &str, limits: &Limits) -> Result<Subject, SubjectError> {
        validate_native_subject(s, limits)?;
        Ok(Subject { native: s.into() })
    }

    /// Parses an MQTT topic name (`a/b/c`) within the default [`Limits`].
    pub fn parse_mqtt(topic: &str) -> Result<Subject, SubjectError> {
        Self::parse_mqtt_with(topic, &Limits::default())
    }

    /// Parses an MQTT topic name (`a/b/c`) within `limits`, which bound both the topic and
    /// its native rendering.
    pub fn parse_mqtt_with(topic: &str, limits: &Limits) -> Result<Subject, SubjectError> {
        check_len(topic, limits, MQTT_MAX_LEN)?;
        check_tokens(topic, topic.split('/').count(), limits)?;
        for level in topic.split('/') {
            escape::check_mqtt(level).map_err(|e| token_error(topic, level, e))?;
        }
        let mut native = String::with_capacity(topic.len() + 8);
        let mut raw = String::new();
        for (i, level) in topic.split('/').enumerate() {
            if i > 0 {
                native.push('.');
            }
            push_mqtt_level_as_native(level, &mut raw, &mut native);
        }
        check_len(&native, limits, usize::MAX)?;
        Ok(Subject {
            native: native.into_boxed_str(),
        })
    }

    /// The native rendering, `a.b.c`.
    pub fn as_str(&self) -> &str {
        &self.native
    }

    /// The MQTT rendering, `a/b/c`. Always a valid MQTT topic name, except that it may pass
    /// MQTT's 65,535-byte ceiling when [`Limits::max_len`] is above 21,845 (escapes triple).
    pub fn to_mqtt(&self) -> String {
        let mut out = String::with_capacity(self.native.len() + 8);
        let mut raw = String::new();
        for (i, token) in self.tokens().enumerate() {
            if i > 0 {
                out.push('/');
            }
            push_native_token_as_mqtt(token, &mut raw, &mut out);
        }
        out
    }

    /// The native-rendered tokens.
    pub fn tokens(&self) -> impl Iterator<Item = &str> {
        self.native.split('.')
    }

    /// Is this a `$`-subject (first token starts with `$`, like `$SYS.x`)? Patterns whose
    /// first token is a wildcard never match these.
    pub fn is_system(&self) -> bool {
        self.native.starts_with('$')
    }

    /// Is this a reply inbox (`_INBOX.<owner>.…`)? Only patterns that name the owner
    /// token literally match these: no wildcard stands for `_INBOX` or the owner.
    pub fn is_inbox(&self) -> bool {
        crate::inbox_rest(&self.native).is_some()
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.native)
    }
}

impl fmt::Debug for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Subject({:?})", &*self.native)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        match Subject::parse_native(s) {
            Ok(ok) => panic!("{s:?} parsed as {ok:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn native_valid() {
        for s in [
            "a", "a.b.c", "$SYS.x", "a*b.c>d", "50%off", "%.%", "%2A.%3E", "%25.x",
        ] {
            assert!(Subject::parse_native(s).is_ok(), "{s}");
        }
    }

    #[test]
    fn native_invalid_messages() {
        assert_eq!(err(""), "empty subject: a subject needs at least one token");
        assert!(err("a..b").starts_with("empty token in subject `a..b`"));
        assert!(err(".a").starts_with("empty token"));
        assert!(err("a.").starts_with("empty token"));
        assert!(err("a.*").starts_with("wildcard `*` in subject `a.*`"));
        assert!(err("a.>").contains("`%3E`"));
        assert!(err("a b").contains("0x20"));
        assert!(err("a\tb").contains("0x09"));
        assert!(
            err("%41")
                .starts_with("`%41` escapes a character that needs no escape here; write `A`")
        );
        assert!(err("a%00").contains("NUL"));
    }

    #[test]
    fn limits() {
        let l = Limits {
            max_len: 5,
            max_tokens: 2,
        };
        assert!(Subject::parse_native_with("a.b", &l).is_ok());
        assert!(matches!(
            Subject::parse_native_with("a.b.c", &l),
            Err(SubjectError::TooManyTokens { count: 3, .. })
        ));
        assert!(matches!(
            Subject::parse_native_with("abcdef", &l),
            Err(SubjectError::TooLong { len: 6, .. })
        ));
        let long = "a/".repeat(40_000);
        assert!(matches!(
            Subject::parse_mqtt_with(
                &long,
                &Limits {
                    max_len: 1 << 20,
                    max_tokens: 1 << 20
                }
            ),
            Err(SubjectError::TooLong {
                max: MQTT_MAX_LEN,
                ..
            })
        ));
    }

    #[test]
    fn mqtt_roundtrips() {
        for (topic, native) in [
            ("/finance", "%.finance"),
            ("a//b", "a.%.b"),
            ("a.b/c d", "a%2Eb.c%20d"),
            ("*/>", "%2A.%3E"),
            ("%2F", "/"),
            ("$SYS/x", "$SYS.x"),
            ("%", "%25"),
            ("/", "%.%"),
        ] {
            let s = Subject::parse_mqtt(topic).unwrap_or_else(|e| panic!("{topic}: {e}"));
            assert_eq!(s.as_str(), native, "{topic}");
            assert_eq!(s.to_mqtt(), topic);
        }
        assert_eq!(
            Subject::parse_native("a/b").map(|s| s.to_mqtt()),
            Ok("a%2Fb".into())
        );
        assert!(Subject::parse_mqtt("a/+").is_err());
        assert!(Subject::parse_mqtt("#").is_err());
        assert!(Subject::parse_mqtt("a\0").is_err());
        assert!(Subject::parse_mqtt("%2E").is_err());
        assert!(Subject::parse_mqtt("").is_err());
    }

    #[test]
    fn system() {
        assert!(Subject::parse_native("$SYS.x").is_ok_and(|s| s.is_system()));
        assert!(Subject::parse_native("a.$SYS").is_ok_and(|s| !s.is_system()));
        assert_eq!(
            Subject::parse_native("a.b").map(|s| s.tokens().map(str::to_owned).collect::<Vec<_>>()),
            Ok(vec!["a".to_owned(), "b".to_owned()])
        );
    }
}
