//! The one reversible escaping rule between a raw token and its two renderings.
//!
//! Owns the codec of single tokens: native (NATS, tokens joined by `.`) and MQTT (levels
//! joined by `/`), and the per-token validity checks. Must never allocate while validating,
//! never accept a rendering that does not re-encode to itself, and never know about limits,
//! whole subjects or wildcards beyond the single token it is given.
//!
//! The rule, with `%` and two uppercase hex digits as the escape:
//!
//! | raw token                          | native       | MQTT        |
//! |------------------------------------|--------------|-------------|
//! | empty                              | `%`          | empty level |
//! | exactly `*` / exactly `>`          | `%2A`/`%3E`  | unchanged   |
//! | exactly `%`                        | `%25`        | `%`         |
//! | `.`, bytes 0x01-0x20, 0x7F         | `%XX`        | unchanged   |
//! | `/`, `+`, `#`                      | unchanged    | `%XX`       |
//! | `%` followed by two of `[0-9A-F]`  | `%25`        | `%25`       |
//! | anything else (`a*b`, `50%off`)    | unchanged    | unchanged   |
//!
//! A raw token never holds NUL. Decoding turns `%XX` into its byte (and the lone native `%`
//! into the empty token); everything else is literal. A rendering is valid only if decoding
//! and encoding it again gives it back unchanged, so `%41` (for `A`) is refused.

/// Why one token is not a valid rendering. The caller adds the subject for the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenError {
    /// Empty native token.
    Empty,
    /// Native token that is exactly `*` or `>`.
    Wildcard(u8),
    /// Native whitespace or control byte.
    NeedsEscape(u8),
    /// `%XX` at this byte offset escapes something that needs no escape.
    NonCanonical(usize),
    /// `%00`.
    EscapedNul,
    /// MQTT NUL.
    Nul,
    /// MQTT `+` or `#` in a topic level.
    WildcardChar(u8),
}

/// Is `b` an uppercase hex digit, the only digits an escape may use?
#[inline]
pub(crate) fn is_uhex(b: u8) -> bool {
    b.is_ascii_digit() || (b'A'..=b'F').contains(&b)
}

#[inline]
fn hex_val(b: u8) -> u8 {
    if b.is_ascii_digit() {
        b - b'0'
    } else {
        b - b'A' + 10
    }
}

/// The byte escaped at `t[i..i + 3]` if that is `%XX`.
#[inline]
fn escape_at(t: &[u8], i: usize) -> Option<u8> {
    match t.get(i..i + 3) {
        Some([b'%', h, l]) if is_uhex(*h) && is_uhex(*l) => Some(hex_val(*h) << 4 | hex_val(*l)),
        _ => None,
    }
}

/// Are `t[i]` and `t[i + 1]` both uppercase hex digits?
#[inline]
fn hex_pair_at(t: &[u8], i: usize) -> bool {
    matches!(t.get(i..i + 2), Some([h, l]) if is_uhex(*h) && is_uhex(*l))
}

#[inline]
fn native_escapes(b: u8) -> bool {
    b == b'.' || b <= 0x20 || b == 0x7F
}

#[inline]
fn mqtt_escapes(b: u8) -> bool {
    matches!(b, b'/' | b'+' | b'#' | 0)
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_escape(out: &mut String, b: u8) {
    out.push('%');
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 0xF)]));
}

/// Appends the escaped form of `raw`, escaping the bytes `escapes` selects and any `%` that
/// precedes two uppercase hex digits.
fn encode_with(raw: &str, out: &mut String, escapes: fn(u8) -> bool) {
    let b = raw.as_bytes();
    let mut start = 0;
    for (i, &c) in b.iter().enumerate() {
        let esc = escapes(c) || (c == b'%' && hex_pair_at(b, i + 1));
        if esc {
            // Every escaped byte is ASCII, so `i` and `i + 1` are char boundaries.
            out.push_str(&raw[start..i]);
            push_escape(out, c);
            start = i + 1;
        }
    }
    out.push_str(&raw[start..]);
}

/// Appends the native rendering of the raw token `raw`.
pub(crate) fn encode_native(raw: &str, out: &mut String) {
    match raw {
        "" => out.push('%'),
        "*" => out.push_str("%2A"),
        ">" => out.push_str("%3E"),
        "%" => out.push_str("%25"),
        _ => encode_with(raw, out, native_escapes),
    }
}

/// Appends the MQTT rendering of the raw token `raw`.
pub(crate) fn encode_mqtt(raw: &str, out: &mut String) {
    encode_with(raw, out, mqtt_escapes);
}

/// Appends the raw token that the (valid) rendering `token` stands for.
pub(crate) fn decode(token: &str, native: bool, out: &mut String) {
    if native && token == "%" {
        return;
    }
    let b = token.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        match escape_at(b, i) {
            Some(v) if v < 0x80 => {
                out.push_str(&token[start..i]);
                out.push(char::from(v));
                i += 3;
                start = i;
            }
            _ => i += 1,
        }
    }
    out.push_str(&token[start..]);
}

