//! Replays a committed fuzz corpus (`fuzz/corpus/<dir>`) plus deterministic mutations of it,
//! so every `cargo test` does a little of what the fuzzer does: each seed is decoded whole
//! and split at every position, each mutant whole and in random chunks, and the outcomes
//! must agree. The `*_corpus` tests supply the decoders, the bytes worth mutating towards,
//! and what to check and count in each outcome.
//!
//! Must never: depend on time or an unseeded RNG (a failure must replay), or grow inputs so
//! large that the debug test profile takes more than a few seconds.

use std::path::Path;

use super::stream::{Decode, OutcomeOf, assert_every_split, run, whole};

/// Mutated inputs per replay.
pub const MUTANTS: usize = 60_000;
/// Mutants are cut to this many bytes.
pub const MAX_INPUT: usize = 1024;

/// xorshift64*: deterministic, good enough to pick mutations.
pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The files of `fuzz/corpus/<dir>`, in name order; there must be at least 24.
pub fn load(dir: &str) -> Vec<Vec<u8>> {
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

/// One change to an input. Those that need a byte to work on append another seed to an
/// empty input instead.
#[derive(Debug, Clone, Copy)]
pub enum Mutation {
    /// Flips one bit.
    FlipBit,
    /// Overwrites a byte with an interesting one.
    ReplaceByte,
    /// Inserts an interesting byte.
    InsertByte,
    /// Removes up to 8 bytes.
    Remove,
    /// Copies up to 32 bytes elsewhere.
    Duplicate,
    /// Keeps a prefix and continues with the tail of another seed.
    Crossover,
    /// Inserts an interesting chunk.
    InsertChunk,
    /// Appends another seed.
    Append,
}

impl Mutation {
    /// Every mutation, in the order a [`Mutator`] that draws from all of them lists them.
    pub const ALL: &[Mutation] = &[
        Mutation::FlipBit,
        Mutation::ReplaceByte,
        Mutation::InsertByte,
        Mutation::Remove,
        Mutation::Duplicate,
        Mutation::Crossover,
        Mutation::InsertChunk,
        Mutation::Append,
    ];
}

/// How a corpus test mutates its seeds: the protocol's interesting bytes and chunks, and the
/// mutations to draw from (each equally likely, one draw from the RNG per mutation).
pub struct Mutator {
    pub bytes: &'static [u8],
    pub chunks: &'static [&'static [u8]],
    pub mutations: &'static [Mutation],
}

impl Mutator {
    /// A seed of `corpus` changed by one to three mutations, cut to [`MAX_INPUT`] bytes.
    pub fn mutate(&self, rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
        let mut data = rng.pick(corpus).clone();
        for _ in 0..1 + rng.below(3) {
            let len = data.len();
            match *rng.pick(self.mutations) {
                Mutation::FlipBit if len > 0 => {
                    let i = rng.below(len);
                    data[i] ^= 1 << rng.below(8);
                }
                Mutation::ReplaceByte if len > 0 => {
                    let i = rng.below(len);
                    data[i] = *rng.pick(self.bytes);
                }
                Mutation::InsertByte => {
                    let b = *rng.pick(self.bytes);
                    data.insert(rng.below(len + 1), b);
                }
                Mutation::Remove if len > 0 => {
                    let start = rng.below(len);
                    let end = (start + 1 + rng.below(8)).min(len);
                    data.drain(start..end);
                }
                Mutation::Duplicate if len > 0 => {
                    let start = rng.below(len);
                    let end = (start + 1 + rng.below(32)).min(len);
                    let copy = data[start..end].to_vec();
                    let at = rng.below(len + 1);
                    data.splice(at..at, copy);
                }
                Mutation::Crossover => {
                    let other = rng.pick(corpus);
                    let cut = rng.below(len + 1);
                    let from = rng.below(other.len() + 1);
                    data.truncate(cut);
                    data.extend_from_slice(&other[from..]);
                }
                Mutation::InsertChunk => {
                    let chunk = rng.pick(self.chunks);
                    let at = rng.below(len + 1);
                    data.splice(at..at, chunk.iter().copied());
                }
                Mutation::Append
                | Mutation::FlipBit
                | Mutation::ReplaceByte
                | Mutation::Remove
                | Mutation::Duplicate => {
                    let other = rng.pick(corpus);
                    data.extend_from_slice(other);
                }
            }
        }
        data.truncate(MAX_INPUT);
        data
    }
}

/// Random chunk sizes, sometimes all tiny, sometimes larger.
pub fn chunk_sizes(rng: &mut Rng) -> Vec<usize> {
    let max = *rng.pick(&[1, 2, 5, 17, 64]);
    (0..MAX_INPUT).map(|_| 1 + rng.below(max)).collect()
}

/// Replays `fuzz/corpus/<dir>`: every seed through every decoder, decoded whole and split at
/// every position (then `on_seed`), and [`MUTANTS`] mutants from `mutator` and an RNG seeded
/// with `seed`, each decoded whole and in random chunks by the next decoder in turn (then
/// `on_mutant`). Returns how many inputs were replayed.
pub fn replay<D: Decode>(
    dir: &str,
    seed: u64,
    mutator: &Mutator,
    decoders: &[D],
    mut on_seed: impl FnMut(&D, &OutcomeOf<D>),
    mut on_mutant: impl FnMut(&D, &OutcomeOf<D>),
) -> usize {
    let corpus = load(dir);
    let mut rng = Rng(seed);
    for file in &corpus {
        for decoder in decoders {
            let expected = whole(decoder, file);
            assert_every_split(decoder, file, &expected);
            on_seed(decoder, &expected);
        }
    }
    for i in 0..MUTANTS {
        let input = mutator.mutate(&mut rng, &corpus);
        let decoder = &decoders[i % decoders.len()];
        let expected = whole(decoder, &input);
        let sizes = chunk_sizes(&mut rng);
        let split = run(decoder, &input, &mut sizes.into_iter());
        assert_eq!(
            split,
            expected,
            "split decode differs for \"{}\"",
            input.escape_ascii()
        );
        on_mutant(decoder, &expected);
    }
    corpus.len() + MUTANTS
}
