//! The running consumer groups: one task per group, which owns the group's
//! [`Dispatcher`], learns of new messages from the sequencer's routing, answers
//! `$CANOPY.group.next` pulls and JetStream's `CONSUMER.MSG.NEXT` pulls (framed as
//! [`jetstream`] says) with messages read from the store, takes the acks published to
//! each delivery's reply subject, and writes the cursors that moved in batches of its
//! own (every [`CURSOR_FLUSH`]).
//!
//! A group costs nothing while idle. At start it reads only its cursors; it walks the
//! store's subjects its pattern matches (its catch-up) only once something asks for
//! it (a pull, an info, a wait), and every catch-up step, server-wide, takes one of
//! [`CATCH_UP`]'s few places in arrival order, so a restart with thousands of groups
//! over a long history reads the store at a steady pace instead of all at once.
//!
//! Must never: block the sequencer (new messages are offered with `try_send`; a full
//! queue marks the group lagging and it rescans its subjects from the store), or hold
//! more than one group's state in one task.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use canopy_protocols::native::HeaderMap;
use canopy_subjects::Pattern;
use parking_lot::RwLock;
use tokio::sync::mpsc;

mod catch_up;
mod delivery;
mod handle;
pub mod jetstream;
mod kept;
mod registry;

pub(in crate::broker) use delivery::delivery_headers;
use delivery::send;
pub use handle::Handed;
use handle::Handle;
use registry::Pace;
pub use registry::{Groups, TenantGroups};

use self::jetstream::{JetStreamPull, Sequences};
use self::kept::{Kept, KeptMessage};
use super::{Broker, Message, RouteScratch, Tenant, Wakes};
use crate::groups::awaiting::{Await, AwaitOutcome, CallerKey, Missed};
use crate::groups::dispatch::{DeadLetter, Delivery, Dispatcher, MemberId};
use crate::groups::{GroupSpec, StartAt, StoredGroup};
use crate::store::{
    AppendRequest, Durability, NewMessage, ReplayFrom, RouteTag, Sequenced, Store, StoreError,
    StoredMessage,
};

/// Deliveries a pull must lack in memory before they are read in one scan.
const READ_AHEAD_MIN: usize = 4;
/// Keys a read-ahead scans per message it wants at most, so a scan through other
/// subjects' history (between the wanted ones, or before their cursors) stays bounded.
const READ_AHEAD_KEYS_PER_MESSAGE: usize = 4;

/// How often moved cursors are written.
pub const CURSOR_FLUSH: Duration = Duration::from_millis(100);
/// Inputs queued for one group before new messages are dropped (and rescanned).
const QUEUE: usize = 4_096;
/// Pulls that may wait for messages at once, per group.
pub const WAITING_PULLS: usize = 1_024;
/// Pulls one connection may have waiting at once, over every group: a connection
/// cannot fill one group's waiting list alone, nor hold one in each of many groups.
pub const CONNECTION_PULLS: usize = 512;
/// Members a group holds at once; a pull from one more is refused until some leave.
const MAX_MEMBERS: usize = 10_000;
/// How long a member may go without pulling before it leaves the group (at least
/// twice the ack wait).
const MEMBER_IDLE: Duration = Duration::from_secs(60);
/// Subjects read per page when the group scans the store.
const SCAN_PAGE: usize = 1_000;
/// Catch-up steps (loading cursors, one page of a scan) running at once, server-wide:
/// the store's reads for catching up are paced here, whatever the number of groups.
static CATCH_UP: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// Where a group's walk over its subjects stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scan {
    /// Nothing asked for it yet (after a start, or a lag while nobody consumed).
    Wanted,
    /// Walking: the next page starts after this subject.
    Walking(Option<String>),
    /// Walked since the start, with no message missed since: a subject it does not
    /// track has no version the group has not seen.
    Done,
}
/// The prefix of every delivery's reply subject: `<prefix><group>.<version>.<attempt>.<subject>`.
pub const ACK_PREFIX: &str = "$CANOPY.group.ack.";

