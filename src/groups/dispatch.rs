//! One group's dispatcher: which member gets which message next, and what acks,
//! nacks and expired deadlines do to each subject's cursor.
//!
//! Every subject has a cursor (`acked`: each version at or below it is done), the next
//! version never sent, and the few versions in flight or waiting to go again. A subject
//! belongs to a member exactly while it has messages in flight, and only that member
//! gets more of it, so with one in flight per subject (the default) a subject's
//! messages are handled one after another in version order, by whichever member is
//! free, and a slow or stuck subject holds up no other. An ack, nack or in-progress
//! costs O(log k) in the subject's and the group's outstanding messages, whatever the
//! backlog: nothing is kept per message that is not outstanding.
//!
//! Must never: deliver a version at or below a subject's cursor, give a subject to a
//! second member while the first has any of it in flight, or send a subject's next
//! version while (with one in flight per subject) an earlier one waits to go again.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use super::Limits;

/// A member of the group: a consuming connection, by an id its front end chose.
pub type MemberId = u64;

/// One message handed to a member. `attempt` counts from 1; an ack must name it, so a
/// late ack of a delivery that already expired cannot release the subject while its
/// redelivery is out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub subject: Arc<str>,
    pub version: u64,
    pub attempt: u32,
}

/// A message that used its last delivery: the front end publishes it to the
/// dead-letter subject, and its subject goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub subject: Arc<str>,
    pub version: u64,
    pub attempts: u32,
    pub reason: DeadReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadReason {
    /// Its last delivery's ack wait ran out.
    Expired,
    /// Its last delivery was nacked.
    Nacked,
}

impl DeadReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::Expired => "max deliveries reached: the last ack wait ran out",
            DeadReason::Nacked => "max deliveries reached: the last delivery was nacked",
        }
    }
}

/// Why an ack, nack, in-progress or term changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    #[error("this delivery is not outstanding: acked already, or it expired and went again")]
    NotOutstanding,
}

/// Counts for `canopy group info`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub members: usize,
    /// Subjects the group has a cursor for.
    pub subjects: usize,
    /// Messages stored but not yet done, over every subject.
    pub pending: u64,
    pub in_flight: u64,
    /// Deliveries that were not a message's first.
    pub redelivered: u64,
    pub dead_lettered: u64,
}

/// Most dead letters remembered for `info`.
const RECENT_DEAD: usize = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKind {
    /// An outstanding delivery's ack deadline.
    Deadline,
    /// A nacked message may go again.
    Retry,
}

/// (due ms, kind, subject, version, attempt).
type Timer = (u64, TimerKind, Arc<str>, u64, u32);

struct Outstanding {
    attempt: u32,
    due: u64,
}

#[derive(Default)]
struct SubjectState {
    /// Every version at or below is done.
    acked: u64,
    /// The newest version stored.
    head: u64,
    /// The lowest version never delivered.
    next: u64,
    in_flight: BTreeMap<u64, Outstanding>,
    /// Versions to go again: (attempts so far, not before ms).
    retry: BTreeMap<u64, (u32, u64)>,
    /// Versions above `acked` already done (only with more than one in flight).
    done_above: BTreeSet<u64>,
    /// The member holding the in-flight messages, while there are any.
    owner: Option<MemberId>,
    /// The ready queue it is in. An entry in another queue is stale (left behind when
    /// its owner let go of it) and is dropped when popped.
    queued: Queued,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Queued {
    #[default]
    No,
    /// The group's queue, for any member.
    Group,
    /// Its owner's queue.
    Member(MemberId),
}

impl SubjectState {
    fn starting_after(acked: u64) -> Self {
        Self {
            acked,
            head: acked,
            next: acked + 1,
            ..Self::default()
        }
    }

    /// Slots taken: in flight, and waiting to go again (which keeps order: nothing
    /// later goes out while an earlier version waits).
    fn used(&self) -> usize {
        self.in_flight.len() + self.retry.len()
    }

