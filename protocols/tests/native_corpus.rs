//! Replays the committed fuzz corpus (`fuzz/corpus/native_*`) plus deterministic mutations of
//! it on stable Rust, so every `cargo test` does a little of what the fuzzer does.
//!
//! Checks, for each input, decoded in one piece and in random splits: no panic; the bytes a
//! decoder leaves buffered never exceed `max_control_line + max_payload + 64`; and the same
//! frames, the same error and the same leftover however the bytes are split.
//!
//! Must never: depend on time or an unseeded RNG (a failure must replay), or grow inputs so
//! large that the debug test profile takes more than a few seconds.

mod common;

use std::path::Path;

use canopy_protocols::native::{ClientDecoder, Limits, ProtocolError, ServerDecoder};
use common::{Decode, run, whole};

/// Small limits so mutations reach them: the `long_line` and `*_too_big` seeds exceed them.
const LIMITS: Limits = Limits {
    max_control_line: 256,
    max_payload: 512,
};

/// Mutated inputs per direction (two directions: 120,000 inputs in all).
const MUTANTS: usize = 60_000;
const MAX_INPUT: usize = 1024;

/// xorshift64*: deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const INTERESTING_BYTES: &[u8] = b" \t\r\n0123456789{}'\":\x00\x7f\xff";
const INTERESTING_CHUNKS: &[&[u8]] = &[
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
];

fn load(dir: &str) -> Vec<Vec<u8>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(dir);
    let mut entries: Vec<_> = std::fs::read_dir(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    let files: Vec<Vec<u8>> = entries
        .iter()
        .map(|p| std::fs::read(p).expect("corpus file"))
        .collect();
    assert!(
        files.len() >= 24,
        "{} holds only {} files",
        path.display(),
        files.len()
    );
    files
}

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut data = rng.pick(corpus).clone();
    for _ in 0..1 + rng.below(3) {
        let len = data.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            1 => {
                let b = *rng.pick(INTERESTING_BYTES);
                data.insert(rng.below(len + 1), b);
            }
            2 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(8)).min(len);
                data.drain(start..end);
            }
            3 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(32)).min(len);
                let copy = data[start..end].to_vec();
                let at = rng.below(len + 1);
                data.splice(at..at, copy);
            }
            4 => {
                let other = rng.pick(corpus);
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                data.truncate(cut);
                data.extend_from_slice(&other[from..]);
            }
            5 => {
                let chunk = rng.pick(INTERESTING_CHUNKS);
                let at = rng.below(len + 1);
                data.splice(at..at, chunk.iter().copied());
            }
            _ => {
                let other = rng.pick(corpus);
                data.extend_from_slice(other);
            }
        }
    }
    data.truncate(MAX_INPUT);
    data
}

/// Random chunk sizes, sometimes all tiny, sometimes larger.
fn chunk_sizes(rng: &mut Rng) -> Vec<usize> {
    let max = *rng.pick(&[1, 2, 5, 17, 64]);
    (0..MAX_INPUT).map(|_| 1 + rng.below(max)).collect()
}

/// What the mutants exercised, so a degenerate mutator cannot pass silently.
#[derive(Debug, Default)]
struct Coverage {
    with_frames: usize,
    /// Unknown operation, control line, payload, parser.
    errors: [usize; 4],
}

fn check<D: Decode>(rng: &mut Rng, input: &[u8], cov: &mut Coverage) {
    let expected = whole::<D>(LIMITS, input);
    let sizes = chunk_sizes(rng);
    let split = run::<D>(LIMITS, input, &mut sizes.into_iter());
    assert_eq!(
        split,
        expected,
        "split decode differs for {:?}",
        String::from_utf8_lossy(input)
    );
    if !expected.frames.is_empty() {
        cov.with_frames += 1;
    }
    let kind = match expected.error {
        None => return,
        Some(ProtocolError::UnknownOperation) => 0,
        Some(ProtocolError::MaxControlLineExceeded) => 1,
        Some(ProtocolError::MaxPayloadViolation { .. }) => 2,
        Some(ProtocolError::Parser(_)) => 3,
    };
    cov.errors[kind] += 1;
}

fn replay<D: Decode>(dir: &str, seed: u64) -> usize {
    let corpus = load(dir);
    let mut rng = Rng(seed);
    for file in &corpus {
        let expected = whole::<D>(LIMITS, file);
        common::assert_every_split::<D>(LIMITS, file, &expected);
    }
    let mut cov = Coverage::default();
    for _ in 0..MUTANTS {
        let input = mutate(&mut rng, &corpus);
        check::<D>(&mut rng, &input, &mut cov);
    }
    assert!(cov.with_frames > MUTANTS / 10, "{cov:?}");
    assert!(cov.errors.iter().all(|&n| n > 50), "{cov:?}");
    println!("{dir}: {cov:?}");
    corpus.len() + MUTANTS
}

#[test]
fn client_corpus_and_mutations() {
    let n = replay::<ClientDecoder>("native_client", 0x9e37_79b9_7f4a_7c15);
    assert!(n >= 50_000);
}

#[test]
fn server_corpus_and_mutations() {
    let n = replay::<ServerDecoder>("native_server", 0xd1b5_4a32_d192_ed03);
    assert!(n >= 50_000);
}