/// A pull for messages.
pub struct Pull {
    pub member: String,
    pub max: usize,
    pub wait: Duration,
    pub reply: String,
    pub routes: Arc<Tenant>,
    pub style: PullStyle,
    /// The pull's place among its connection's waiting pulls, given back when the
    /// pull ends (see [`Groups::pull_place`]).
    pub place: Option<PullPlace>,
}

/// A pull's place among its connection's pulls ([`CONNECTION_PULLS`]).
pub struct PullPlace {
    counts: Arc<parking_lot::Mutex<HashMap<u64, usize>>>,
    connection: u64,
}

impl Drop for PullPlace {
    fn drop(&mut self) {
        let mut counts = self.counts.lock();
        if let Some(n) = counts.get_mut(&self.connection) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.connection);
            }
        }
    }
}

/// How a pull is answered.
pub enum PullStyle {
    /// `$CANOPY.group.next`: what is ready (or, when nothing is, the first messages
    /// within the wait), each with Canopy's headers and ack subject, then `Canopy-Done`.
    Canopy,
    /// JetStream's `CONSUMER.MSG.NEXT`: messages as they come until the batch is full
    /// or the wait is over, each under its own subject with a `$JS.ACK.` reply, and a
    /// status message for a pull that ends unfilled.
    JetStream {
        /// The stream name acks carry (the tenant's).
        stream: Arc<str>,
        terms: JetStreamPull,
    },
}

/// A JetStream ack: the consumer sequence its subject names, and what it says.
pub struct JetStreamReply {
    pub consumer_seq: u64,
    pub kind: ReplyKind,
    pub confirm: Option<(String, Arc<Tenant>)>,
}

/// A pull that waits for messages.
struct Waiting {
    pull: Pull,
    until: tokio::time::Instant,
    /// Messages and payload bytes sent so far (JetStream pulls fill over time).
    sent: usize,
    bytes: usize,
    next_heartbeat: Option<tokio::time::Instant>,
}

impl Waiting {
    /// When the group must next look at this pull, messages or not.
    fn due(&self) -> tokio::time::Instant {
        self.next_heartbeat
            .map_or(self.until, |beat| beat.min(self.until))
    }
}