    /// The version to deliver next at `now`, if any.
    fn sendable(&self, per_subject: usize, now: u64) -> Option<u64> {
        if let Some((&version, &(_, not_before))) = self.retry.iter().next()
            && not_before <= now
        {
            return Some(version);
        }
        (self.used() < per_subject && self.next <= self.head).then_some(self.next)
    }

    fn pending(&self) -> u64 {
        self.head.saturating_sub(self.acked) - self.done_above.len() as u64
    }

    /// Marks `version` done and moves the cursor over every done version after it.
    /// Returns whether the cursor moved.
    fn done(&mut self, version: u64) -> bool {
        if version <= self.acked {
            return false;
        }
        if version != self.acked + 1 {
            self.done_above.insert(version);
            return false;
        }
        self.acked = version;
        while self.done_above.remove(&(self.acked + 1)) {
            self.acked += 1;
        }
        true
    }
}

#[derive(Default)]
struct Member {
    in_flight: u32,
    /// Subjects it owns that have room for more.
    ready: VecDeque<Arc<str>>,
}

/// One group's delivery state. Times are milliseconds on the caller's clock.
pub struct Dispatcher {
    limits: Limits,
    /// New subjects start at their first version (start at all) or at the version
    /// first observed (start at new).
    from_first: bool,
    /// Keyed by subject names clients choose, looked up on every take and ack:
    /// foldhash (seeded at random per process, as the sequencer's maps) costs a
    /// fraction of SipHash on them.
    subjects: HashMap<Arc<str>, SubjectState, foldhash::fast::RandomState>,
    members: HashMap<MemberId, Member, foldhash::fast::RandomState>,
    /// Unowned subjects with something to send, oldest first.
    ready: VecDeque<Arc<str>>,
    timers: BTreeSet<Timer>,
    /// Subjects whose cursor moved since [`Dispatcher::take_cursors`].
    moved: BTreeSet<Arc<str>>,
    pending: u64,
    in_flight: u64,
    redelivered: u64,
    dead_lettered: u64,
    recent_dead: VecDeque<DeadLetter>,
}

impl Dispatcher {
    /// A dispatcher whose subjects not yet seen start at their first version
    /// (`from_first`) or at the first version observed.
    pub fn new(limits: Limits, from_first: bool) -> Self {
        Self {
            limits,
            from_first,
            subjects: HashMap::default(),
            members: HashMap::default(),
            ready: VecDeque::new(),
            timers: BTreeSet::new(),
            moved: BTreeSet::new(),
            pending: 0,
            in_flight: 0,
            redelivered: 0,
            dead_lettered: 0,
            recent_dead: VecDeque::new(),
        }
    }

    fn per_subject(&self) -> usize {
        self.limits.per_subject.max(1) as usize
    }

    fn ack_wait_ms(&self) -> u64 {
        self.limits.ack_wait_ms
    }

    /// A subject's stored cursor and newest version, at start.
    pub fn restore(&mut self, subject: Arc<str>, acked: u64, head: u64) {
        let mut state = SubjectState::starting_after(acked);
        state.head = head.max(acked);
        self.pending += state.pending();
        self.subjects.insert(Arc::clone(&subject), state);
        self.requeue(&subject, 0);
    }

    /// `version` of `subject` was stored before the group's start (a start time still
    /// ahead): it and everything before it are done without being delivered. A subject
    /// with messages still to deliver takes it as [`Dispatcher::observe`] does.
    pub fn pass_over(&mut self, subject: &Arc<str>, version: u64, now: u64) {
        match self.subjects.get_mut(subject) {
            None => {
                let state = SubjectState::starting_after(version);
                self.subjects.insert(Arc::clone(subject), state);
                self.moved.insert(Arc::clone(subject));
            }
            Some(state) if state.pending() == 0 && state.used() == 0 => {
                if version > state.head {
                    *state = SubjectState::starting_after(version);
                    self.moved.insert(Arc::clone(subject));
                }
            }
            Some(_) => self.observe(subject, version, now),
        }
    }

