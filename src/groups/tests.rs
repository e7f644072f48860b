use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;

use super::dispatch::{AckError, DeadReason, Delivery, Dispatcher, MemberId};
use super::{
    GroupSpec, Limits, MAX_IN_FLIGHT, MAX_MEMBER, MIN_ACK_WAIT_MS, SpecError, StartAt, check_member,
};

const WAIT: u64 = 1_000;

fn limits(per_subject: u32, max_deliveries: u32) -> Limits {
    Limits {
        ack_wait_ms: WAIT,
        max_deliveries,
        per_subject,
        per_member: 100,
    }
}

fn subject(name: &str) -> Arc<str> {
    Arc::from(name)
}

fn versions(deliveries: &[Delivery]) -> Vec<(&str, u64)> {
    deliveries
        .iter()
        .map(|d| (&*d.subject, d.version))
        .collect()
}

#[test]
fn one_subject_goes_out_one_message_at_a_time_in_version_order() {
    let mut group = Dispatcher::new(limits(1, 0), true);
    let orders = subject("orders.1");
    for version in 1..=3 {
        group.observe(&orders, version, 0);
    }
    group.join(1);
    group.join(2);
    let first = group.take(1, 10, 0);
    assert_eq!(versions(&first), [("orders.1", 1)]);
    // Nothing more of it for anyone while version 1 is out.
    assert!(group.take(2, 10, 0).is_empty());
    assert!(group.take(1, 10, 0).is_empty());
    group.ack(&first[0], 0).unwrap();
    // The subject is free again: whoever asks first gets version 2.
    let second = group.take(2, 10, 0);
    assert_eq!(versions(&second), [("orders.1", 2)]);
    assert_eq!(group.cursor("orders.1"), Some(1));
}

#[test]
fn messages_passed_over_before_the_start_are_done_and_later_ones_go_out() {
    let mut group = Dispatcher::new(limits(1, 0), false);
    let orders = subject("orders.1");
    group.observe(&orders, 1, 0);
    group.join(1);
    assert_eq!(versions(&group.take(1, 10, 0)), [("orders.1", 1)]);
    // A subject with a message out takes a passed-over one as a new message.
    group.pass_over(&orders, 2, 0);
    assert_eq!(group.stats().pending, 2);
    let fresh = subject("orders.2");
    group.pass_over(&fresh, 4, 0);
    group.pass_over(&fresh, 5, 0);
    assert_eq!(group.cursor(&fresh), Some(5), "passed over, not delivered");
    assert!(group.take_cursors().contains(&(Arc::clone(&fresh), 5)));
    group.observe(&fresh, 6, 0);
    assert_eq!(versions(&group.take(1, 10, 0)), [("orders.2", 6)]);
}

#[test]
fn a_stuck_subject_holds_up_no_other() {
    let mut group = Dispatcher::new(limits(1, 0), true);
    let (stuck, other) = (subject("a"), subject("b"));
    group.observe(&stuck, 1, 0);
    group.observe(&stuck, 2, 0);
    for version in 1..=5 {
        group.observe(&other, version, 0);
    }
    group.join(1);
    let held = group.take(1, 1, 0);
    assert_eq!(versions(&held), [("a", 1)]);
    // `a` stays unacked; `b` flows through all five.
    for version in 1..=5 {
        let next = group.take(1, 10, 0);
        assert_eq!(versions(&next), [("b", version)]);
        group.ack(&next[0], 0).unwrap();
    }
    assert_eq!(group.cursor("b"), Some(5));
    assert_eq!(group.cursor("a"), Some(0));
}