/// An ack, nack, in-progress or term, as published to a delivery's reply subject.
pub struct Reply {
    pub subject: Arc<str>,
    pub version: u64,
    pub attempt: u32,
    pub kind: ReplyKind,
    /// Where to confirm it once the group has taken it (JetStream's synchronous ack):
    /// an empty message, or an error when the delivery was not outstanding.
    pub confirm: Option<(String, Arc<Tenant>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKind {
    Ack,
    Nack { delay_ms: u64 },
    InProgress,
    Term,
}

impl ReplyKind {
    /// JetStream's ack vocabulary: `+ACK` (or an empty body), `-NAK` (optionally
    /// `-NAK {"delay": <nanoseconds>}`), `+WPI`, `+TERM`.
    pub fn parse(body: &[u8]) -> Option<ReplyKind> {
        let text = std::str::from_utf8(body).ok()?.trim();
        match text {
            "" | "+ACK" => Some(ReplyKind::Ack),
            "+WPI" => Some(ReplyKind::InProgress),
            // `+NXT` asks for the next message too; the ack is what counts here.
            "+NXT" => Some(ReplyKind::Ack),
            term if term.starts_with("+TERM") => Some(ReplyKind::Term),
            "-NAK" => Some(ReplyKind::Nack { delay_ms: 0 }),
            nak if nak.starts_with("-NAK") => {
                let options: serde_json::Value =
                    serde_json::from_str(nak.trim_start_matches("-NAK").trim()).ok()?;
                let nanos = options.get("delay").and_then(serde_json::Value::as_u64)?;
                Some(ReplyKind::Nack {
                    delay_ms: nanos / 1_000_000,
                })
            }
            _ => None,
        }
    }
}

/// What the sequencer hands a group with a message it routed.
struct Observed {
    offset: u64,
    time_ms: u64,
    headers: Bytes,
    payload: Bytes,
}

enum Input {
    /// A stored message the sequencer routed: its subject, version and the message
    /// itself (shared with the sequencer's request until the group copies it).
    Observed(Arc<str>, u64, Observed),
    Pull(Pull),
    Reply(Reply),
    JetStreamReply(JetStreamReply),
    /// Live counts; with `laggiest`, the laggiest subjects too (a walk over every
    /// subject the group tracks, so JetStream's frequent info calls go without).
    Info {
        answer: tokio::sync::oneshot::Sender<serde_json::Value>,
        laggiest: bool,
    },
    Await(Waiter),
}

/// A publish (or a `group.wait`) waiting for the group to pass `version` of `subject`.
struct Waiter {
    subject: Arc<str>,
    version: u64,
    /// Where in the waiting publish's list of groups this group is.
    slot: usize,
    tx: mpsc::Sender<(usize, Result<(), Missed>)>,
}

impl Waiter {
    fn answer(&self, result: Result<(), Missed>) {
        // Room for every group's answer was made; a closed channel means the wait is over.
        let _ = self.tx.try_send((self.slot, result));
    }
}

/// Publishes waiting for groups, per tenant, at once.
const MAX_WAITING: usize = 10_000;
/// Of those, one user's (or one connection's, without a user): so one user cannot
/// take every place of its tenant.
pub const CALLER_WAITING: usize = 1_000;

/// Subjects `info` lists as the laggiest, and dead letters as the last parked.
const INFO_SUBJECTS: usize = 10;

/// How a pull's answer ends, or (a heartbeat) a sign that it goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndOfPull {
    /// A Canopy pull's answer is complete.
    Done,
    /// A JetStream pull got its whole batch: nothing more is said.
    Filled,
    /// A JetStream pull that must not wait found nothing.
    NoMessages,
    /// A JetStream pull's wait ran out before its batch was full.
    TimedOut,
    /// A JetStream pull found the group's waiting list full.
    TooManyWaiting,
    /// The group was deleted or stopped while the pull waited.
    Deleted,
    /// A JetStream pull that waits on is still alive.
    Heartbeat,
}

/// One running group.
struct GroupTask {
    tenant: Arc<str>,
    spec: GroupSpec,
    /// When the group was created: where `start: new` begins.
    created_ms: u64,
    pattern: Pattern,
    dispatcher: Dispatcher,
    broker: Weak<Broker>,
    store: Arc<Store>,
    lagging: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
    /// Member names to ids, with when each last pulled.
    members: HashMap<String, (MemberId, tokio::time::Instant)>,
    next_member: MemberId,
    waiting: VecDeque<Waiting>,
    /// Consumer sequences of the deliveries made to JetStream pulls.
    sequences: Sequences,
    /// The tenant offset of the newest message delivered (JetStream's stream sequence).
    last_offset: u64,
    /// Messages routed, not yet known durable.
    observed: Vec<(Arc<str>, u64, Observed)>,
    /// Messages held for their delivery, so it reads nothing.
    kept: Kept,
    /// Publishes waiting for the group to pass a version, by subject.
    awaits: HashMap<Arc<str>, Vec<Waiter>>,
    /// Subjects whose cursor may have moved this turn, while anything waits.
    touched: Vec<Arc<str>>,
    clock: crate::clock::Clock,
    scan: Scan,
    pace: Pace,
}

impl GroupTask {
    async fn run(mut self, mut rx: mpsc::Receiver<Input>) {
        if let Err(error) = self.load().await {
            tracing::error!(tenant = %self.tenant, group = %self.spec.name, %error, "a group could not load its cursors; it does not run");
            return;
        }
        let mut flush = tokio::time::interval(CURSOR_FLUSH);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        'run: loop {
            // The walk over the store's subjects, a page per turn, so pulls and acks
            // are answered while a large group is still finding its subjects.
            if matches!(self.scan, Scan::Walking(_)) {
                self.walk_one_page().await;
                for _ in 0..QUEUE {
                    match rx.try_recv() {
                        Ok(input) => self.take_demanded(input).await,
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        // Deleted while still walking: its pulls are ended below.
                        Err(mpsc::error::TryRecvError::Disconnected) => break 'run,
                    }
                }
                self.take_observed().await;
                self.serve_waiting().await;
                self.settle_awaits();
                continue;
            }
            let now = self.clock.now_ms();
            let due = self
                .dispatcher
                .next_due()
                .map(|at| Duration::from_millis(at.saturating_sub(now)))
                .into_iter()
                .chain(
                    self.waiting
                        .iter()
                        .map(Waiting::due)
                        .min()
                        .map(|at| at.saturating_duration_since(tokio::time::Instant::now())),
                )
                .min()
                .unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                input = rx.recv() => match input {
                    Some(input) => {
                        self.take_demanded(input).await;
                        // Take what else is queued, so one durable barrier below
                        // covers a whole burst of new messages, not one each.
                        for _ in 0..QUEUE {
                            let Ok(input) = rx.try_recv() else { break };
                            self.take_demanded(input).await;
                        }
                    }
                    None => break,
                },
                _ = tokio::time::sleep(due) => {
                    let dead = self.dispatcher.tick(self.clock.now_ms());
                    self.dead_letters(dead).await;
                }
                // An idle group has nothing to flush, forget or prune: it does not
                // wake at all, so thousands of them cost nothing.
                _ = flush.tick(), if self.has_housekeeping() => {
                    self.flush().await;
                    self.forget_idle_members();
                    self.sequences.prune(&self.dispatcher);
                    self.awaits.retain(|_, waiters| {
                        waiters.retain(|w| !w.tx.is_closed());
                        !waiters.is_empty()
                    });
                }
            }
            self.take_observed().await;
            if self.lagging.swap(false, Ordering::AcqRel) {
                // Messages were dropped: walk again, now if anyone consumes, else
                // when someone asks.
                self.scan = if self.members.is_empty() && self.waiting.is_empty() {
                    Scan::Wanted
                } else {
                    Scan::Walking(None)
                };
            }
            self.serve_waiting().await;
            self.settle_awaits();
        }
        self.flush().await;
        for waiting in std::mem::take(&mut self.waiting) {
            self.end(&waiting.pull, 0, EndOfPull::Deleted);
        }
    }

    /// Whether the periodic flush has anything to do: cursors that moved, members
    /// that may go idle, deliveries' sequences to prune, waits to drop.
    fn has_housekeeping(&self) -> bool {
        self.dispatcher.has_moved()
            || !self.members.is_empty()
            || !self.sequences.is_empty()
            || !self.awaits.is_empty()
    }

    /// Takes an input; one that needs the group's subjects (a pull, an info, a
    /// wait) starts the walk over them if it has not run since the start, with its
    /// first page read before the input is answered.
    async fn take_demanded(&mut self, input: Input) {
        if self.scan == Scan::Wanted
            && matches!(input, Input::Pull(_) | Input::Info { .. } | Input::Await(_))
        {
            self.scan = Scan::Walking(None);
            self.walk_one_page().await;
        }
        self.take_input(input).await;
    }

    async fn take_input(&mut self, input: Input) {
        let now = self.clock.now_ms();
        match input {
            Input::Observed(subject, version, message) => {
                self.observed.push((subject, version, message));
            }
            Input::Pull(pull) => self.take_pull(pull).await,
            Input::Info { answer, laggiest } => {
                let _ = answer.send(self.info(laggiest));
            }
            Input::Await(waiter) => self.take_waiter(waiter),
            Input::Reply(reply) => {
                let delivery = Delivery {
                    subject: Arc::clone(&reply.subject),
                    version: reply.version,
                    attempt: reply.attempt,
                };
                self.settle(&delivery, reply.kind, reply.confirm, now).await;
            }
            Input::JetStreamReply(reply) => self.take_jetstream_reply(reply, now).await,
        }
    }

    /// A pull: answered now with what is ready, then ended, or kept waiting.
    async fn take_pull(&mut self, pull: Pull) {
        if !self.members.contains_key(&pull.member) && self.members.len() >= MAX_MEMBERS {
            self.refuse(
                &pull,
                &format!("the group has {MAX_MEMBERS} members already; retry later"),
            );
            return;
        }
        // Messages routed before the pull came are its to take: a publish
        // acked before a fetch is in the fetch, as in JetStream.
        self.take_observed().await;
        let (sent, bytes) = self.answer(&pull, pull.max).await;
        let jetstream = match &pull.style {
            PullStyle::JetStream { terms, .. } => Some(terms.clone()),
            PullStyle::Canopy => None,
        };
        let filled = sent >= pull.max
            || jetstream
                .as_ref()
                .is_some_and(|t| t.max_bytes > 0 && bytes >= t.max_bytes);
        // A Canopy pull, and a JetStream one with `no_wait`, waits only for its
        // first messages (a `no_wait` one without `expires` not at all); any
        // other JetStream pull waits until it is filled.
        let waits = match &jetstream {
            None => sent == 0 && !pull.wait.is_zero(),
            Some(terms) if terms.no_wait => sent == 0 && !pull.wait.is_zero(),
            Some(_) => !filled && !pull.wait.is_zero(),
        };
        if !waits {
            let end = match (&jetstream, filled) {
                (None, _) => EndOfPull::Done,
                (Some(_), true) => EndOfPull::Filled,
                (Some(terms), false) if terms.no_wait => EndOfPull::NoMessages,
                (Some(_), false) => EndOfPull::TimedOut,
            };
            self.end(&pull, sent, end);
        } else if self.waiting.len() >= WAITING_PULLS {
            match jetstream {
                // It sent nothing (it would not wait otherwise): refused.
                None => self.refuse_with(
                    &pull,
                    429,
                    &format!(
                        "group {} has {WAITING_PULLS} pulls waiting already; retry \
                         later, or pull without waiting",
                        self.spec.name
                    ),
                ),
                Some(_) => self.end(&pull, sent, EndOfPull::TooManyWaiting),
            }
        } else {
            let now = tokio::time::Instant::now();
            let next_heartbeat = jetstream.and_then(|t| t.heartbeat).map(|every| now + every);
            self.waiting.push_back(Waiting {
                until: now + pull.wait,
                pull,
                sent,
                bytes,
                next_heartbeat,
            });
        }
    }

    /// The group's live counts, and with `laggiest` its laggiest subjects.
    fn info(&self, laggiest: bool) -> serde_json::Value {
        let stats = self.dispatcher.stats();
        let laggiest = if laggiest {
            self.dispatcher.laggiest(INFO_SUBJECTS)
        } else {
            Vec::new()
        };
        let laggiest: Vec<_> = laggiest
            .into_iter()
            .map(|(subject, pending)| serde_json::json!({"subject": &*subject, "pending": pending}))
            .collect();
        let dead: Vec<_> = self
            .dispatcher
            .recent_dead_letters()
            .rev()
            .take(INFO_SUBJECTS)
            .map(|d| {
                serde_json::json!({"subject": &*d.subject, "version": d.version,
                    "attempts": d.attempts, "reason": d.reason.as_str()})
            })
            .collect();
        serde_json::json!({
            "members": stats.members,
            "tracked_subjects": stats.subjects,
            "pending": stats.pending,
            "in_flight": stats.in_flight,
            "redelivered": stats.redelivered,
            "dead_lettered": stats.dead_lettered,
            "laggiest": laggiest,
            "dead_letters": dead,
            "waiting_pulls": self.waiting.len(),
            "consumer_seq": self.sequences.last(),
            "ack_floor_seq": self.sequences.ack_floor().0,
            "ack_floor_offset": self.sequences.ack_floor().1,
            "last_offset": self.last_offset,
        })
    }

    /// A publish waiting for the group to pass a version: answered now when it has (or
    /// cannot, with no members), else kept with its subject.
    fn take_waiter(&mut self, waiter: Waiter) {
        let passed = self
            .dispatcher
            .cursor(&waiter.subject)
            .is_some_and(|cursor| cursor >= waiter.version);
        if passed {
            waiter.answer(Ok(()));
        } else if self.members.is_empty() {
            waiter.answer(Err(Missed::NoMembers));
        } else {
            self.awaits
                .entry(Arc::clone(&waiter.subject))
                .or_default()
                .push(waiter);
        }
    }

    /// A JetStream ack, which names only the consumer sequence of its delivery.
    async fn take_jetstream_reply(&mut self, reply: JetStreamReply, now: u64) {
        let Some(delivery) = self.sequences.get(reply.consumer_seq).cloned() else {
            if let Some((to, routes)) = &reply.confirm
                && let Some(broker) = self.broker.upgrade()
            {
                broker.refuse(
                    routes,
                    to,
                    409,
                    "the delivery is not outstanding: it was acked, or its ack wait ran out",
                );
            }
            return;
        };
        if !matches!(reply.kind, ReplyKind::InProgress) {
            self.sequences.settle(reply.consumer_seq);
        }
        self.settle(&delivery, reply.kind, reply.confirm, now).await;
    }

    /// Takes an ack, nack, in-progress or term of `delivery`, and confirms it where
    /// the member asked.
    async fn settle(
        &mut self,
        delivery: &Delivery,
        kind: ReplyKind,
        confirm: Option<(String, Arc<Tenant>)>,
        now: u64,
    ) {
        if !self.awaits.is_empty() {
            self.touched.push(Arc::clone(&delivery.subject));
        }
        let dead = match kind {
            ReplyKind::Ack => self.dispatcher.ack(delivery, now).map(|()| None),
            ReplyKind::Term => self.dispatcher.term(delivery, now).map(|()| None),
            ReplyKind::InProgress => self.dispatcher.in_progress(delivery, now).map(|()| None),
            ReplyKind::Nack { delay_ms } => self.dispatcher.nack(delivery, delay_ms, now),
        };
        // A dead letter is stored before the nack that made it is confirmed.
        if let Ok(Some(letter)) = &dead {
            self.dead_letters(vec![letter.clone()]).await;
        }
        if let Some((to, routes)) = &confirm
            && let Some(broker) = self.broker.upgrade()
        {
            match &dead {
                Ok(_) => send(&broker, routes, to, None, None, b""),
                Err(error) => broker.refuse(routes, to, 409, &error.to_string()),
            }
        }
    }

    fn member(&mut self, name: &str) -> MemberId {
        let now = tokio::time::Instant::now();
        let next = self.next_member;
        let entry = self.members.entry(name.to_owned()).or_insert((next, now));
        entry.1 = now;
        let id = entry.0;
        if id == next {
            self.next_member += 1;
        }
        self.dispatcher.join(id);
        id
    }

    /// Members that have not pulled for [`MEMBER_IDLE`] and twice the ack wait leave:
    /// what they hold goes again when its ack wait runs out.
    fn forget_idle_members(&mut self) {
        let idle = MEMBER_IDLE.max(Duration::from_millis(
            self.spec.ack_wait_ms.saturating_mul(2),
        ));
        let now = tokio::time::Instant::now();
        let dispatcher = &mut self.dispatcher;
        self.members.retain(|_, (id, last)| {
            let keep = now.saturating_duration_since(*last) < idle;
            if !keep {
                dispatcher.leave(*id);
            }
            keep
        });
        // Nobody is left to pass what publishes wait for: they are answered now.
        if self.members.is_empty() {
            for waiter in self.awaits.drain().flat_map(|(_, waiters)| waiters) {
                waiter.answer(Err(Missed::NoMembers));
            }
        }
    }

    /// Answers the waits on subjects whose cursor moved past their version.
    fn settle_awaits(&mut self) {
        for subject in std::mem::take(&mut self.touched) {
            let Some(cursor) = self.dispatcher.cursor(&subject) else {
                continue;
            };
            let Some(waiters) = self.awaits.get_mut(&subject) else {
                continue;
            };
            waiters.retain(|waiter| {
                let passed = cursor >= waiter.version;
                if passed {
                    waiter.answer(Ok(()));
                }
                !passed
            });
            if waiters.is_empty() {
                self.awaits.remove(&subject);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::handle::OVERFLOW;
    use super::*;

    fn ack(version: u64) -> Input {
        Input::Reply(Reply {
            subject: Arc::from("orders.1"),
            version,
            attempt: 1,
            kind: ReplyKind::Ack,
            confirm: None,
        })
    }

    /// A group's handle over `orders.>` with a queue of `room`, and the queue.
    fn orders_group(room: usize) -> (Arc<Handle>, mpsc::Receiver<Input>) {
        let (tx, rx) = mpsc::channel(room);
        let handle = Arc::new(Handle {
            name: "g".into(),
            pattern: Pattern::parse_native("orders.>").unwrap(),
            text: Arc::from("orders.>"),
            tx,
            lagging: Arc::default(),
            stopped: Arc::default(),
            overflow: parking_lot::Mutex::default(),
            tap: parking_lot::Mutex::default(),
            task: parking_lot::Mutex::default(),
        });
        (handle, rx)
    }

    #[test]
    fn a_group_follows_its_tenants_log_and_lags_when_its_queue_is_full() {
        let (handle, mut rx) = orders_group(1);
        let taps = Arc::new(crate::follow::Taps::default());
        *handle.tap.lock() = Some(taps.register(
            &handle.pattern,
            Arc::clone(&handle) as Arc<dyn crate::follow::Tap>,
        ));
        let (headers, payload) = (Bytes::new(), Bytes::from_static(b"x"));
        let route = RouteTag::default();
        let message = |subject, offset| Sequenced {
            tenant: "t",
            subject,
            version: 1,
            offset,
            time_ms: 0,
            flags: 0,
            headers: &headers,
            payload: &payload,
            route: &route,
        };
        taps.offer(&message("other.1", 1));
        taps.offer(&message("orders.1", 2));
        assert!(!handle.lagging.load(Ordering::Acquire));
        let Ok(Input::Observed(subject, _, observed)) = rx.try_recv() else {
            panic!("orders.1 was offered");
        };
        assert_eq!((&*subject, observed.offset), ("orders.1", 2));
        taps.offer(&message("orders.2", 3));
        taps.offer(&message("orders.3", 4));
        assert!(
            handle.lagging.swap(false, Ordering::AcqRel),
            "a full queue: lagging"
        );
        taps.lost();
        assert!(
            handle.lagging.load(Ordering::Acquire),
            "a lost write: lagging"
        );
        handle.stop();
        assert!(taps.is_empty(), "a stopped group follows nothing");
    }

    #[tokio::test]
    async fn acks_past_a_full_queue_arrive_in_order_and_a_bounded_overflow_says_busy() {
        let (handle, mut rx) = orders_group(2);
        // Nobody reads yet: two fit the queue, the rest wait in the overflow, and
        // past its bound an ack is refused rather than held without limit.
        let total = 2 + OVERFLOW as u64;
        for version in 1..=total {
            assert_eq!(handle.offer(ack(version)), Handed::Queued, "{version}");
        }
        assert_eq!(handle.offer(ack(total + 1)), Handed::Busy);
        // Half are read, more come behind the rest: every ack arrives once, in the
        // order it was offered, none overtaking the overflow.
        let mut seen = Vec::new();
        let read = |seen: &mut Vec<u64>, rx: &mut mpsc::Receiver<Input>| {
            let Ok(Input::Reply(reply)) = rx.try_recv() else {
                return false;
            };
            seen.push(reply.version);
            true
        };
        while (seen.len() as u64) < total / 2 {
            if !read(&mut seen, &mut rx) {
                tokio::task::yield_now().await;
            }
        }
        for version in total + 2..total + 12 {
            assert_eq!(handle.offer(ack(version)), Handed::Queued, "{version}");
        }
        let expected: Vec<u64> = (1..=total).chain(total + 2..total + 12).collect();
        while seen.len() < expected.len() {
            if !read(&mut seen, &mut rx) {
                tokio::task::yield_now().await;
            }
        }
        assert!(seen == expected, "acks were reordered or lost");
        drop(rx);
        // A group that is gone is said to be not running.
        tokio::task::yield_now().await;
        assert_eq!(handle.offer(ack(1)), Handed::NotRunning);
    }
}