    /// A message was stored: `version` is the subject's newest.
    pub fn observe(&mut self, subject: &Arc<str>, version: u64, now: u64) {
        let from_first = self.from_first;
        let state = self.subjects.entry(Arc::clone(subject)).or_insert_with(|| {
            SubjectState::starting_after(if from_first {
                0
            } else {
                version.saturating_sub(1)
            })
        });
        if version > state.head {
            self.pending += version - state.head;
            state.head = version;
        }
        self.requeue(subject, now);
    }

    /// A member that may be given messages.
    pub fn join(&mut self, member: MemberId) {
        self.members.entry(member).or_default();
    }

    /// A member that is gone. What it holds stays its own until each ack wait runs
    /// out, since a message it did handle may still be acked; then it goes again, to
    /// whoever is free.
    pub fn leave(&mut self, member: MemberId) {
        if let Some(gone) = self.members.remove(&member) {
            for subject in gone.ready {
                if let Some(state) = self.subjects.get_mut(&subject)
                    && state.queued == Queued::Member(member)
                {
                    state.queued = Queued::No;
                }
            }
        }
    }

    /// Up to `max` messages for `member` at `now`: first more of the subjects it
    /// holds, then subjects nobody holds, oldest ready first.
    pub fn take(&mut self, member: MemberId, max: usize, now: u64) -> Vec<Delivery> {
        let mut out = Vec::new();
        let per_member = self.limits.per_member.max(1);
        let per_subject = self.per_subject();
        let ack_wait = self.ack_wait_ms();
        while out.len() < max {
            let Some(holder) = self.members.get_mut(&member) else {
                break;
            };
            if holder.in_flight >= per_member {
                break;
            }
            let (subject, from) = match holder.ready.pop_front() {
                Some(subject) => (subject, Queued::Member(member)),
                None => match self.ready.pop_front() {
                    Some(subject) => (subject, Queued::Group),
                    None => break,
                },
            };
            let Some(state) = self.subjects.get_mut(&subject) else {
                continue;
            };
            if state.queued != from {
                continue;
            }
            state.queued = Queued::No;
            if state.owner.is_some_and(|owner| owner != member) {
                continue;
            }
            let Some(version) = state.sendable(per_subject, now) else {
                continue;
            };
            let attempt = match state.retry.remove(&version) {
                Some((attempts, _)) => {
                    self.redelivered += 1;
                    attempts + 1
                }
                None => {
                    state.next = version + 1;
                    1
                }
            };
            let due = now.saturating_add(ack_wait);
            state
                .in_flight
                .insert(version, Outstanding { attempt, due });
            state.owner = Some(member);
            self.timers.insert((
                due,
                TimerKind::Deadline,
                Arc::clone(&subject),
                version,
                attempt,
            ));
            self.in_flight += 1;
            if let Some(holder) = self.members.get_mut(&member) {
                holder.in_flight += 1;
            }
            out.push(Delivery {
                subject: Arc::clone(&subject),
                version,
                attempt,
            });
            self.requeue(&subject, now);
        }
        out
    }

    /// The member handled the delivery: the subject's cursor moves over it.
    pub fn ack(&mut self, delivery: &Delivery, now: u64) -> Result<(), AckError> {
        self.release(delivery)?;
        self.finish(&delivery.subject, delivery.version, now);
        Ok(())
    }

    /// The member gives up on this message: it is done without going again.
    pub fn term(&mut self, delivery: &Delivery, now: u64) -> Result<(), AckError> {
        self.ack(delivery, now)
    }

    /// The member could not handle the delivery: it goes again after `delay_ms`, or
    /// to the dead-letter subject if that was its last delivery.
    pub fn nack(
        &mut self,
        delivery: &Delivery,
        delay_ms: u64,
        now: u64,
    ) -> Result<Option<DeadLetter>, AckError> {
        self.release(delivery)?;
        Ok(self.again(
            &delivery.subject,
            delivery.version,
            delivery.attempt,
            now.saturating_add(delay_ms),
            DeadReason::Nacked,
            now,
        ))
    }