/// Checks one native token of a subject or pattern literal. `*` and `>` as whole tokens are
/// reported as [`TokenError::Wildcard`]; a pattern parser handles them before calling this.
pub(crate) fn check_native(t: &str) -> Result<(), TokenError> {
    let b = t.as_bytes();
    match b {
        [] => return Err(TokenError::Empty),
        [b'%'] => return Ok(()),
        [w @ (b'*' | b'>')] => return Err(TokenError::Wildcard(*w)),
        _ => {}
    }
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == 0 {
            return Err(TokenError::Nul);
        }
        if c <= 0x20 || c == 0x7F {
            return Err(TokenError::NeedsEscape(c));
        }
        if c == b'%'
            && let Some(v) = escape_at(b, i)
        {
            let canonical = match v {
                0 => return Err(TokenError::EscapedNul),
                b'.' | 0x01..=0x20 | 0x7F => true,
                b'%' => b.len() == 3 || hex_pair_at(b, i + 3),
                b'*' | b'>' => b.len() == 3,
                _ => false,
            };
            if !canonical {
                return Err(TokenError::NonCanonical(i));
            }
            i += 3;
            continue;
        }
        i += 1;
    }
    Ok(())
}

/// Checks one level of an MQTT topic name, or a literal level of a filter (where the caller
/// has already taken whole-level `+` and `#`).
pub(crate) fn check_mqtt(t: &str) -> Result<(), TokenError> {
    let b = t.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            0 => return Err(TokenError::Nul),
            b'+' | b'#' => return Err(TokenError::WildcardChar(c)),
            b'%' => {
                if let Some(v) = escape_at(b, i) {
                    let canonical = match v {
                        0 => return Err(TokenError::EscapedNul),
                        b'/' | b'+' | b'#' => true,
                        b'%' => hex_pair_at(b, i + 3),
                        _ => false,
                    };
                    if !canonical {
                        return Err(TokenError::NonCanonical(i));
                    }
                    i += 3;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// What to write instead of the non-canonical escape at `t[at..at + 3]`.
pub(crate) fn plain_for(t: &str, at: usize) -> (String, String) {
    let escape = t.get(at..at + 3).unwrap_or("%").to_owned();
    let plain = match escape_at(t.as_bytes(), at) {
        Some(v) if v < 0x80 => char::from(v).to_string(),
        _ => "the character itself, UTF-8 encoded".to_owned(),
    };
    (escape, plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(raw: &str) -> String {
        let mut s = String::new();
        encode_native(raw, &mut s);
        s
    }

    fn mqtt(raw: &str) -> String {
        let mut s = String::new();
        encode_mqtt(raw, &mut s);
        s
    }

    fn raw(t: &str, native: bool) -> String {
        let mut s = String::new();
        decode(t, native, &mut s);
        s
    }

    #[test]
    fn native_escapes_table() {
        assert_eq!(native(""), "%");
        assert_eq!(native("*"), "%2A");
        assert_eq!(native(">"), "%3E");
        assert_eq!(native("%"), "%25");
        assert_eq!(native("a*b"), "a*b");
        assert_eq!(native("a.b"), "a%2Eb");
        assert_eq!(native("a b"), "a%20b");
        assert_eq!(native("50%off"), "50%off");
        assert_eq!(native("%41"), "%2541");
        assert_eq!(native("%4"), "%4");
        assert_eq!(native("a/b+c#"), "a/b+c#");
        assert_eq!(native("é.x"), "é%2Ex");
    }

    #[test]
    fn mqtt_escapes_table() {
        assert_eq!(mqtt(""), "");
        assert_eq!(mqtt("a/b"), "a%2Fb");
        assert_eq!(mqtt("+"), "%2B");
        assert_eq!(mqtt("#"), "%23");
        assert_eq!(mqtt("%"), "%");
        assert_eq!(mqtt("%2F"), "%252F");
        assert_eq!(mqtt("a.b *>"), "a.b *>");
    }

    #[test]
    fn decode_inverts_encode() {
        for r in [
            "", "*", ">", "%", "%%41", "a.b", "50%off", "%2525", "x y/z+#", "é",
        ] {
            assert_eq!(raw(&native(r), true), r, "native {r:?}");
            assert_eq!(raw(&mqtt(r), false), r, "mqtt {r:?}");
            assert_eq!(check_native(&native(r)), Ok(()), "native {r:?}");
            assert_eq!(check_mqtt(&mqtt(r)), Ok(()), "mqtt {r:?}");
        }
    }

    #[test]
    fn non_canonical_refused() {
        assert_eq!(check_native("%41"), Err(TokenError::NonCanonical(0)));
        assert_eq!(check_native("a%2A"), Err(TokenError::NonCanonical(1)));
        assert_eq!(check_native("a%25"), Err(TokenError::NonCanonical(1)));
        assert_eq!(check_native("%2F"), Err(TokenError::NonCanonical(0)));
        assert_eq!(check_native("%C3"), Err(TokenError::NonCanonical(0)));
        assert_eq!(check_native("%00"), Err(TokenError::EscapedNul));
        assert_eq!(check_mqtt("%2E"), Err(TokenError::NonCanonical(0)));
        assert_eq!(check_mqtt("%25"), Err(TokenError::NonCanonical(0)));
        assert_eq!(check_mqtt("a+"), Err(TokenError::WildcardChar(b'+')));
        assert_eq!(check_native("a b"), Err(TokenError::NeedsEscape(b' ')));
        assert_eq!(check_native("%2e"), Ok(()), "lowercase hex is literal");
        assert_eq!(plain_for("x%41", 1), ("%41".to_owned(), "A".to_owned()));
    }
}
