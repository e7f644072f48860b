//! Replays the committed fuzz corpus (`fuzz/corpus/native_*`) plus deterministic mutations of
//! it on stable Rust, so every `cargo test` does a little of what the fuzzer does.
//!
//! Checks, for each input, decoded in one piece and in random splits: no panic; the bytes a
//! decoder leaves buffered never exceed `max_control_line + max_payload + 64`; and the same
//! frames, the same error and the same leftover however the bytes are split. The replay
//! itself is `common::corpus`'s.
//!
//! Must never: depend on time or an unseeded RNG (a failure must replay).

mod common;

use canopy_protocols::native::{ClientDecoder, Limits, ProtocolError, ServerDecoder};
use common::corpus::{MUTANTS, Mutation, Mutator, replay};
use common::stream::{Decode, Outcome};

/// Small limits so mutations reach them: the `long_line` and `*_too_big` seeds exceed them.
const LIMITS: Limits = Limits {
    max_control_line: 256,
    max_payload: 512,
};

const MUTATOR: Mutator = Mutator {
    bytes: b" \t\r\n0123456789{}'\":\x00\x7f\xff",
    chunks: &[
        b"\r\n",
        b"\n",
        b"PUB ",
        b"HPUB ",
        b"MSG ",
        b"HMSG ",
        b"SUB ",
        b"UNSUB ",
        b"PING\r\n",
        b"+OK\r\n",
        b"-ERR '",
        b"NATS/1.0\r\n",
        b"NATS/1.0 503\r\n\r\n",
        b" 0",
        b" 12",
        b" 512",
        b" 513",
        b" 18446744073709551616",
        b" 4294967296",
    ],
    // No byte replacement (which the MQTT mutator has): adding it would change every mutant
    // these seeds give.
    mutations: &[
        Mutation::FlipBit,
        Mutation::InsertByte,
        Mutation::Remove,
        Mutation::Duplicate,
        Mutation::Crossover,
        Mutation::InsertChunk,
        Mutation::Append,
    ],
};

/// What the mutants exercised, so a degenerate mutator cannot pass silently.
#[derive(Debug, Default)]
struct Coverage {
    with_frames: usize,
    /// Unknown operation, control line, payload, parser.
    errors: [usize; 4],
}

impl Coverage {
    fn record<Op>(&mut self, outcome: &Outcome<Op, ProtocolError>) {
        if !outcome.frames.is_empty() {
            self.with_frames += 1;
        }
        let kind = match outcome.error {
            None => return,
            Some(ProtocolError::UnknownOperation) => 0,
            Some(ProtocolError::MaxControlLineExceeded) => 1,
            Some(ProtocolError::MaxPayloadViolation { .. }) => 2,
            Some(ProtocolError::Parser(_)) => 3,
        };
        self.errors[kind] += 1;
    }
}

/// Replays `dir` through a decoder of type `D` with [`LIMITS`]; returns the inputs replayed.
fn replay_native<D>(dir: &str, seed: u64, decoder: D) -> usize
where
    D: Decode<Error = ProtocolError>,
{
    let mut cov = Coverage::default();
    let n = replay(
        dir,
        seed,
        &MUTATOR,
        &[decoder],
        |_, _| {},
        |_, outcome| cov.record(outcome),
    );
    assert!(cov.with_frames > MUTANTS / 10, "{cov:?}");
    assert!(cov.errors.iter().all(|&n| n > 50), "{cov:?}");
    println!("{dir}: {cov:?}");
    n
}

#[test]
fn client_corpus_and_mutations() {
    let n = replay_native(
        "native_client",
        0x9e37_79b9_7f4a_7c15,
        ClientDecoder::new(LIMITS),
    );
    assert!(n >= 50_000);
}

#[test]
fn server_corpus_and_mutations() {
    let n = replay_native(
        "native_server",
        0xd1b5_4a32_d192_ed03,
        ServerDecoder::new(LIMITS),
    );
    assert!(n >= 50_000);
}