#[test]
fn an_expired_delivery_goes_again_and_its_late_ack_is_refused() {
    let mut group = Dispatcher::new(limits(1, 0), true);
    let s = subject("s");
    group.observe(&s, 1, 0);
    group.observe(&s, 2, 0);
    group.join(1);
    group.join(2);
    let first = group.take(1, 1, 0);
    assert!(group.tick(WAIT - 1).is_empty());
    assert!(group.take(2, 1, WAIT - 1).is_empty());
    group.tick(WAIT);
    let again = group.take(2, 10, WAIT);
    assert_eq!(
        again,
        [Delivery {
            subject: Arc::clone(&s),
            version: 1,
            attempt: 2
        }]
    );
    // Member 1 wakes up and acks its expired delivery: refused, so member 2 keeps
    // the subject and version 2 does not overtake the redelivery.
    assert_eq!(group.ack(&first[0], WAIT), Err(AckError::NotOutstanding));
    assert!(group.take(1, 10, WAIT).is_empty());
    group.ack(&again[0], WAIT).unwrap();
    assert_eq!(versions(&group.take(1, 10, WAIT)), [("s", 2)]);
    assert_eq!(group.stats().redelivered, 1);
}

#[test]
fn in_progress_moves_the_deadline() {
    let mut group = Dispatcher::new(limits(1, 0), true);
    let s = subject("s");
    group.observe(&s, 1, 0);
    group.join(1);
    let d = group.take(1, 1, 0);
    group.in_progress(&d[0], 900).unwrap();
    group.tick(WAIT + 10);
    assert_eq!(
        group.stats().in_flight,
        1,
        "still out after the first deadline"
    );
    assert_eq!(group.next_due(), Some(900 + WAIT));
    group.tick(900 + WAIT);
    assert_eq!(group.stats().in_flight, 0);
}

#[test]
fn a_nack_with_a_delay_holds_the_subject_until_the_delay_is_over() {
    let mut group = Dispatcher::new(limits(1, 0), true);
    let s = subject("s");
    group.observe(&s, 1, 0);
    group.observe(&s, 2, 0);
    group.join(1);
    let d = group.take(1, 1, 0);
    assert_eq!(group.nack(&d[0], 500, 0), Ok(None));
    // Version 2 must not overtake version 1's redelivery.
    assert!(group.take(1, 10, 100).is_empty());
    group.tick(500);
    let again = group.take(1, 10, 500);
    assert_eq!(versions(&again), [("s", 1)]);
    assert_eq!(again[0].attempt, 2);
}

#[test]
fn a_poison_message_is_dead_lettered_and_its_subject_goes_on() {
    let mut group = Dispatcher::new(limits(1, 3), true);
    let s = subject("s");
    group.observe(&s, 1, 0);
    group.observe(&s, 2, 0);
    group.join(1);
    let mut now = 0;
    for attempt in 1..=2 {
        let d = group.take(1, 1, now);
        assert_eq!(d[0].attempt, attempt);
        assert_eq!(group.nack(&d[0], 0, now), Ok(None));
        now += 1;
    }
    let last = group.take(1, 1, now);
    assert_eq!(last[0].attempt, 3);
    // The last delivery's ack wait runs out.
    let dead = group.tick(now + WAIT);
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].version, dead[0].attempts), (1, 3));
    assert_eq!(dead[0].reason, DeadReason::Expired);
    assert_eq!(group.cursor("s"), Some(1));
    assert_eq!(versions(&group.take(1, 1, now + WAIT)), [("s", 2)]);
    assert_eq!(group.stats().dead_lettered, 1);
    assert_eq!(group.recent_dead_letters().count(), 1);
}

#[test]
fn a_member_that_leaves_keeps_its_messages_until_their_ack_wait_runs_out() {
    let mut group = Dispatcher::new(limits(1, 0), true);
    let s = subject("s");
    group.observe(&s, 1, 0);
    group.join(1);
    group.join(2);
    let held = group.take(1, 1, 0);
    group.leave(1);
    assert!(group.take(2, 1, 10).is_empty());
    group.tick(WAIT);
    let again = group.take(2, 1, WAIT);
    assert_eq!(versions(&again), [("s", 1)]);
    assert_eq!(group.ack(&held[0], WAIT), Err(AckError::NotOutstanding));
}

