//! Replays the committed MQTT fuzz corpus (`fuzz/corpus/mqtt_*`) plus deterministic mutations
//! of it on stable Rust, so every `cargo test` does a little of what the fuzzer does.
//!
//! `mqtt_server` inputs are what a server reads (a CONNECT of some level first), decoded by
//! `Decoder::new`; `mqtt_client` inputs are what a client reads, decoded at each of the three
//! levels. Checks, for each input, decoded whole and in random splits: no panic; the bytes
//! left buffered never exceed the packet size limit; the same packets, the same error and
//! the same leftover however the bytes are split; and every packet decoded encodes back to
//! bytes that decode to it. The replay itself is `common::corpus`'s.
//!
//! Must never: depend on time or an unseeded RNG (a failure must replay).

mod common;

use std::collections::BTreeMap;

use canopy_protocols::mqtt::{Decoder, Level, reason};
use common::corpus::{MUTANTS, Mutation, Mutator, replay};
use common::stream::{OutcomeOf, assert_reencodes};

/// Small, so the `too_big` seeds and mutations reach it.
const MAX_PACKET: usize = 512;

const MUTATOR: Mutator = Mutator {
    // Bytes that flip MQTT decisions: flag nibbles, continuation bits, wildcards, NUL.
    bytes: b"\x00\x01\x02\x03\x04\x05\x7f\x80\xff\x10\x20\x30\x32\x34\x82\xa2\xc0\xe0\xf0+#/",
    chunks: &[
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
    ],
    mutations: Mutation::ALL,
};

/// What the mutants exercised, so a degenerate mutator cannot pass silently.
#[derive(Debug, Default)]
struct Coverage {
    inputs: usize,
    with_packets: usize,
    /// Error reason code to count.
    errors: BTreeMap<u8, usize>,
}

impl Coverage {
    fn record(&mut self, outcome: &OutcomeOf<Decoder>) {
        self.inputs += 1;
        if !outcome.frames.is_empty() {
            self.with_packets += 1;
        }
        if let Some(e) = &outcome.error {
            *self.errors.entry(e.code).or_default() += 1;
        }
    }
}

fn replay_mqtt(dir: &str, seed: u64, decoders: &[Decoder]) -> Coverage {
    let mut cov = Coverage::default();
    replay(
        dir,
        seed,
        &MUTATOR,
        decoders,
        assert_reencodes,
        |decoder, outcome| {
            assert_reencodes(decoder, outcome);
            cov.record(outcome);
        },
    );
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
    let cov = replay_mqtt(
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
    // Client inputs rotate through the levels, so each level sees a third of the mutants.
    let decoders = [Level::V31, Level::V311, Level::V5].map(|l| Decoder::with_level(l, MAX_PACKET));
    replay_mqtt("mqtt_client", 0x9e37_79b9_7f4a_7c15, &decoders);
}
