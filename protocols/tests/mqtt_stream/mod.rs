//! Feeds bytes to an MQTT [`Decoder`] in chunks and collects what comes out, for the MQTT
//! integration tests (the native protocol's `common` module is typed for its own decoders).
//!
//! Must never: hide a decoder error, or let a buffer grow past the decoder's packet size
//! limit without failing the test.

#![allow(dead_code)]

use bytes::BytesMut;
use canopy_protocols::mqtt::{DecodeError, Decoder, Packet, encode, encoded_len};

/// Everything a decoder produced from one input: packets, then at most one error, and how
/// many bytes were left undecoded at the end.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub packets: Vec<Packet>,
    pub error: Option<DecodeError>,
    pub left: usize,
}

/// The most a decoder may leave buffered while it waits: a fixed header still short of its
/// remaining length (at most 4 bytes), or a body short of a packet within the size limit.
pub fn bound(decoder: &Decoder) -> usize {
    decoder.max_packet_size().max(4)
}

/// Feeds `input` to a copy of `decoder` in chunks of the given sizes (the last chunk takes
/// the rest), draining every complete packet after each chunk, and checks the buffer bound
/// whenever the decoder waits.
pub fn run(decoder: &Decoder, input: &[u8], chunks: &mut dyn Iterator<Item = usize>) -> Outcome {
    let mut decoder = decoder.clone();
    let bound = bound(&decoder);
    let mut buf = BytesMut::new();
    let mut packets = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let n = chunks.next().unwrap_or(rest.len()).clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        buf.extend_from_slice(chunk);
        loop {
            let before = buf.len();
            match decoder.decode(&mut buf) {
                Ok(Some(packet)) => packets.push(packet),
                Ok(None) => {
                    assert_eq!(buf.len(), before, "Ok(None) consumed bytes");
                    break;
                }
                Err(error) => {
                    return Outcome {
                        packets,
                        error: Some(error),
                        left: 0,
                    };
                }
            }
        }
        assert!(
            buf.len() <= bound,
            "decoder left {} bytes buffered, bound {bound}",
            buf.len()
        );
    }
    Outcome {
        packets,
        error: None,
        left: buf.len(),
    }
}

/// The whole input in one piece.
pub fn whole(decoder: &Decoder, input: &[u8]) -> Outcome {
    run(decoder, input, &mut std::iter::empty())
}

/// One byte at a time.
pub fn bytewise(decoder: &Decoder, input: &[u8]) -> Outcome {
    run(decoder, input, &mut std::iter::repeat(1))
}

/// Splits `input` at every position (two chunks), and byte by byte, and checks each outcome
/// matches `expected`.
pub fn assert_every_split(decoder: &Decoder, input: &[u8], expected: &Outcome) {
    for i in 1..input.len() {
        let got = run(decoder, input, &mut [i].into_iter());
        assert_eq!(&got, expected, "split at {i} of {input:02x?}");
    }
    assert_eq!(&bytewise(decoder, input), expected, "bytewise {input:02x?}");
}

/// Every packet `decoder` produced in `outcome` (from the start of a stream) encodes again at
/// its level, to exactly `encoded_len` bytes, which decode to the same packet: what the
/// decoder accepts, the encoder can write.
pub fn assert_reencodes(decoder: &Decoder, outcome: &Outcome) {
    let mut level = decoder.level();
    for packet in &outcome.packets {
        if let Packet::Connect(c) = packet {
            level = Some(c.level);
        }
        let level = level.expect("a level once a packet is decoded");
        let mut out = BytesMut::new();
        encode(packet, level, &mut out).unwrap_or_else(|e| panic!("{e}: {packet:?}"));
        assert_eq!(out.len(), encoded_len(packet, level), "{packet:?}");
        let mut fresh = match packet {
            Packet::Connect(_) => Decoder::new(usize::MAX),
            _ => Decoder::with_level(level, usize::MAX),
        };
        assert_eq!(
            fresh.decode(&mut out),
            Ok(Some(packet.clone())),
            "{level:?}"
        );
        assert!(out.is_empty());
    }
}
