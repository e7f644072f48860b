//! The few pieces of JSON text the `/ws` encoders write by hand: strings escaped exactly as
//! serde_json escapes them, and decimal integers.
//!
//! Owns: byte-for-byte agreement with serde_json's output (which today's clients and tests
//! saw), so frames written here equal frames serde_json would have written.
//!
//! Must never: escape differently from serde_json (a unit test compares every ASCII byte and
//! random strings), or panic.

/// `"`, `\` and control characters are escaped; everything else (DEL and non-ASCII included)
/// is written as it is, as serde_json does.
fn escape(byte: u8) -> Option<&'static str> {
    Some(match byte {
        b'"' => "\\\"",
        b'\\' => "\\\\",
        0x08 => "\\b",
        0x0c => "\\f",
        b'\n' => "\\n",
        b'\r' => "\\r",
        b'\t' => "\\t",
        0x00..=0x1f => "",
        _ => return None,
    })
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `text` as a JSON string, quotes included.
pub(crate) fn push_str(out: &mut String, text: &str) {
    out.reserve(text.len() + 2);
    out.push('"');
    let mut start = 0;
    for (i, byte) in text.bytes().enumerate() {
        let Some(escaped) = escape(byte) else {
            continue;
        };
        // Escaped bytes are ASCII, so `start` and `i` are character boundaries.
        out.push_str(text.get(start..i).unwrap_or_default());
        if escaped.is_empty() {
            out.push_str("\\u00");
            for nibble in [byte >> 4, byte & 0xf] {
                out.push(char::from(
                    HEX.get(usize::from(nibble)).copied().unwrap_or(b'0'),
                ));
            }
        } else {
            out.push_str(escaped);
        }
        start = i + 1;
    }
    out.push_str(text.get(start..).unwrap_or_default());
    out.push('"');
}

/// Appends `n` in decimal.
pub(crate) fn push_u64(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        if let Some(d) = digits.get_mut(i) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    for d in digits.get(i..).unwrap_or_default() {
        out.push(char::from(*d));
    }
}

/// Appends `,"key":` (`key` is one of the encoders' own names: nothing to escape).
pub(crate) fn push_key(out: &mut String, key: &str) {
    out.push_str(",\"");
    out.push_str(key);
    out.push_str("\":");
}

/// Appends `true` or `false`.
pub(crate) fn push_bool(out: &mut String, value: bool) {
    out.push_str(if value { "true" } else { "false" });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn escaped(text: &str) -> String {
        let mut out = String::new();
        push_str(&mut out, text);
        out
    }

    #[test]
    fn every_ascii_byte_is_escaped_as_serde_json_does() {
        for byte in 0u8..=0x7f {
            let text = format!("a{}b", char::from(byte));
            assert_eq!(
                escaped(&text),
                serde_json::to_string(&text).unwrap(),
                "{byte:#x}"
            );
        }
        assert_eq!(escaped(""), "\"\"");
        assert_eq!(escaped("\u{1}"), "\"\\u0001\"");
        assert_eq!(escaped("\u{1f}"), "\"\\u001f\"");
    }

    #[test]
    fn decimals() {
        for n in [0, 1, 9, 10, 99, 100, 4_294_967_295, u64::MAX] {
            let mut out = String::new();
            push_u64(&mut out, n);
            assert_eq!(out, n.to_string());
        }
    }

    proptest! {
        #[test]
        fn any_string_is_escaped_as_serde_json_does(text in any::<String>()) {
            prop_assert_eq!(escaped(&text), serde_json::to_string(&text).unwrap());
        }

        #[test]
        fn any_number_is_written_as_display_does(n in any::<u64>()) {
            let mut out = String::new();
            push_u64(&mut out, n);
            prop_assert_eq!(out, n.to_string());
        }
    }
}