#[test]
fn more_than_one_in_flight_per_subject_stays_with_one_member() {
    let mut group = Dispatcher::new(limits(3, 0), true);
    let s = subject("s");
    for version in 1..=5 {
        group.observe(&s, version, 0);
    }
    group.join(1);
    group.join(2);
    let batch = group.take(1, 10, 0);
    assert_eq!(versions(&batch), [("s", 1), ("s", 2), ("s", 3)]);
    assert!(group.take(2, 10, 0).is_empty(), "the subject is member 1's");
    // Acks out of order: the cursor waits for version 1.
    group.ack(&batch[2], 0).unwrap();
    group.ack(&batch[1], 0).unwrap();
    assert_eq!(group.cursor("s"), Some(0));
    group.ack(&batch[0], 0).unwrap();
    assert_eq!(group.cursor("s"), Some(3));
    assert_eq!(group.stats().pending, 2);
}

#[test]
fn cursors_to_write_are_the_subjects_that_moved() {
    let mut group = Dispatcher::new(limits(1, 0), false);
    let (a, b) = (subject("a"), subject("b"));
    // Start at new: the first version observed is the first delivered.
    group.observe(&a, 7, 0);
    group.restore(Arc::clone(&b), 4, 6);
    group.join(1);
    let first = group.take(1, 10, 0);
    assert_eq!(versions(&first), [("a", 7), ("b", 5)]);
    group.ack(&first[0], 0).unwrap();
    assert_eq!(group.take_cursors(), [(Arc::clone(&a), 7)]);
    assert!(group.take_cursors().is_empty());
    assert_eq!(group.stats().pending, 2);
}

#[test]
fn the_laggiest_subjects_come_first() {
    let mut group = Dispatcher::new(limits(1, 0), true);
    group.restore(subject("a"), 0, 3);
    group.restore(subject("b"), 0, 9);
    group.restore(subject("c"), 5, 5);
    assert_eq!(group.laggiest(5), [(subject("b"), 9), (subject("a"), 3)]);
}

#[test]
fn group_definitions_are_checked() {
    let ok = GroupSpec::new("billing", "orders.>");
    assert_eq!(ok.check(), Ok(()));
    assert_eq!(
        ok.dead_letter_subject("orders.eu.7"),
        "$DLQ.billing.orders.eu.7"
    );
    let bad = |change: fn(&mut GroupSpec)| {
        let mut spec = GroupSpec::new("billing", "orders.>");
        change(&mut spec);
        spec.check()
    };
    assert!(matches!(
        bad(|s| s.name = "bad name".into()),
        Err(SpecError::Name(_))
    ));
    assert!(matches!(
        bad(|s| s.pattern = "orders.>.x".into()),
        Err(SpecError::Pattern(_))
    ));
    assert!(matches!(
        bad(|s| s.dead_letter = Some("dead..letters".into())),
        Err(SpecError::DeadLetter(_))
    ));
    assert_eq!(bad(|s| s.per_subject = 0), Err(SpecError::InFlight));
    assert_eq!(
        bad(|s| s.per_member = MAX_IN_FLIGHT + 1),
        Err(SpecError::InFlight)
    );
    assert_eq!(bad(|s| s.ack_wait_ms = 0), Err(SpecError::AckWait));
    assert_eq!(
        bad(|s| s.ack_wait_ms = MIN_ACK_WAIT_MS - 1),
        Err(SpecError::AckWait)
    );
    assert_eq!(bad(|s| s.ack_wait_ms = MIN_ACK_WAIT_MS), Ok(()));
}

#[test]
fn member_names_are_bounded_and_printable() {
    assert!(check_member("worker-1").is_ok());
    assert!(check_member(&"m".repeat(MAX_MEMBER)).is_ok());
    assert!(check_member(&"m".repeat(MAX_MEMBER + 1)).is_err());
    assert!(check_member("").is_err());
    assert!(check_member("a\nb").is_err());
}

