//! Patterns: subjects that may hold wildcards, in the native and the MQTT syntax.
//!
//! Owns [`Pattern`] and [`PatternToken`], their parsers and renderings, and
//! [`Pattern::matches`], the naive reference semantics that the trie is tested against.
//! Must never be used for routing on the hot path (that is [`crate::Trie`]'s job) and never
//! let a leading wildcard match a `$`-subject.
//!
//! Wildcards: native `*` and MQTT `+` are [`PatternToken::One`]; native `>` (last token only)
//! is [`PatternToken::OneOrMore`]; MQTT `#` (last level only) is [`PatternToken::ZeroOrMore`],
//! so `a/#` matches `a` and `a/b/c`. An MQTT filter ending in `+/#` means exactly "one or
//! more", so it is stored as [`PatternToken::OneOrMore`] and rendered back as `+/#`.

use std::fmt;

use crate::error::{SubjectError, shown};
use crate::escape;
use crate::subject::{
    Limits, MQTT_MAX_LEN, Subject, check_len, check_tokens, push_mqtt_level_as_native,
    push_native_token_as_mqtt, token_error,
};

/// One token of a [`Pattern`].
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum PatternToken {
    /// A literal token, in its native rendering.
    Literal(Box<str>),
    /// Exactly one token: native `*`, MQTT `+`.
    One,
    /// One or more tokens, always last: native `>`, MQTT `+/#`.
    OneOrMore,
    /// Zero or more tokens, always last: MQTT `#` (no native equivalent).
    ZeroOrMore,
}

impl PatternToken {
    /// Is this a wildcard (anything but a literal)?
    pub fn is_wildcard(&self) -> bool {
        !matches!(self, PatternToken::Literal(_))
    }
}

/// A subject pattern: a non-empty sequence of literal and wildcard tokens, where
/// [`PatternToken::OneOrMore`] and [`PatternToken::ZeroOrMore`] can only come last.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Pattern {
    tokens: Box<[PatternToken]>,
}

impl Pattern {
    /// Parses a native pattern (`a.*.>`) within the default [`Limits`].
    pub fn parse_native(s: &str) -> Result<Pattern, SubjectError> {
        Self::parse_native_with(s, &Limits::default())
    }

    /// Parses a native pattern within `limits`: a whole token `*` is [`PatternToken::One`],
    /// a whole last token `>` is [`PatternToken::OneOrMore`]; `a*b` is a literal.
    pub fn parse_native_with(s: &str, limits: &Limits) -> Result<Pattern, SubjectError> {
        check_len(s, limits, usize::MAX)?;
        if s == "%" {
            return Err(SubjectError::LoneEmptyToken);
        }
        let count = s.split('.').count();
        check_tokens(s, count, limits)?;
        let mut tokens = Vec::with_capacity(count);
        for (i, token) in s.split('.').enumerate() {
            tokens.push(match token {
                "*" => PatternToken::One,
                ">" if i + 1 == count => PatternToken::OneOrMore,
                ">" => {
                    return Err(SubjectError::MisplacedOneOrMore { pattern: shown(s) });
                }
                _ => {
                    escape::check_native(token).map_err(|e| token_error(s, token, e))?;
                    PatternToken::Literal(token.into())
                }
            });
        }
        Ok(Pattern {
            tokens: tokens.into_boxed_slice(),
        })
    }

    /// Parses an MQTT topic filter (`a/+/#`) within the default [`Limits`].
    pub fn parse_mqtt(filter: &str) -> Result<Pattern, SubjectError> {
        Self::parse_mqtt_with(filter, &Limits::default())
    }

