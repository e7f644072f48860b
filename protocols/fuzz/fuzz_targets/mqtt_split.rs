//! Shared by the MQTT fuzz targets: decodes one input whole and in chunks whose sizes come
//! from the input, and checks both give the same packets, error and leftover; that a decoder
//! never leaves more than its packet size limit buffered; and that every decoded packet
//! encodes back (to `encoded_len` bytes) into bytes that decode to the same packet.
//!
//! Must never: use randomness that is not derived from the input (a crash must replay).

use bytes::BytesMut;
use canopy_protocols::mqtt::{DecodeError, Decoder, Packet, encode, encoded_len};

/// Small, so the fuzzer reaches the packet size limit quickly.
pub const MAX_PACKET: usize = 512;

#[derive(Debug, PartialEq)]
pub struct Outcome {
    packets: Vec<Packet>,
    error: Option<DecodeError>,
    left: usize,
}

/// Feeds `input` in chunks of `sizes` (cycled) to a copy of `decoder`.
pub fn run(decoder: &Decoder, input: &[u8], sizes: &[usize]) -> Outcome {
    let mut decoder = decoder.clone();
    let bound = MAX_PACKET.max(4);
    let mut buf = BytesMut::new();
    let mut packets = Vec::new();
    let mut rest = input;
    let mut sizes = sizes.iter().copied().cycle();
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).clamp(1, rest.len());
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
        assert!(buf.len() <= bound, "{} bytes buffered", buf.len());
    }
    Outcome {
        packets,
        error: None,
        left: buf.len(),
    }
}

/// Chunk sizes derived from the input (xorshift seeded by its length and last byte).
pub fn sizes(data: &[u8]) -> Vec<usize> {
    let mut x = (data.len() as u64) << 8 | u64::from(data.last().copied().unwrap_or(0)) | 1;
    let max = [1usize, 3, 16, 64][usize::from(data.first().copied().unwrap_or(0) & 3)];
    (0..64)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x % max as u64) as usize
        })
        .collect()
}

/// Every decoded packet encodes again at its level and decodes back to itself.
fn reencode(decoder: &Decoder, outcome: &Outcome) {
    let mut level = decoder.level();
    for packet in &outcome.packets {
        if let Packet::Connect(c) = packet {
            level = Some(c.level);
        }
        let level = level.expect("a level once a packet is decoded");
        let mut out = BytesMut::new();
        encode(packet, level, &mut out).unwrap_or_else(|e| panic!("{e}: {packet:?}"));
        assert_eq!(out.len(), encoded_len(packet, level));
        let mut fresh = match packet {
            Packet::Connect(_) => Decoder::new(usize::MAX),
            _ => Decoder::with_level(level, usize::MAX),
        };
        assert_eq!(fresh.decode(&mut out), Ok(Some(packet.clone())));
        assert!(out.is_empty());
    }
}

/// The whole check for one decoder and one input.
pub fn check(decoder: &Decoder, data: &[u8]) {
    let expected = run(decoder, data, &[usize::MAX]);
    let got = run(decoder, data, &sizes(data));
    assert_eq!(expected, got);
    reencode(decoder, &expected);
}