#[test]
fn a_definition_reads_back_from_json_with_defaults_and_refuses_unknown_fields() {
    let spec: GroupSpec =
        serde_json::from_str(r#"{"name": "billing", "pattern": "orders.>", "start": "all"}"#)
            .unwrap();
    assert_eq!(spec.limits(), Limits::default());
    assert_eq!(spec.start, StartAt::All);
    let timed: GroupSpec = serde_json::from_str(
        r#"{"name": "b", "pattern": "o.*", "start": {"time": 1700000000000}, "per_subject": 4}"#,
    )
    .unwrap();
    assert_eq!(
        (timed.start, timed.per_subject),
        (StartAt::Time(1_700_000_000_000), 4)
    );
    let back: GroupSpec = serde_json::from_slice(&serde_json::to_vec(&timed).unwrap()).unwrap();
    assert_eq!(back, timed);
    let typo =
        serde_json::from_str::<GroupSpec>(r#"{"name": "b", "pattern": "o", "ack_wiat_ms": 5}"#);
    assert!(typo.unwrap_err().to_string().contains("unknown field"));
}

/// What a model consumer does next.
#[derive(Debug, Clone)]
enum Op {
    Publish(usize),
    Join(MemberId),
    Leave(MemberId),
    Take(MemberId, usize),
    Ack(usize),
    Nack(usize, u64),
    InProgress(usize),
    /// Acks a delivery that is no longer outstanding, if there is one.
    LateAck(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4usize).prop_map(Op::Publish),
        1 => (0..3u64).prop_map(Op::Join),
        1 => (0..3u64).prop_map(Op::Leave),
        3 => (0..3u64, 1..4usize).prop_map(|(m, n)| Op::Take(m, n)),
        3 => (0..8usize).prop_map(Op::Ack),
        1 => (0..8usize, 0..3u64).prop_map(|(i, d)| Op::Nack(i, d * 300)),
        1 => (0..8usize).prop_map(Op::InProgress),
        1 => (0..8usize).prop_map(Op::LateAck),
        2 => (1..3u64).prop_map(|n| Op::Advance(n * 400)),
    ]
}

/// The test's own view of what is out: each delivery with its holder and deadline.
struct Model {
    group: Dispatcher,
    now: u64,
    heads: Vec<u64>,
    /// Versions done per subject (acked, or dead-lettered).
    done: Vec<BTreeSet<u64>>,
    out: Vec<(Delivery, MemberId, u64)>,
    stale: Vec<Delivery>,
    members: BTreeSet<MemberId>,
    per_subject: usize,
}

impl Model {
    fn new(per_subject: u32, max_deliveries: u32) -> Self {
        Self {
            group: Dispatcher::new(limits(per_subject, max_deliveries), true),
            now: 0,
            heads: vec![0; 4],
            done: vec![BTreeSet::new(); 4],
            out: Vec::new(),
            stale: Vec::new(),
            members: BTreeSet::new(),
            per_subject: per_subject as usize,
        }
    }

    fn index(subject: &str) -> usize {
        subject[1..].parse().unwrap_or(0)
    }

    fn mark_dead(&mut self, letters: &[super::dispatch::DeadLetter]) {
        for letter in letters {
            self.done[Self::index(&letter.subject)].insert(letter.version);
        }
    }

    fn expire(&mut self) {
        let now = self.now;
        let (expired, kept): (Vec<_>, Vec<_>) =
            self.out.drain(..).partition(|(_, _, due)| *due <= now);
        self.out = kept;
        self.stale.extend(expired.into_iter().map(|(d, _, _)| d));
        let dead = self.group.tick(now);
        self.mark_dead(&dead);
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Publish(s) => {
                self.heads[s] += 1;
                let name = subject(&format!("s{s}"));
                self.group.observe(&name, self.heads[s], self.now);
            }
            Op::Join(m) => {
                self.members.insert(m);
                self.group.join(m);
            }
            Op::Leave(m) => {
                self.members.remove(&m);
                self.group.leave(m);
            }
            Op::Take(m, n) => {
                let got = self.group.take(m, n, self.now);
                prop_assert!(got.is_empty() || self.members.contains(&m));
                for d in got {
                    let s = Self::index(&d.subject);
                    prop_assert!(!self.done[s].contains(&d.version), "{d:?} was done");
                    prop_assert!(d.version <= self.heads[s]);
                    if self.per_subject == 1 {
                        // Strict order: everything before it is done.
                        let before = (1..d.version).all(|v| self.done[s].contains(&v));
                        prop_assert!(before, "{d:?} overtook an earlier version");
                    }
                    for (other, holder, _) in &self.out {
                        if other.subject == d.subject {
                            prop_assert_eq!(*holder, m, "a subject held by two members");
                            prop_assert_ne!(other.version, d.version);
                        }
                    }
                    self.out.push((d, m, self.now + WAIT));
                }
            }
            Op::Ack(i) if i < self.out.len() => {
                let (d, _, _) = self.out.remove(i);
                prop_assert_eq!(self.group.ack(&d, self.now), Ok(()));
                self.done[Self::index(&d.subject)].insert(d.version);
            }
            Op::Nack(i, delay) if i < self.out.len() => {
                let (d, _, _) = self.out.remove(i);
                let dead = self.group.nack(&d, delay, self.now);
                prop_assert!(dead.is_ok());
                if let Ok(Some(letter)) = dead {
                    self.mark_dead(&[letter]);
                }
            }
            Op::InProgress(i) if i < self.out.len() => {
                let now = self.now;
                if let Some(entry) = self.out.get_mut(i) {
                    prop_assert_eq!(self.group.in_progress(&entry.0, now), Ok(()));
                    entry.2 = now + WAIT;
                }
            }
            Op::LateAck(i) if i < self.stale.len() => {
                let d = self.stale.remove(i);
                prop_assert_eq!(self.group.ack(&d, self.now), Err(AckError::NotOutstanding));
            }
            Op::Advance(ms) => {
                self.now += ms;
                self.expire();
            }
            _ => {}
        }
        self.check()
    }

    fn check(&self) -> Result<(), TestCaseError> {
        for (s, done) in self.done.iter().enumerate() {
            let contiguous = (1..).take_while(|v| done.contains(v)).count() as u64;
            let cursor = self.group.cursor(&format!("s{s}")).unwrap_or(0);
            prop_assert_eq!(cursor, contiguous, "subject s{}", s);
        }
        prop_assert_eq!(self.group.stats().in_flight, self.out.len() as u64);
        let pending: u64 = self
            .heads
            .iter()
            .zip(&self.done)
            .map(|(head, done)| head - done.len() as u64)
            .sum();
        prop_assert_eq!(self.group.stats().pending, pending);
        Ok(())
    }

    /// One member takes and acks until nothing is left: every subject ends at its head.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        self.group.join(99);
        self.members.insert(99);
        for _ in 0..1_000 {
            self.now += WAIT * 2;
            self.expire();
            let got = self.group.take(99, 100, self.now);
            if got.is_empty() && self.out.is_empty() {
                break;
            }
            for d in got {
                prop_assert_eq!(self.group.ack(&d, self.now), Ok(()));
                self.done[Self::index(&d.subject)].insert(d.version);
            }
        }
        for (s, head) in self.heads.iter().enumerate() {
            prop_assert_eq!(self.group.cursor(&format!("s{s}")).unwrap_or(0), *head);
        }
        prop_assert_eq!(self.group.stats().pending, 0);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_subject_is_ever_out_of_order_shared_or_lost(
        per_subject in prop_oneof![Just(1u32), Just(2u32)],
        max_deliveries in prop_oneof![Just(0u32), Just(2u32)],
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let mut model = Model::new(per_subject, max_deliveries);
        for op in &ops {
            model.apply(op)?;
        }
        // Whatever happened, members that left hold nothing forever.
        model.drain()?;
    }
}