    /// Parses an MQTT topic filter within `limits` (which bound the filter and its native
    /// rendering). `+` is [`PatternToken::One`], a last-level `#` is
    /// [`PatternToken::ZeroOrMore`], a trailing `+/#` is [`PatternToken::OneOrMore`]; a `+`
    /// or `#` sharing a level with other characters is an error, as MQTT requires.
    /// `$share/...` prefixes are the server's business, not this parser's.
    pub fn parse_mqtt_with(filter: &str, limits: &Limits) -> Result<Pattern, SubjectError> {
        check_len(filter, limits, MQTT_MAX_LEN)?;
        let count = filter.split('/').count();
        check_tokens(filter, count, limits)?;
        let mut tokens = Vec::with_capacity(count);
        let mut raw = String::new();
        let mut native_len = count - 1;
        for (i, level) in filter.split('/').enumerate() {
            tokens.push(match level {
                "+" => PatternToken::One,
                "#" if i + 1 == count => PatternToken::ZeroOrMore,
                "#" => {
                    return Err(SubjectError::MisplacedZeroOrMore {
                        pattern: shown(filter),
                    });
                }
                _ => {
                    if let Some(w) = level.bytes().find(|b| matches!(b, b'+' | b'#')) {
                        return Err(SubjectError::PartialWildcard {
                            pattern: shown(filter),
                            wildcard: char::from(w),
                        });
                    }
                    escape::check_mqtt(level).map_err(|e| token_error(filter, level, e))?;
                    let mut native = String::with_capacity(level.len() + 2);
                    push_mqtt_level_as_native(level, &mut raw, &mut native);
                    PatternToken::Literal(native.into_boxed_str())
                }
            });
            native_len += match tokens.last() {
                Some(PatternToken::Literal(l)) => l.len(),
                _ => 1,
            };
        }
        if native_len > limits.max_len {
            return Err(SubjectError::TooLong {
                subject: shown(filter),
                len: native_len,
                max: limits.max_len,
            });
        }
        if let [.., PatternToken::One, PatternToken::ZeroOrMore] = tokens[..] {
            tokens.pop();
            tokens.pop();
            tokens.push(PatternToken::OneOrMore);
        }
        Ok(Pattern {
            tokens: tokens.into_boxed_slice(),
        })
    }

    /// The tokens, literals in their native rendering.
    pub fn tokens(&self) -> &[PatternToken] {
        &self.tokens
    }

    /// Does this pattern hold no wildcard (so it matches exactly one subject)?
    pub fn is_literal(&self) -> bool {
        self.tokens.iter().all(|t| !t.is_wildcard())
    }

    /// Does this pattern match `subject`? The naive reference semantics: a pattern whose
    /// first token is a wildcard never matches a `$`-subject.
    pub fn matches(&self, subject: &Subject) -> bool {
        if subject.is_system() && self.tokens.first().is_some_and(PatternToken::is_wildcard) {
            return false;
        }
        if subject.is_inbox() && self.tokens.iter().take(2).any(PatternToken::is_wildcard) {
            return false;
        }
        let tokens: Vec<&str> = subject.tokens().collect();
        match_tokens(&self.tokens, &tokens)
    }

    /// The native rendering (`a.*.>`), or `None` when the pattern holds
    /// [`PatternToken::ZeroOrMore`], which the native syntax cannot say.
    pub fn to_native(&self) -> Option<String> {
        if self.tokens.contains(&PatternToken::ZeroOrMore) {
            return None;
        }
        Some(self.to_string())
    }

    /// The MQTT rendering (`a/+/#`); [`PatternToken::OneOrMore`] renders as `+/#`.
    pub fn to_mqtt(&self) -> String {
        let mut out = String::new();
        let mut raw = String::new();
        for (i, token) in self.tokens.iter().enumerate() {
            if i > 0 {
                out.push('/');
            }
            match token {
                PatternToken::Literal(l) => push_native_token_as_mqtt(l, &mut raw, &mut out),
                PatternToken::One => out.push('+'),
                PatternToken::OneOrMore => out.push_str("+/#"),
                PatternToken::ZeroOrMore => out.push('#'),
            }
        }
        out
    }
}

impl From<&Subject> for Pattern {
    /// The literal pattern that matches exactly `subject`.
    fn from(subject: &Subject) -> Self {
        Pattern {
            tokens: subject
                .tokens()
                .map(|t| PatternToken::Literal(t.into()))
                .collect(),
        }
    }
}

fn match_tokens(pattern: &[PatternToken], subject: &[&str]) -> bool {
    match (pattern.split_first(), subject.split_first()) {
        (None, None) => true,
        (Some((PatternToken::ZeroOrMore, _)), _) => true,
        (Some((PatternToken::OneOrMore, _)), Some(_)) => true,
        (Some((PatternToken::One, p)), Some((_, s))) => match_tokens(p, s),
        (Some((PatternToken::Literal(l), p)), Some((t, s))) => **l == **t && match_tokens(p, s),
        _ => false,
    }
}