    /// The member is still working on it: its ack wait starts again.
    pub fn in_progress(&mut self, delivery: &Delivery, now: u64) -> Result<(), AckError> {
        let due = now.saturating_add(self.ack_wait_ms());
        let state = self
            .subjects
            .get_mut(&delivery.subject)
            .ok_or(AckError::NotOutstanding)?;
        let outstanding = state
            .in_flight
            .get_mut(&delivery.version)
            .filter(|o| o.attempt == delivery.attempt)
            .ok_or(AckError::NotOutstanding)?;
        let old = (
            outstanding.due,
            TimerKind::Deadline,
            Arc::clone(&delivery.subject),
            delivery.version,
            delivery.attempt,
        );
        outstanding.due = due;
        self.timers.remove(&old);
        self.timers
            .insert((due, TimerKind::Deadline, old.2, old.3, old.4));
        Ok(())
    }

    /// Whether `delivery` is still out, waiting for its ack.
    pub fn outstanding(&self, delivery: &Delivery) -> bool {
        self.subjects
            .get(&delivery.subject)
            .and_then(|state| state.in_flight.get(&delivery.version))
            .is_some_and(|o| o.attempt == delivery.attempt)
    }

    /// The message could not be read (removed by retention or a purge before it was
    /// delivered): it is done.
    pub fn gone(&mut self, delivery: &Delivery, now: u64) {
        if self.release(delivery).is_ok() {
            self.finish(&delivery.subject, delivery.version, now);
        }
    }

    /// Runs out the ack waits and delays due at `now`. Returns the messages that used
    /// their last delivery.
    pub fn tick(&mut self, now: u64) -> Vec<DeadLetter> {
        let mut dead = Vec::new();
        while let Some(first) = self.timers.first() {
            if first.0 > now {
                break;
            }
            let Some((_, kind, subject, version, attempt)) = self.timers.pop_first() else {
                break;
            };
            match kind {
                TimerKind::Retry => self.requeue(&subject, now),
                TimerKind::Deadline => {
                    let delivery = Delivery {
                        subject: Arc::clone(&subject),
                        version,
                        attempt,
                    };
                    // The timer is already out of the set; `release` looks for it by
                    // its outstanding entry, which is still there.
                    if self.release(&delivery).is_ok()
                        && let Some(letter) =
                            self.again(&subject, version, attempt, now, DeadReason::Expired, now)
                    {
                        dead.push(letter);
                    }
                }
            }
        }
        dead
    }

    /// When the next ack wait or delay runs out, for the caller's timer.
    pub fn next_due(&self) -> Option<u64> {
        self.timers.first().map(|t| t.0)
    }

    /// Whether any cursor moved since [`Dispatcher::take_cursors`].
    pub fn has_moved(&self) -> bool {
        !self.moved.is_empty()
    }

    /// The subjects whose cursors moved since the last call, with their cursors: what
    /// the store must write.
    pub fn take_cursors(&mut self) -> Vec<(Arc<str>, u64)> {
        let moved = std::mem::take(&mut self.moved);
        moved
            .into_iter()
            .filter_map(|subject| {
                let acked = self.subjects.get(&subject)?.acked;
                Some((subject, acked))
            })
            .collect()
    }

    /// A subject's cursor: every version at or below it is done.
    pub fn cursor(&self, subject: &str) -> Option<u64> {
        self.subjects.get(subject).map(|s| s.acked)
    }

    pub fn stats(&self) -> Stats {
        Stats {
            members: self.members.len(),
            subjects: self.subjects.len(),
            pending: self.pending,
            in_flight: self.in_flight,
            redelivered: self.redelivered,
            dead_lettered: self.dead_lettered,
        }
    }

