//! Feeds bytes to a streaming decoder in chunks and collects what comes out, so a test can
//! check that the same frames, error and leftover come out however the bytes are split.
//! Generic over the decoder: [`Decode`] is implemented for the native client and server
//! decoders and the MQTT decoder. Also the MQTT check that every decoded packet encodes
//! back to itself.
//!
//! Shared by the integration tests (as `common::stream`) and the fuzz targets (included by
//! path from `fuzz/fuzz_targets/split.rs`), so it uses nothing but `std`, `bytes` and
//! `canopy_protocols`.
//!
//! Must never: hide a decoder error, let a buffer grow past the decoder's bound without
//! failing, or use randomness (a failure must replay).

use std::fmt::Debug;

use bytes::BytesMut;
use canopy_protocols::mqtt::{self, Packet, encode, encoded_len};
use canopy_protocols::native::{self, ClientOp, Limits, ProtocolError, ServerOp};

/// A streaming decoder, as the drivers below use it.
pub trait Decode: Clone {
    type Frame: Debug + PartialEq;
    type Error: Debug + PartialEq;
    /// The most the decoder may leave buffered while it waits for more bytes.
    fn bound(&self) -> usize;
    /// Decodes one frame from the front of `buf`; `Ok(None)` while more bytes are needed.
    fn step(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Frame>, Self::Error>;
}

/// A control line and a payload at their limits, plus slack for terminators.
fn native_bound(limits: Limits) -> usize {
    limits.max_control_line + limits.max_payload + 64
}

impl Decode for native::ClientDecoder {
    type Frame = ClientOp;
    type Error = ProtocolError;
    fn bound(&self) -> usize {
        native_bound(self.limits())
    }
    fn step(&mut self, buf: &mut BytesMut) -> Result<Option<ClientOp>, ProtocolError> {
        self.decode(buf)
    }
}

impl Decode for native::ServerDecoder {
    type Frame = ServerOp;
    type Error = ProtocolError;
    fn bound(&self) -> usize {
        native_bound(self.limits())
    }
    fn step(&mut self, buf: &mut BytesMut) -> Result<Option<ServerOp>, ProtocolError> {
        self.decode(buf)
    }
}

impl Decode for mqtt::Decoder {
    type Frame = Packet;
    type Error = mqtt::DecodeError;
    /// A fixed header still short of its remaining length (at most 4 bytes), or a body short
    /// of a packet within the size limit.
    fn bound(&self) -> usize {
        self.max_packet_size().max(4)
    }
    /// Also holds the decoder to its promise that `Ok(None)` leaves `buf` untouched.
    fn step(&mut self, buf: &mut BytesMut) -> Result<Option<Packet>, mqtt::DecodeError> {
        let before = buf.len();
        let result = self.decode(buf);
        if let Ok(None) = result {
            assert_eq!(buf.len(), before, "Ok(None) consumed bytes");
        }
        result
    }
}

/// Everything a decoder produced from one input: frames, then at most one error, and how
/// many bytes were left undecoded at the end.
#[derive(Debug, PartialEq)]
pub struct Outcome<F, E> {
    pub frames: Vec<F>,
    pub error: Option<E>,
    pub left: usize,
}

/// The [`Outcome`] of decoder `D`.
pub type OutcomeOf<D> = Outcome<<D as Decode>::Frame, <D as Decode>::Error>;

/// Feeds `input` to a copy of `decoder` in chunks of the given sizes (the last chunk takes
/// the rest), draining every complete frame after each chunk, and checks the buffer bound
/// whenever the decoder waits.
pub fn run<D: Decode>(
    decoder: &D,
    input: &[u8],
    chunks: &mut dyn Iterator<Item = usize>,
) -> OutcomeOf<D> {
    let mut decoder = decoder.clone();
    let bound = decoder.bound();
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let n = chunks.next().unwrap_or(rest.len()).clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        buf.extend_from_slice(chunk);
        loop {
            match decoder.step(&mut buf) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(e) => {
                    return Outcome {
                        frames,
                        error: Some(e),
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
        frames,
        error: None,
        left: buf.len(),
    }
}

/// The whole input in one piece.
pub fn whole<D: Decode>(decoder: &D, input: &[u8]) -> OutcomeOf<D> {
    run(decoder, input, &mut std::iter::empty())
}

/// One byte at a time.
pub fn bytewise<D: Decode>(decoder: &D, input: &[u8]) -> OutcomeOf<D> {
    run(decoder, input, &mut std::iter::repeat(1))
}

/// Splits `input` at every position (two chunks), and byte by byte, and checks each outcome
/// matches `expected`.
pub fn assert_every_split<D: Decode>(decoder: &D, input: &[u8], expected: &OutcomeOf<D>) {
    for i in 1..input.len() {
        let got = run(decoder, input, &mut [i].into_iter());
        assert_eq!(
            &got,
            expected,
            "split at {i} of \"{}\"",
            input.escape_ascii()
        );
    }
    let got = bytewise(decoder, input);
    assert_eq!(&got, expected, "bytewise \"{}\"", input.escape_ascii());
}

/// Every packet `decoder` produced in `outcome` (from the start of a stream) encodes again at
/// its level, to exactly `encoded_len` bytes, which decode to the same packet: what the
/// decoder accepts, the encoder can write.
pub fn assert_reencodes(decoder: &mqtt::Decoder, outcome: &OutcomeOf<mqtt::Decoder>) {
    let mut level = decoder.level();
    for packet in &outcome.frames {
        if let Packet::Connect(c) = packet {
            level = Some(c.level);
        }
        let level = level.expect("a level once a packet is decoded");
        let mut out = BytesMut::new();
        encode(packet, level, &mut out).unwrap_or_else(|e| panic!("{e}: {packet:?}"));
        assert_eq!(out.len(), encoded_len(packet, level), "{packet:?}");
        let mut fresh = match packet {
            Packet::Connect(_) => mqtt::Decoder::new(usize::MAX),
            _ => mqtt::Decoder::with_level(level, usize::MAX),
        };
        assert_eq!(
            fresh.decode(&mut out),
            Ok(Some(packet.clone())),
            "{level:?}"
        );
        assert!(out.is_empty());
    }
}