impl fmt::Display for Pattern {
    /// The native rendering; [`PatternToken::ZeroOrMore`] is shown as a `#` token (which the
    /// native syntax would read as a literal `#`, so this form is for people, not parsers).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, token) in self.tokens.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            f.write_str(match token {
                PatternToken::Literal(l) => l,
                PatternToken::One => "*",
                PatternToken::OneOrMore => ">",
                PatternToken::ZeroOrMore => "#",
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(p: &str) -> Pattern {
        Pattern::parse_native(p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    fn mqtt(p: &str) -> Pattern {
        Pattern::parse_mqtt(p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    fn subj(s: &str) -> Subject {
        Subject::parse_native(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn topic(s: &str) -> Subject {
        Subject::parse_mqtt(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn nats_semantics() {
        assert!(!native("foo.>").matches(&subj("foo")));
        assert!(native("foo.>").matches(&subj("foo.bar")));
        assert!(native("foo.>").matches(&subj("foo.bar.baz")));
        assert!(native("foo.*").matches(&subj("foo.bar")));
        assert!(!native("foo.*").matches(&subj("foo.bar.baz")));
        assert!(!native("foo.*").matches(&subj("foo")));
        assert!(native("*").matches(&subj("foo")));
        assert!(!native("*").matches(&subj("foo.bar")));
        assert!(native(">").matches(&subj("a.b")));
        assert!(native("a*b").is_literal());
        assert!(!native("a*b").matches(&subj("axb")));
        assert!(native("a*b").matches(&subj("a*b")));
        assert!(matches!(
            Pattern::parse_native("a.>.b"),
            Err(SubjectError::MisplacedOneOrMore { .. })
        ));
        assert!(Pattern::parse_native("a..b").is_err());
        assert!(Pattern::parse_native("").is_err());
    }

    #[test]
    fn mqtt_semantics() {
        assert!(mqtt("sport/#").matches(&topic("sport")));
        assert!(mqtt("sport/#").matches(&topic("sport/tennis/player1")));
        assert!(mqtt("sport/+").matches(&topic("sport/")));
        assert!(!mqtt("sport/+").matches(&topic("sport")));
        assert!(mqtt("+/+").matches(&topic("/finance")));
        assert!(mqtt("/+").matches(&topic("/finance")));
        assert!(!mqtt("+").matches(&topic("/finance")));
        assert!(mqtt("#").matches(&topic("a/b")));
        assert!(!mqtt("#").matches(&topic("$SYS/x")));
        assert!(!mqtt("+/x").matches(&topic("$SYS/x")));
        assert!(mqtt("$SYS/#").matches(&topic("$SYS/x")));
        assert!(mqtt("$SYS/#").matches(&topic("$SYS")));
        assert!(!native(">").matches(&subj("$SYS.x")));
        assert!(!native("*.x").matches(&subj("$SYS.x")));
        assert!(native("$SYS.>").matches(&subj("$SYS.x")));
        for bad in ["a+/b", "a/#/b", "#a", "a/b#", ""] {
            assert!(Pattern::parse_mqtt(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn renderings() {
        assert_eq!(mqtt("a/#").to_native(), None);
        assert_eq!(mqtt("a/#").to_string(), "a.#");
        assert_eq!(
            mqtt("a/+/#").tokens().last(),
            Some(&PatternToken::OneOrMore)
        );
        assert_eq!(mqtt("a/+/#").to_native().as_deref(), Some("a.>"));
        assert_eq!(native("a.>").to_mqtt(), "a/+/#");
        assert_eq!(native("a.*.c").to_mqtt(), "a/+/c");
        assert_eq!(native(">").to_mqtt(), "+/#");
        assert_eq!(mqtt("+/#"), native(">"));
        assert_eq!(mqtt("a.b/%23").to_string(), "a%2Eb.#");
        assert_eq!(mqtt("a.b/%23").to_mqtt(), "a.b/%23");
        assert_eq!(native("a/b.%2A").to_mqtt(), "a%2Fb/*");
        assert_eq!(Pattern::from(&subj("a.b")), native("a.b"));
    }
}
