//! Test drivers shared by the integration tests: feed bytes to a decoder in chunks and collect
//! what comes out.
//!
//! Must never: hide a decoder error or a buffer that grew past its bound.

#![allow(dead_code)]

use bytes::BytesMut;
use canopy_protocols::native::{
    ClientDecoder, ClientOp, Limits, ProtocolError, ServerDecoder, ServerOp,
};

/// A decoder of either direction.
pub trait Decode {
    type Op: std::fmt::Debug + PartialEq;
    fn with_limits(limits: Limits) -> Self;
    fn step(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Op>, ProtocolError>;
}

impl Decode for ClientDecoder {
    type Op = ClientOp;
    fn with_limits(limits: Limits) -> Self {
        ClientDecoder::new(limits)
    }
    fn step(&mut self, buf: &mut BytesMut) -> Result<Option<ClientOp>, ProtocolError> {
        self.decode(buf)
    }
}

impl Decode for ServerDecoder {
    type Op = ServerOp;
    fn with_limits(limits: Limits) -> Self {
        ServerDecoder::new(limits)
    }
    fn step(&mut self, buf: &mut BytesMut) -> Result<Option<ServerOp>, ProtocolError> {
        self.decode(buf)
    }
}

/// Everything a decoder produced from one input: frames, then at most one error, and how
/// many bytes were left undecoded at the end.
#[derive(Debug, PartialEq)]
pub struct Outcome<Op> {
    pub frames: Vec<Op>,
    pub error: Option<ProtocolError>,
    pub left: usize,
}

/// Feeds `input` in chunks of the given sizes (the last chunk takes the rest), draining every
/// complete frame after each chunk, and checks the buffer bound whenever the decoder waits.
pub fn run<D: Decode>(
    limits: Limits,
    input: &[u8],
    chunks: &mut dyn Iterator<Item = usize>,
) -> Outcome<D::Op> {
    let bound = limits.max_control_line + limits.max_payload + 64;
    let mut decoder = D::with_limits(limits);
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
                Ok(Some(op)) => frames.push(op),
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
pub fn whole<D: Decode>(limits: Limits, input: &[u8]) -> Outcome<D::Op> {
    run::<D>(limits, input, &mut std::iter::empty())
}

/// One byte at a time.
pub fn bytewise<D: Decode>(limits: Limits, input: &[u8]) -> Outcome<D::Op> {
    run::<D>(limits, input, &mut std::iter::repeat(1))
}

/// Splits `input` at every position `i` (two chunks) and checks the outcome matches `expected`.
pub fn assert_every_split<D: Decode>(limits: Limits, input: &[u8], expected: &Outcome<D::Op>) {
    for i in 1..input.len() {
        let got = run::<D>(limits, input, &mut [i].into_iter());
        assert_eq!(
            &got,
            expected,
            "split at {i} of {:?}",
            String::from_utf8_lossy(input)
        );
    }
    assert_eq!(&bytewise::<D>(limits, input), expected, "bytewise");
}
