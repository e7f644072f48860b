//! Replays the committed MQTT fuzz corpus (`fuzz/corpus/mqtt_*`) plus deterministic mutations
//! of it on stable Rust, so every `cargo test` does a little of what the fuzzer does.
//!
//! `mqtt_server` inputs are what a server reads (a CONNECT of some level first), decoded by
//! `Decoder::new`; `mqtt_client` inputs are what a client reads, decoded at each of the three
//! levels. Checks, for each input, decoded whole and in random splits: no panic; the bytes
//! left buffered never exceed the packet size limit; the same packets, the same error and
//! the same leftover however the bytes are split; and every packet decoded encodes back to
//! bytes that decode to it.
//!
//! Must never: depend on time or an unseeded RNG (a failure must replay), or grow inputs so
//! large that the debug test profile takes more than a few seconds.

mod mqtt_stream;

use std::collections::BTreeMap;
use std::path::Path;

use canopy_protocols::mqtt::{Decoder, Level, reason};
use mqtt_stream::{Outcome, assert_every_split, assert_reencodes, run, whole};

/// Small, so the `too_big` seeds and mutations reach it.
const MAX_PACKET: usize = 512;

/// Mutated inputs per direction.
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

/// Bytes that flip MQTT decisions: flag nibbles, continuation bits, wildcards, NUL.
const INTERESTING_BYTES: &[u8] =
    b"\x00\x01\x02\x03\x04\x05\x7f\x80\xff\x10\x20\x30\x32\x34\x82\xa2\xc0\xe0\xf0+#/";
const INTERESTING_CHUNKS: &[&[u8]] = &[
    b"\x00\x04MQTT\x05",
    b"\x00\x04MQTT\x04",
    b"\x00\x06MQIsdp\x03",
    b"\xe0\x00",
    b"\xf0\x00",
    b"\xc0\x00",
    b"\xd0\x00",
    b"\x40\x02\x00\x01",
    b"\xff\xff\xff\x7f",
    b"\x80\x80\x80\x80\x01",
    b"\x80\x00",
    b"\x26\x00\x01k\x00\x01v",
    b"\x0b\x00",
    b"\x0b\xff\xff\xff\x7f",
    b"\x23\x00\x00",
    b"\x23\x00\x01",
    b"\x24\x02",
    b"\x21\x00\x00",
    b"\xff\xff",
    b"\xed\xa0\x80",
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
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                data[i] = *rng.pick(INTERESTING_BYTES);
            }
            2 => {
                let b = *rng.pick(INTERESTING_BYTES);
                data.insert(rng.below(len + 1), b);
            }
            3 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(8)).min(len);
                data.drain(start..end);
            }
            4 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(32)).min(len);
                let copy = data[start..end].to_vec();
                let at = rng.below(len + 1);
                data.splice(at..at, copy);
            }
            5 => {
                let other = rng.pick(corpus);
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                data.truncate(cut);
                data.extend_from_slice(&other[from..]);
            }
            6 => {
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
    inputs: usize,
    with_packets: usize,
    /// Error reason code to count.
    errors: BTreeMap<u8, usize>,
}

fn check(rng: &mut Rng, decoder: &Decoder, input: &[u8], cov: &mut Coverage) {
    let expected = whole(decoder, input);
    let sizes = chunk_sizes(rng);
    let split = run(decoder, input, &mut sizes.into_iter());
    assert_eq!(split, expected, "split decode differs for {input:02x?}");
    assert_reencodes(decoder, &expected);
    record(&expected, cov);
}

fn record(outcome: &Outcome, cov: &mut Coverage) {
    cov.inputs += 1;
    if !outcome.packets.is_empty() {
        cov.with_packets += 1;
    }
    if let Some(e) = &outcome.error {
        *cov.errors.entry(e.code).or_default() += 1;
    }
}

fn replay(dir: &str, seed: u64, decoders: &[Decoder]) -> Coverage {
    let corpus = load(dir);
    let mut rng = Rng(seed);
    let mut cov = Coverage::default();
    for file in &corpus {
        for decoder in decoders {
            let expected = whole(decoder, file);
            assert_every_split(decoder, file, &expected);
            assert_reencodes(decoder, &expected);
        }
    }
    for i in 0..MUTANTS {
        let input = mutate(&mut rng, &corpus);
        // Client inputs rotate through the levels, so each level sees a third.
        let decoder = &decoders[i % decoders.len()];
        check(&mut rng, decoder, &input, &mut cov);
    }
    println!("{dir}: {cov:?}");
    // Client inputs decoded at a level they were not written for mostly fail early.
    assert!(cov.with_packets > MUTANTS / 6, "{cov:?}");
    for code in [
        reason::MALFORMED_PACKET,
        reason::PROTOCOL_ERROR,
        reason::PACKET_TOO_LARGE,
        reason::TOPIC_NAME_INVALID,
    ] {
        assert!(
            cov.errors.get(&code).copied().unwrap_or(0) > 50,
            "0x{code:02X}: {cov:?}"
        );
    }
    cov
}

#[test]
fn server_corpus_and_mutations() {
    let cov = replay(
        "mqtt_server",
        0xd1b5_4a32_d192_ed03,
        &[Decoder::new(MAX_PACKET)],
    );
    let unsupported = cov
        .errors
        .get(&reason::UNSUPPORTED_PROTOCOL_VERSION)
        .copied()
        .unwrap_or(0);
    assert!(unsupported > 50, "{cov:?}");
}

#[test]
fn client_corpus_and_mutations() {
    let decoders = [Level::V31, Level::V311, Level::V5].map(|l| Decoder::with_level(l, MAX_PACKET));
    replay("mqtt_client", 0x9e37_79b9_7f4a_7c15, &decoders);
}
