//! MQTT's data representations, both ways: variable byte integers, two-byte lengths,
//! UTF-8 encoded strings and binary data (MQTT 5.0 section 1.5, 3.1.1 section 1.5).
//!
//! Owns: the nom parsers for these over a complete packet body, and their writers.
//!
//! Must never: read past the input it is given (nom's `complete` parsers report a short
//! input as an error), accept a string the specification makes malformed (invalid UTF-8 or
//! U+0000), or allocate more than the bytes present justify.

use bytes::{BufMut, Bytes, BytesMut};
use nom::IResult;
use nom::Parser;
use nom::error::context;
use nom::multi::length_data;
use nom::number::complete::{be_u8, be_u16};

use super::error::Fault;

/// The parse result of body parsers: input is a complete packet body.
pub(crate) type PResult<'a, O> = IResult<&'a [u8], O, Fault>;

/// The largest value a four-byte variable byte integer holds (also the largest remaining
/// length).
pub(crate) const MAX_VARINT: u32 = 268_435_455;

/// The largest string or binary field: its length is a `u16`.
pub(crate) const MAX_STRING: usize = u16::MAX as usize;

/// A remaining length read from the start of a stream, which may not be complete yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderLength {
    /// The bytes end before the last byte of the integer.
    Incomplete,
    /// A fourth byte still has its continuation bit set.
    TooLong,
    Complete {
        value: usize,
        /// Bytes the integer took.
        len: usize,
        /// False when fewer bytes would have held the value (only v5 forbids that).
        minimal: bool,
    },
}

/// Reads a variable byte integer from the front of `bytes` without requiring it complete.
pub(crate) fn header_length(bytes: &[u8]) -> HeaderLength {
    let mut value = 0usize;
    for (i, &byte) in bytes.iter().take(4).enumerate() {
        value |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return HeaderLength::Complete {
                value,
                len: i + 1,
                // A last byte of 0 after others adds nothing: the encoding was padded.
                minimal: i == 0 || byte != 0,
            };
        }
    }
    if bytes.len() >= 4 {
        HeaderLength::TooLong
    } else {
        HeaderLength::Incomplete
    }
}

/// A variable byte integer inside a v5 body (property lengths, subscription identifiers),
/// where a padded encoding is malformed.
pub(crate) fn varint(input: &[u8]) -> PResult<'_, u32> {
    match header_length(input) {
        HeaderLength::Complete {
            value,
            len,
            minimal,
        } => {
            if !minimal {
                return Err(nom::Err::Failure(Fault::malformed(
                    "a variable byte integer is not encoded in the fewest bytes",
                )));
            }
            let rest = input.get(len..).unwrap_or_default();
            // At most 28 bits, so the conversion cannot fail.
            Ok((rest, u32::try_from(value).unwrap_or(MAX_VARINT)))
        }
        HeaderLength::TooLong => Err(nom::Err::Failure(Fault::malformed(
            "a variable byte integer is longer than 4 bytes",
        ))),
        // The body is complete: running out means the packet ends early.
        HeaderLength::Incomplete => Err(nom::Err::Error(nom::error::ParseError::from_error_kind(
            input,
            nom::error::ErrorKind::Eof,
        ))),
    }
}

/// Binary data: a two-byte length and that many bytes.
pub(crate) fn binary(input: &[u8]) -> PResult<'_, &[u8]> {
    length_data(be_u16).parse_complete(input)
}

/// Binary data as a zero-copy slice of `frame`, which `input` must be part of.
pub(crate) fn binary_in<'a>(frame: &Bytes, input: &'a [u8]) -> PResult<'a, Bytes> {
    let (rest, data) = binary(input)?;
    Ok((rest, frame.slice_ref(data)))
}

/// Checks the bytes of an MQTT UTF-8 encoded string: well-formed UTF-8 (which rules out
/// encoded surrogates) and no U+0000 [MQTT-1.5.4-1, -2].
pub(crate) fn check_utf8<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str, Fault> {
    if bytes.contains(&0) {
        return Err(Fault::malformed(format!(
            "the {what} contains the null character U+0000"
        )));
    }
    std::str::from_utf8(bytes)
        .map_err(|_| Fault::malformed(format!("the {what} is not valid UTF-8")))
}