    /// The `n` subjects with the most pending messages, most first.
    pub fn laggiest(&self, n: usize) -> Vec<(Arc<str>, u64)> {
        let mut lag: Vec<(Arc<str>, u64)> = self
            .subjects
            .iter()
            .map(|(subject, state)| (Arc::clone(subject), state.pending()))
            .filter(|(_, pending)| *pending > 0)
            .collect();
        let most_first =
            |a: &(Arc<str>, u64), b: &(Arc<str>, u64)| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0));
        // The first `n` found in linear time, then only they are sorted.
        if n < lag.len() {
            lag.select_nth_unstable_by(n, most_first);
            lag.truncate(n);
        }
        lag.sort_by(most_first);
        lag
    }

    /// The last messages that went to the dead-letter subject, oldest first.
    pub fn recent_dead_letters(&self) -> impl DoubleEndedIterator<Item = &DeadLetter> {
        self.recent_dead.iter()
    }

    /// Takes `delivery` out of flight if it is the outstanding attempt.
    fn release(&mut self, delivery: &Delivery) -> Result<(), AckError> {
        let state = self
            .subjects
            .get_mut(&delivery.subject)
            .ok_or(AckError::NotOutstanding)?;
        match state.in_flight.get(&delivery.version) {
            Some(o) if o.attempt == delivery.attempt => {}
            _ => return Err(AckError::NotOutstanding),
        }
        let Some(outstanding) = state.in_flight.remove(&delivery.version) else {
            return Err(AckError::NotOutstanding);
        };
        self.timers.remove(&(
            outstanding.due,
            TimerKind::Deadline,
            Arc::clone(&delivery.subject),
            delivery.version,
            delivery.attempt,
        ));
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(owner) = state.owner
            && let Some(member) = self.members.get_mut(&owner)
        {
            member.in_flight = member.in_flight.saturating_sub(1);
        }
        if state.in_flight.is_empty() {
            state.owner = None;
            // Its entry in the old owner's queue is stale now; `requeue` puts it in
            // the group's.
            if matches!(state.queued, Queued::Member(_)) {
                state.queued = Queued::No;
            }
        }
        Ok(())
    }

    /// A released delivery goes again at `not_before`, or is dead-lettered when it
    /// used the last of its deliveries.
    fn again(
        &mut self,
        subject: &Arc<str>,
        version: u64,
        attempts: u32,
        not_before: u64,
        reason: DeadReason,
        now: u64,
    ) -> Option<DeadLetter> {
        let max = self.limits.max_deliveries;
        if max > 0 && attempts >= max {
            let letter = DeadLetter {
                subject: Arc::clone(subject),
                version,
                attempts,
                reason,
            };
            self.dead_lettered += 1;
            if self.recent_dead.len() == RECENT_DEAD {
                self.recent_dead.pop_front();
            }
            self.recent_dead.push_back(letter.clone());
            self.finish(subject, version, now);
            return Some(letter);
        }
        if let Some(state) = self.subjects.get_mut(subject) {
            state.retry.insert(version, (attempts, not_before));
            if not_before > now {
                self.timers.insert((
                    not_before,
                    TimerKind::Retry,
                    Arc::clone(subject),
                    version,
                    attempts,
                ));
            }
        }
        self.requeue(subject, now);
        None
    }

    /// `version` is done: acked, termed, dead-lettered or gone.
    fn finish(&mut self, subject: &Arc<str>, version: u64, now: u64) {
        if let Some(state) = self.subjects.get_mut(subject) {
            let was = state.pending();
            if state.done(version) {
                self.moved.insert(Arc::clone(subject));
            }
            self.pending = self.pending.saturating_sub(was - state.pending());
        }
        self.requeue(subject, now);
    }

    /// Queues a subject that has something to send: with its owner while it has one,
    /// else for any member.
    fn requeue(&mut self, subject: &Arc<str>, now: u64) {
        let per_subject = self.per_subject();
        let Some(state) = self.subjects.get_mut(subject) else {
            return;
        };
        if state.queued != Queued::No {
            return;
        }
        // A retry waiting for its delay is requeued by its timer.
        if state.sendable(per_subject, now).is_none() {
            return;
        }
        match state.owner {
            Some(owner) => {
                // An owner that left keeps the subject until its ack waits run out.
                if let Some(member) = self.members.get_mut(&owner) {
                    state.queued = Queued::Member(owner);
                    member.ready.push_back(Arc::clone(subject));
                }
            }
            None => {
                state.queued = Queued::Group;
                self.ready.push_back(Arc::clone(subject));
            }
        }
    }
}