/// A UTF-8 encoded string, borrowed; `what` names it in errors (and nom's context).
pub(crate) fn utf8<'a>(what: &'static str) -> impl Fn(&'a [u8]) -> PResult<'a, &'a str> {
    move |input| {
        let (rest, bytes) = context(what, binary).parse_complete(input)?;
        let s = check_utf8(bytes, what).map_err(nom::Err::Failure)?;
        Ok((rest, s))
    }
}

/// A UTF-8 encoded string, owned.
pub(crate) fn string<'a>(what: &'static str) -> impl Fn(&'a [u8]) -> PResult<'a, String> {
    move |input| utf8(what)(input).map(|(rest, s)| (rest, s.to_owned()))
}

/// A single byte.
pub(crate) fn byte(input: &[u8]) -> PResult<'_, u8> {
    be_u8(input)
}

/// Bytes a variable byte integer takes for `value` (values past [`MAX_VARINT`] count as
/// four; the encoder refuses them before writing).
pub(crate) fn varint_len(value: usize) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Writes a variable byte integer in the fewest bytes. `value` must be at most
/// [`MAX_VARINT`].
pub(crate) fn put_varint(out: &mut BytesMut, value: usize) {
    let mut value = value;
    loop {
        // The mask makes the truncation explicit.
        let mut byte = (value & 0x7f) as u8;
        value >>= 7;
        if value > 0 {
            byte |= 0x80;
        }
        out.put_u8(byte);
        if value == 0 {
            break;
        }
    }
}

/// Writes a two-byte length and `data`. `data` must be at most [`MAX_STRING`] bytes.
pub(crate) fn put_binary(out: &mut BytesMut, data: &[u8]) {
    out.put_u16(u16::try_from(data.len()).unwrap_or(u16::MAX));
    out.put_slice(data);
}

/// Refuses a string or binary field too long for its two-byte length.
pub(crate) fn check_len(
    packet: &'static str,
    field: &'static str,
    len: usize,
) -> Result<(), super::EncodeError> {
    if len > MAX_STRING {
        Err(super::EncodeError::TooLong { packet, field, len })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_boundaries_round_trip() {
        for value in [
            0usize,
            127,
            128,
            16_383,
            16_384,
            2_097_151,
            2_097_152,
            268_435_455,
        ] {
            let mut out = BytesMut::new();
            put_varint(&mut out, value);
            assert_eq!(out.len(), varint_len(value), "{value}");
            assert_eq!(
                header_length(&out),
                HeaderLength::Complete {
                    value,
                    len: out.len(),
                    minimal: true
                }
            );
            assert_eq!(
                varint(&out).map(|(r, v)| (r.len(), v)),
                Ok((0, value as u32))
            );
        }
    }

    #[test]
    fn varint_refuses_five_bytes_and_padding() {
        assert_eq!(
            header_length(&[0xff, 0xff, 0xff, 0xff]),
            HeaderLength::TooLong
        );
        assert_eq!(header_length(&[0xff, 0xff, 0xff]), HeaderLength::Incomplete);
        assert_eq!(header_length(&[]), HeaderLength::Incomplete);
        assert_eq!(
            header_length(&[0x80, 0x00]),
            HeaderLength::Complete {
                value: 0,
                len: 2,
                minimal: false
            }
        );
        assert!(matches!(varint(&[0x80, 0x00]), Err(nom::Err::Failure(_))));
        assert!(matches!(varint(&[0x80]), Err(nom::Err::Error(_))));
    }

    #[test]
    fn strings_refuse_nul_and_bad_utf8() {
        assert_eq!(utf8("s")(b"\x00\x02hi!"), Ok((&b"!"[..], "hi")));
        assert!(utf8("s")(b"\x00\x01\x00").is_err());
        assert!(utf8("s")(b"\x00\x02\xc3\x28").is_err());
        // An encoded surrogate (U+D800) is not UTF-8.
        assert!(utf8("s")(b"\x00\x03\xed\xa0\x80").is_err());
        assert!(utf8("s")(b"\x00\x05hi").is_err());
    }
}
