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
use canopy_subjects::{Pattern, Trie};
use parking_lot::RwLock;
use tokio::sync::mpsc;

pub mod jetstream;
mod kept;

use self::jetstream::{JetStreamPull, Sequences};
use self::kept::{Kept, KeptMessage};
use super::{Broker, Message, RouteScratch, TenantRoutes, Wakes};
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
    pub routes: Arc<TenantRoutes>,
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
    pub confirm: Option<(String, Arc<TenantRoutes>)>,
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
    pub confirm: Option<(String, Arc<TenantRoutes>)>,
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

struct Handle {
    name: String,
    pattern: Pattern,
    /// The pattern as given, for a caller's right to read the group.
    text: Arc<str>,
    tx: mpsc::Sender<Input>,
    lagging: Arc<AtomicBool>,
    /// Set when the group is deleted or replaced: its task writes no more cursors,
    /// which would outlive the group's deletion.
    stopped: Arc<AtomicBool>,
    /// Acks that found the queue full, in the order they came.
    overflow: parking_lot::Mutex<Overflow>,
}

/// Inputs waiting for room in a group's queue, and whether a task is moving them in.
#[derive(Default)]
struct Overflow {
    queued: VecDeque<Input>,
    /// The subjects and reply subjects those inputs carry, in bytes.
    bytes: usize,
    draining: bool,
}

/// Acks one group holds beyond its queue at most; more are refused as busy.
const OVERFLOW: usize = 65_536;
/// And the bytes of their subjects at most (an ack names a subject of up to the
/// subject limit, and a confirmation's reply subject).
const OVERFLOW_BYTES: usize = 8 << 20;

/// The bytes an input in the overflow holds beyond its fixed size.
fn weight(input: &Input) -> usize {
    let confirm =
        |c: &Option<(String, Arc<TenantRoutes>)>| c.as_ref().map_or(0, |(to, _)| to.len());
    match input {
        Input::Reply(reply) => reply.subject.len() + confirm(&reply.confirm),
        Input::JetStreamReply(reply) => confirm(&reply.confirm),
        _ => 0,
    }
}

/// How [`Groups::reply`] and [`Groups::jetstream_reply`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handed {
    /// The group has it, or will in the order it came.
    Queued,
    /// No such group is running.
    NotRunning,
    /// The group is this far behind: the ack was dropped (the delivery goes again
    /// after its ack wait).
    Busy,
    /// The caller may not read the group: the ack was dropped.
    Denied,
}

impl Handle {
    /// Queues `input` without waiting (see [`Groups::reply`]).
    fn offer(self: &Arc<Self>, input: Input) -> Handed {
        let mut overflow = self.overflow.lock();
        let input = if overflow.queued.is_empty() {
            match self.tx.try_send(input) {
                Ok(()) => return Handed::Queued,
                Err(mpsc::error::TrySendError::Closed(_)) => return Handed::NotRunning,
                Err(mpsc::error::TrySendError::Full(input)) => input,
            }
        } else if overflow.queued.len() >= OVERFLOW || overflow.bytes >= OVERFLOW_BYTES {
            return Handed::Busy;
        } else {
            input
        };
        overflow.bytes += weight(&input);
        overflow.queued.push_back(input);
        if !std::mem::replace(&mut overflow.draining, true) {
            tokio::spawn(Arc::clone(self).drain());
        }
        Handed::Queued
    }

    /// Moves the overflow into the queue as it has room, oldest first. A hand-off
    /// finds the overflow empty only once its last input is in the queue, so nothing
    /// overtakes what came before it.
    async fn drain(self: Arc<Self>) {
        loop {
            let Ok(permit) = self.tx.reserve().await else {
                let mut overflow = self.overflow.lock();
                overflow.queued.clear();
                overflow.bytes = 0;
                overflow.draining = false;
                return;
            };
            let mut overflow = self.overflow.lock();
            match overflow.queued.pop_front() {
                Some(input) => {
                    overflow.bytes = overflow.bytes.saturating_sub(weight(&input));
                    permit.send(input);
                }
                None => {
                    overflow.draining = false;
                    return;
                }
            }
        }
    }
}

#[derive(Default)]
struct TenantGroups {
    trie: Trie<usize>,
    list: Vec<Arc<Handle>>,
}

/// Every running group, by tenant.
#[derive(Default)]
pub struct Groups {
    tenants: RwLock<HashMap<Arc<str>, Arc<TenantGroups>>>,
    /// Whether any tenant has a running group: every stored message asks.
    any: AtomicBool,
    /// Publishes waiting for groups, per tenant (bounded by [`MAX_WAITING`]).
    waiting: parking_lot::Mutex<HashMap<Arc<str>, Arc<AtomicUsize>>>,
    /// The same, per caller (bounded by [`CALLER_WAITING`]); a caller without waits
    /// has no entry.
    callers: Arc<parking_lot::Mutex<HashMap<CallerKey, usize>>>,
    /// Pulls handed to groups and not yet ended, per connection (bounded by
    /// [`CONNECTION_PULLS`]); a connection without any has no entry.
    pulls: Arc<parking_lot::Mutex<HashMap<u64, usize>>>,
    /// Each tenant's one place in the server's catch-up line (see [`Pace`]), while
    /// some of its groups hold it.
    paces: parking_lot::Mutex<HashMap<Arc<str>, std::sync::Weak<tokio::sync::Semaphore>>>,
}

/// A group's turn at catching up: first its tenant's one place, then one of the
/// server's [`CATCH_UP`] places. A tenant thus has at most one step in the server's
/// line at a time, so one tenant's thousand groups take turns among themselves and
/// another tenant's first pull waits for at most one step of each other tenant.
#[derive(Clone)]
struct Pace {
    tenant: Arc<tokio::sync::Semaphore>,
}

impl Pace {
    async fn step(
        &self,
    ) -> (
        Option<tokio::sync::SemaphorePermit<'static>>,
        Option<tokio::sync::OwnedSemaphorePermit>,
    ) {
        let tenant = Arc::clone(&self.tenant).acquire_owned().await.ok();
        (CATCH_UP.acquire().await.ok(), tenant)
    }
}

/// Gives a waiting publish's places (its tenant's and its caller's) back when its
/// wait ends.
struct WaitingPlace {
    tenant: Arc<AtomicUsize>,
    callers: Arc<parking_lot::Mutex<HashMap<CallerKey, usize>>>,
    caller: CallerKey,
}

impl Drop for WaitingPlace {
    fn drop(&mut self) {
        self.tenant.fetch_sub(1, Ordering::AcqRel);
        let mut callers = self.callers.lock();
        if let Some(n) = callers.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                callers.remove(&self.caller);
            }
        }
    }
}

impl Groups {
    /// Offers a stored message to the tenant's groups whose pattern matches it. Never
    /// waits: a group whose queue is full is marked lagging and rescans the store.
    pub fn observe(&self, message: &Sequenced<'_>) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let (tenant, subject, version) = (message.tenant, message.subject, message.version);
        let Some(groups) = self.tenants.read().get(tenant).cloned() else {
            return;
        };
        let mut subject_arc: Option<Arc<str>> = None;
        groups.trie.for_each_match(subject, &mut |plain, _| {
            for &i in plain {
                let Some(handle) = groups.list.get(i) else {
                    continue;
                };
                let name = Arc::clone(subject_arc.get_or_insert_with(|| Arc::from(subject)));
                let observed = Observed {
                    offset: message.offset,
                    time_ms: message.time_ms,
                    headers: message.headers.clone(),
                    payload: message.payload.clone(),
                };
                if handle
                    .tx
                    .try_send(Input::Observed(name, version, observed))
                    .is_err()
                {
                    handle.lagging.store(true, Ordering::Release);
                }
            }
        });
    }

    fn handle(&self, tenant: &str, group: &str) -> Option<Arc<Handle>> {
        let groups = self.tenants.read().get(tenant).cloned()?;
        groups.list.iter().find(|h| h.name == group).cloned()
    }

    /// Queues `input` for a running group; false when it is not running.
    async fn send_to(&self, tenant: &str, group: &str, input: Input) -> bool {
        match self.handle(tenant, group) {
            Some(handle) => handle.tx.send(input).await.is_ok(),
            None => false,
        }
    }

    /// Hands a pull to its group; false when the group is not running.
    pub async fn pull(&self, tenant: &str, group: &str, pull: Pull) -> bool {
        self.send_to(tenant, group, Input::Pull(pull)).await
    }

    /// A place for one more pull of `connection` that may wait, or `None` when it has
    /// [`CONNECTION_PULLS`] already.
    pub fn pull_place(&self, connection: u64) -> Option<PullPlace> {
        let mut pulls = self.pulls.lock();
        let n = pulls.entry(connection).or_default();
        if *n >= CONNECTION_PULLS {
            return None;
        }
        *n += 1;
        Some(PullPlace {
            counts: Arc::clone(&self.pulls),
            connection,
        })
    }

    /// A running group's live counts: members, pending, in flight, redelivered, dead
    /// letters, the last dead letters and, with `laggiest`, the laggiest subjects.
    pub async fn info(
        &self,
        tenant: &str,
        group: &str,
        laggiest: bool,
    ) -> Option<serde_json::Value> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let input = Input::Info {
            answer: tx,
            laggiest,
        };
        if !self.send_to(tenant, group, input).await {
            return None;
        }
        rx.await.ok()
    }

    /// Queues `input` for a running group without waiting: into its queue when there
    /// is room, so an ack costs no task; behind the group's overflow otherwise, which
    /// one task moves into the queue in order, so one connection's acks reach the
    /// group in the order it sent them.
    /// Only when `may_read` allows the group's pattern: an ack needs the right a
    /// pull needs, checked here, on the group it goes to, without reading the store.
    fn hand(
        &self,
        tenant: &str,
        group: &str,
        may_read: impl FnOnce(&str) -> bool,
        input: Input,
    ) -> Handed {
        match self.handle(tenant, group) {
            Some(handle) if !may_read(&handle.text) => Handed::Denied,
            Some(handle) => handle.offer(input),
            None => Handed::NotRunning,
        }
    }

    /// Hands an ack (or nack, in-progress, term) to its group, if `may_read` allows
    /// the group's pattern.
    pub fn reply(
        &self,
        tenant: &str,
        group: &str,
        may_read: impl FnOnce(&str) -> bool,
        reply: Reply,
    ) -> Handed {
        self.hand(tenant, group, may_read, Input::Reply(reply))
    }

    /// Hands a JetStream ack to its group, if `may_read` allows the group's pattern.
    pub fn jetstream_reply(
        &self,
        tenant: &str,
        group: &str,
        may_read: impl FnOnce(&str) -> bool,
        reply: JetStreamReply,
    ) -> Handed {
        self.hand(tenant, group, may_read, Input::JetStreamReply(reply))
    }

    /// Calls `answer` once every group in `awaiting` has passed `version` of `subject`
    /// (acked or ended it), or at once for a group that cannot (unknown, not matching
    /// the subject, without live members), or when the wait runs out: with the groups
    /// that passed and those that did not. Never waits itself. A group the wait's
    /// caller may not read is answered as unknown, whatever it is; a wait counts
    /// against its tenant's places and its caller's.
    pub fn await_passing(
        &self,
        tenant: &str,
        subject: Arc<str>,
        version: u64,
        awaiting: &Await,
        answer: impl FnOnce(AwaitOutcome) + Send + 'static,
    ) {
        let parsed = canopy_subjects::Subject::parse_native(&subject).ok();
        let mut slots: Vec<Slot> = Vec::new();
        let mut targets = Vec::new();
        let caller = awaiting.caller.as_ref();
        for name in &awaiting.groups {
            let readable = self
                .handle(tenant, name)
                .filter(|handle| caller.is_some_and(|c| c.may_read(&handle.text)));
            let result = match readable {
                None => Some(Err(Missed::NoSuchGroup)),
                Some(handle)
                    if !parsed
                        .as_ref()
                        .is_some_and(|subject| handle.pattern.matches(subject)) =>
                {
                    Some(Err(Missed::NotMatching))
                }
                Some(handle) => {
                    targets.push((slots.len(), handle));
                    None
                }
            };
            slots.push((name.clone(), result));
        }
        // A caller is there whenever a group is a target.
        let (false, Some(caller)) = (targets.is_empty(), caller) else {
            answer(outcome_of(slots, Missed::TimedOut));
            return;
        };
        let Some(place) = self.waiting_place(tenant, caller.key()) else {
            answer(outcome_of(slots, Missed::TooManyWaiting));
            return;
        };
        let deadline = tokio::time::Instant::now() + awaiting.timeout;
        tokio::spawn(async move {
            let _place = place;
            let (tx, mut rx) = mpsc::channel(targets.len());
            let mut left = targets.len();
            for (slot, handle) in targets {
                let waiter = Waiter {
                    subject: Arc::clone(&subject),
                    version,
                    slot,
                    tx: tx.clone(),
                };
                let sent = tokio::time::timeout_at(deadline, handle.tx.send(Input::Await(waiter)));
                if !matches!(sent.await, Ok(Ok(()))) {
                    slots[slot].1 = Some(Err(Missed::Stopped));
                    left -= 1;
                }
            }
            drop(tx);
            let mut unanswered = Missed::TimedOut;
            while left > 0 {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some((slot, result))) => {
                        if slots[slot].1.replace(result).is_none() {
                            left -= 1;
                        }
                    }
                    // Every group that held the wait is gone.
                    Ok(None) => {
                        unanswered = Missed::Stopped;
                        break;
                    }
                    Err(_) => break,
                }
            }
            answer(outcome_of(slots, unanswered));
        });
    }

    /// A place for one more wait of `caller` in `tenant`, or `None` when either has
    /// all it may.
    fn waiting_place(&self, tenant: &str, caller: CallerKey) -> Option<WaitingPlace> {
        let count = Arc::clone(self.waiting.lock().entry(Arc::from(tenant)).or_default());
        if count.fetch_add(1, Ordering::AcqRel) >= MAX_WAITING {
            count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let mut callers = self.callers.lock();
        let n = callers.entry(caller.clone()).or_default();
        if *n >= CALLER_WAITING {
            drop(callers);
            count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        *n += 1;
        drop(callers);
        Some(WaitingPlace {
            tenant: count,
            callers: Arc::clone(&self.callers),
            caller,
        })
    }

    /// The tenant's place in the catch-up line, shared by its groups.
    fn pace(&self, tenant: &str) -> Pace {
        let mut paces = self.paces.lock();
        if let Some(tenant) = paces.get(tenant).and_then(std::sync::Weak::upgrade) {
            return Pace { tenant };
        }
        paces.retain(|_, pace| pace.strong_count() > 0);
        let pace = Arc::new(tokio::sync::Semaphore::new(1));
        paces.insert(Arc::from(tenant), Arc::downgrade(&pace));
        Pace { tenant: pace }
    }

    /// Starts a group's task (a group of that name already running is stopped first).
    pub fn start(
        &self,
        broker: &Arc<Broker>,
        store: &Arc<Store>,
        tenant: &str,
        group: StoredGroup,
    ) {
        let StoredGroup { spec, created_ms } = group;
        let Ok(pattern) = Pattern::parse_native(&spec.pattern) else {
            tracing::warn!(tenant, group = %spec.name, "a stored group has a bad pattern; not started");
            return;
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        let lagging = Arc::new(AtomicBool::new(false));
        let stopped = Arc::new(AtomicBool::new(false));
        let handle = Arc::new(Handle {
            name: spec.name.clone(),
            pattern: pattern.clone(),
            text: Arc::from(spec.pattern.as_str()),
            tx,
            lagging: Arc::clone(&lagging),
            stopped: Arc::clone(&stopped),
            overflow: parking_lot::Mutex::default(),
        });
        let task = GroupTask {
            tenant: Arc::from(tenant),
            dispatcher: Dispatcher::new(spec.limits(), spec.start == StartAt::All),
            spec,
            created_ms,
            pattern,
            broker: Arc::downgrade(broker),
            store: Arc::clone(store),
            lagging,
            stopped,
            members: HashMap::new(),
            next_member: 1,
            waiting: VecDeque::new(),
            sequences: Sequences::default(),
            last_offset: 0,
            observed: Vec::new(),
            kept: Kept::default(),
            awaits: HashMap::new(),
            touched: Vec::new(),
            clock: broker.clock().clone(),
            scan: Scan::Wanted,
            pace: self.pace(tenant),
        };
        self.edit(tenant, |list| {
            stop_named(list, &handle.name);
            list.push(handle);
        });
        tokio::spawn(task.run(rx));
    }

    /// Stops a group's task: its queue closes and the task ends.
    pub fn stop(&self, tenant: &str, group: &str) {
        self.edit(tenant, |list| stop_named(list, group));
    }

    /// Stops every group of a tenant that is being deleted.
    pub fn stop_tenant(&self, tenant: &str) {
        self.waiting.lock().remove(tenant);
        self.edit(tenant, |list| {
            for handle in list.drain(..) {
                handle.stopped.store(true, Ordering::Release);
            }
        });
    }

    /// Rebuilds a tenant's match trie after `change` to its list of groups.
    fn edit(&self, tenant: &str, change: impl FnOnce(&mut Vec<Arc<Handle>>)) {
        let mut tenants = self.tenants.write();
        let mut list = tenants
            .get(tenant)
            .map(|g| g.list.clone())
            .unwrap_or_default();
        change(&mut list);
        if list.is_empty() {
            tenants.remove(tenant);
            self.any.store(!tenants.is_empty(), Ordering::Release);
            return;
        }
        let mut trie = Trie::new();
        for (i, handle) in list.iter().enumerate() {
            trie.insert(&handle.pattern, None, i);
        }
        tenants.insert(Arc::from(tenant), Arc::new(TenantGroups { trie, list }));
        self.any.store(true, Ordering::Release);
    }
}

/// Takes the group called `name` out of `list`, telling its task it is stopped.
fn stop_named(list: &mut Vec<Arc<Handle>>, name: &str) {
    list.retain(|h| {
        let keep = h.name != name;
        if !keep {
            h.stopped.store(true, Ordering::Release);
        }
        keep
    });
}

/// One group a wait names, and what it answered so far.
type Slot = (Box<str>, Option<Result<(), Missed>>);

/// What a wait's groups did: `unanswered` for each that had not answered.
fn outcome_of(slots: Vec<Slot>, unanswered: Missed) -> AwaitOutcome {
    let mut outcome = AwaitOutcome::default();
    for (group, result) in slots {
        match result.unwrap_or(Err(unanswered)) {
            Ok(()) => outcome.passed.push(group),
            Err(why) => outcome.pending.push((group, why)),
        }
    }
    outcome
}

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

    /// One step of the walk over the group's subjects.
    async fn walk_one_page(&mut self) {
        let Scan::Walking(after) = &self.scan else {
            return;
        };
        let after = after.clone();
        // A walk that begins after a lag must see what was dropped: the sequencer
        // routes a round before writing it, so wait until what was routed is stored.
        if after.is_none()
            && let Err(error) = self.store.durable_barrier().await
        {
            self.scan = Scan::Wanted;
            tracing::warn!(group = %self.spec.name, %error, "a group could not start its walk");
            return;
        }
        match self.scan_page(after.as_deref()).await {
            Ok(Some(next)) => self.scan = Scan::Walking(Some(next)),
            Ok(None) => self.scan = Scan::Done,
            Err(error) => {
                // Tried again at the next demand, not in a loop against a failing
                // store.
                self.scan = Scan::Wanted;
                tracing::warn!(group = %self.spec.name, %error, "a group could not read its subjects");
            }
        }
    }

    async fn take_input(&mut self, input: Input) {
        let now = self.clock.now_ms();
        match input {
            Input::Observed(subject, version, message) => {
                self.observed.push((subject, version, message));
            }
            Input::Pull(pull) => {
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
                    let next_heartbeat =
                        jetstream.and_then(|t| t.heartbeat).map(|every| now + every);
                    self.waiting.push_back(Waiting {
                        until: now + pull.wait,
                        pull,
                        sent,
                        bytes,
                        next_heartbeat,
                    });
                }
            }
            Input::Info { answer, laggiest } => {
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
                let _ = answer.send(serde_json::json!({
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
                    "last_offset": self.last_offset,
                }));
            }
            Input::Await(waiter) => {
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
            Input::Reply(reply) => {
                let delivery = Delivery {
                    subject: Arc::clone(&reply.subject),
                    version: reply.version,
                    attempt: reply.attempt,
                };
                self.settle(&delivery, reply.kind, reply.confirm, now).await;
            }
            Input::JetStreamReply(reply) => {
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
        }
    }

    /// Takes an ack, nack, in-progress or term of `delivery`, and confirms it where
    /// the member asked.
    async fn settle(
        &mut self,
        delivery: &Delivery,
        kind: ReplyKind,
        confirm: Option<(String, Arc<TenantRoutes>)>,
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

    /// Hands the dispatcher the messages routed since the last call, once they are
    /// durable: the sequencer routes a round before its write, and a group hands out
    /// (and later acks past) only what a restart would still find.
    async fn take_observed(&mut self) {
        if self.observed.is_empty() {
            return;
        }
        if self.store.durable_barrier().await.is_err() {
            return;
        }
        let now = self.clock.now_ms();
        // A dropped message sets the flag before anything offered after it, so a
        // group that sees it clear has every message since its walk.
        let complete = self.scan == Scan::Done && !self.lagging.load(Ordering::Acquire);
        for (subject, version, message) in std::mem::take(&mut self.observed) {
            if self.before_start(now) {
                self.dispatcher.pass_over(&subject, version, now);
                continue;
            }
            // Untracked after a whole walk with nothing dropped since: this is the
            // subject's first version since the start, and nothing older is owed.
            if self.dispatcher.cursor(&subject).is_none()
                && self.spec.start != StartAt::All
                && !complete
            {
                match self.first_version(&subject, version).await {
                    Ok(first) => self
                        .dispatcher
                        .restore(Arc::clone(&subject), first - 1, version),
                    Err(error) => {
                        tracing::warn!(group = %self.spec.name, %error, "a group could not read a subject");
                        continue;
                    }
                }
            }
            self.dispatcher.observe(&subject, version, now);
            let Observed {
                offset,
                time_ms,
                headers,
                payload,
            } = message;
            let copy = KeptMessage::copied(offset, time_ms, &headers, &payload);
            self.kept.keep(&subject, version, copy);
        }
    }

    /// Reads the group's cursors, one range read; their subjects' heads come with the
    /// walk over the subjects, or with their next message.
    async fn load(&mut self) -> Result<(), StoreError> {
        let _pace = self.pace.step().await;
        for (subject, acked) in self.store.cursors(&self.tenant, &self.spec.name).await? {
            self.dispatcher.restore(Arc::from(subject), acked, acked);
        }
        Ok(())
    }

    /// Tells the dispatcher the heads of one page of the subjects the pattern
    /// matches, after `after`; returns where the next page starts, if any.
    async fn scan_page(&mut self, after: Option<&str>) -> Result<Option<String>, StoreError> {
        let _pace = self.pace.step().await;
        self.count_catch_up_read();
        let page = self
            .store
            .subjects(&self.tenant, &self.pattern, after, SCAN_PAGE)
            .await?;
        let since = self.since();
        for head in page.subjects {
            let subject: Arc<str> = Arc::from(head.subject.as_str());
            if self.dispatcher.cursor(&subject).is_none() {
                // Nothing of it is the group's: not tracked at all, and not read. Its
                // next message finds the first version owed then.
                if since.is_some_and(|since| head.time_ms < since) {
                    continue;
                }
                let first = match self.spec.start {
                    StartAt::All => 1,
                    _ => self.first_version(&subject, head.version).await?,
                };
                self.dispatcher
                    .restore(Arc::clone(&subject), first - 1, head.version);
            } else if self.before_start(self.clock.now_ms()) {
                self.dispatcher
                    .pass_over(&subject, head.version, self.clock.now_ms());
            } else {
                self.dispatcher
                    .observe(&subject, head.version, self.clock.now_ms());
            }
        }
        Ok(page.next)
    }

    fn count_catch_up_read(&self) {
        if let Some(broker) = self.broker.upgrade() {
            broker.metrics().count_group_catch_up_read();
        }
    }

    /// When the group's messages begin, unless it takes every stored one.
    fn since(&self) -> Option<u64> {
        match self.spec.start {
            StartAt::All => None,
            StartAt::Time(ms) => Some(ms),
            StartAt::New => Some(self.created_ms),
        }
    }

    /// Whether the group's start time is still ahead at `now`: what is stored now is
    /// before it.
    fn before_start(&self, now: u64) -> bool {
        matches!(self.spec.start, StartAt::Time(at) if now < at)
    }

    /// The first version of `subject` (whose newest is `head`) the group's start
    /// takes in: `head + 1` when every stored one is older.
    async fn first_version(&self, subject: &str, head: u64) -> Result<u64, StoreError> {
        let since = match self.spec.start {
            StartAt::All => return Ok(1),
            StartAt::Time(ms) => ms,
            StartAt::New => self.created_ms,
        };
        self.count_catch_up_read();
        let page = self
            .store
            .replay_subject(&self.tenant, subject, ReplayFrom::Time(since), 1, 1 << 20)
            .await?;
        Ok(page
            .messages
            .first()
            .map_or(head + 1, |first| first.version))
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

    /// Sends a pull at most `max` of what is ready; returns how many messages and
    /// payload bytes went.
    async fn answer(&mut self, pull: &Pull, max: usize) -> (usize, usize) {
        let Some(broker) = self.broker.upgrade() else {
            return (0, 0);
        };
        let member = self.member(&pull.member);
        let now = self.clock.now_ms();
        let deliveries = self.dispatcher.take(member, max, now);
        self.read_ahead(&deliveries).await;
        let (mut sent, mut bytes, mut out_bytes) = (0, 0, 0);
        for delivery in deliveries {
            match self.message(&delivery).await {
                Ok(Some(message)) => {
                    match &pull.style {
                        PullStyle::Canopy => self.send_canopy(&broker, pull, &delivery, &message),
                        PullStyle::JetStream { stream, .. } => {
                            self.send_jetstream(&broker, pull, stream, &delivery, &message)
                        }
                    }
                    self.last_offset = self.last_offset.max(message.offset);
                    sent += 1;
                    bytes += message.payload.len();
                    out_bytes += message.payload.len() + message.headers.len();
                }
                Ok(None) => {
                    self.dispatcher.gone(&delivery, now);
                    if !self.awaits.is_empty() {
                        self.touched.push(Arc::clone(&delivery.subject));
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "a group could not read a message; it goes again after its ack wait");
                }
            }
        }
        // Every group delivery counts here once, whichever front end pulled it.
        if sent > 0 {
            broker.metrics().count_out(sent as u64, out_bytes as u64);
        }
        (sent, bytes)
    }

    /// Reads the runs of the deliveries the group does not hold in one scan of the
    /// keys between them, and keeps them: a catch-up hands subjects out in the order
    /// its walk listed them, which is key order, so their runs lie close together. What
    /// the scan misses is read on its own by [`GroupTask::message`].
    async fn read_ahead(&mut self, deliveries: &[Delivery]) {
        let mut wanted: Vec<(&str, u64)> = deliveries
            .iter()
            .filter(|d| !self.kept.holds(&d.subject, d.version))
            .map(|d| (&*d.subject, d.version))
            .collect();
        if wanted.len() < READ_AHEAD_MIN {
            return;
        }
        wanted.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()).then(a.1.cmp(&b.1)));
        wanted.dedup();
        let max_keys = wanted.len() * READ_AHEAD_KEYS_PER_MESSAGE + 64;
        if let Some(broker) = self.broker.upgrade() {
            broker.metrics().count_group_delivery_read();
        }
        let found = match self
            .store
            .get_runs_from(&self.tenant, &wanted, max_keys)
            .await
        {
            Ok(found) => found,
            Err(error) => {
                tracing::debug!(group = %self.spec.name, %error, "a read-ahead failed; each delivery reads on its own");
                return;
            }
        };
        let names: HashMap<&str, &Arc<str>> = deliveries
            .iter()
            .map(|d| (&*d.subject, &d.subject))
            .collect();
        for messages in found.into_iter().flatten() {
            for message in messages {
                if let Some(&subject) = names.get(message.subject.as_str()) {
                    self.kept.keep_read(subject, &message);
                }
            }
        }
    }

    /// The message a delivery hands out: kept in memory when the group has it, else
    /// read from the store with the rest of its run, which is kept for the
    /// deliveries to come.
    async fn message(&mut self, delivery: &Delivery) -> Result<Option<StoredMessage>, StoreError> {
        let (subject, version) = (&delivery.subject, delivery.version);
        let kept = match self.kept.take(subject, version) {
            Some(kept) => kept,
            None => {
                if let Some(broker) = self.broker.upgrade() {
                    broker.metrics().count_group_delivery_read();
                }
                let mut run = self
                    .store
                    .get_run_from(&self.tenant, subject, version)
                    .await?
                    .into_iter();
                let Some(first) = run.next() else {
                    return Ok(None);
                };
                for next in run {
                    self.kept.keep_read(subject, &next);
                }
                return Ok(Some(first));
            }
        };
        Ok(Some(StoredMessage {
            subject: subject.to_string(),
            version,
            offset: kept.offset,
            time_ms: kept.time_ms,
            flags: 0,
            headers: kept.headers,
            payload: kept.payload,
        }))
    }

    /// One delivery to a `$CANOPY.group.next` pull: Canopy's headers, and an ack
    /// subject that names the delivery.
    fn send_canopy(
        &self,
        broker: &Broker,
        pull: &Pull,
        delivery: &Delivery,
        message: &crate::store::StoredMessage,
    ) {
        let mut headers = HeaderMap::parse(&message.headers).unwrap_or_default();
        // A pull's own answers say these; a message carrying them must not end or
        // fail the pull it is in.
        for control in ["Canopy-Done", "Canopy-Count", "Canopy-Status"] {
            headers.remove(control);
        }
        headers.insert("Canopy-Subject", message.subject.clone());
        headers.insert("Canopy-Version", message.version.to_string());
        headers.insert("Canopy-Offset", message.offset.to_string());
        headers.insert("Canopy-Time", message.time_ms.to_string());
        headers.insert("Canopy-Group", self.spec.name.clone());
        headers.insert("Canopy-Attempt", delivery.attempt.to_string());
        let mut block = BytesMut::new();
        headers.encode(&mut block);
        let ack = format!(
            "{ACK_PREFIX}{}.{}.{}.{}",
            self.spec.name, delivery.version, delivery.attempt, delivery.subject
        );
        send(
            broker,
            &pull.routes,
            &pull.reply,
            Some(ack.as_bytes()),
            Some(&block),
            &message.payload,
        );
    }

    /// One delivery to a JetStream pull: under its own subject with its own headers,
    /// and a `$JS.ACK.` reply numbered by a new consumer sequence.
    fn send_jetstream(
        &mut self,
        broker: &Broker,
        pull: &Pull,
        stream: &str,
        delivery: &Delivery,
        message: &crate::store::StoredMessage,
    ) {
        let consumer_seq = self.sequences.issue(delivery);
        let ack = jetstream::ack_subject(
            stream,
            &self.spec.name,
            delivery.attempt,
            message.offset,
            consumer_seq,
            message.time_ms,
            {
                // JetStream's pending: what is not yet delivered.
                let stats = self.dispatcher.stats();
                stats.pending.saturating_sub(stats.in_flight)
            },
        );
        let headers = (!message.headers.is_empty()).then_some(&message.headers[..]);
        let routed = Message {
            subject: &pull.reply,
            shown_as: Some(&message.subject),
            reply: Some(ack.as_bytes()),
            headers,
            payload: &message.payload,
            ..Message::default()
        };
        route_one(broker, &pull.routes, &routed);
    }

    /// Answers a pull with an error (409) instead of messages.
    fn refuse(&self, pull: &Pull, description: &str) {
        self.refuse_with(pull, 409, description);
    }

    /// Answers a pull with an error instead of messages: `code` for a Canopy pull,
    /// 409 for a JetStream one (the status its clients know).
    fn refuse_with(&self, pull: &Pull, code: u16, description: &str) {
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        match &pull.style {
            PullStyle::Canopy => broker.refuse(&pull.routes, &pull.reply, code, description),
            PullStyle::JetStream { .. } => {
                let block = jetstream::status_block(409, description, None);
                send(&broker, &pull.routes, &pull.reply, None, Some(&block), b"");
            }
        }
    }

    /// Ends a pull that sent `sent` messages: Canopy's `Canopy-Done` with the count,
    /// or JetStream's status for how it ended (nothing when it was filled).
    fn end(&self, pull: &Pull, sent: usize, end: EndOfPull) {
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        let block = match (&pull.style, end) {
            (PullStyle::Canopy, _) => {
                let mut headers = HeaderMap::new();
                headers.insert("Canopy-Done", "true");
                headers.insert("Canopy-Count", sent.to_string());
                let mut block = BytesMut::new();
                headers.encode(&mut block);
                block
            }
            (PullStyle::JetStream { .. }, EndOfPull::Filled) => return,
            (PullStyle::JetStream { .. }, EndOfPull::Heartbeat) => {
                jetstream::status_block(100, "Idle Heartbeat", None)
            }
            (PullStyle::JetStream { .. }, EndOfPull::NoMessages) => {
                jetstream::status_block(404, "No Messages", None)
            }
            (PullStyle::JetStream { .. }, EndOfPull::Done | EndOfPull::TimedOut) => {
                let unfilled = (pull.max.saturating_sub(sent), 0);
                jetstream::status_block(408, "Request Timeout", Some(unfilled))
            }
            (PullStyle::JetStream { .. }, EndOfPull::TooManyWaiting) => {
                jetstream::status_block(409, "Exceeded MaxWaiting", None)
            }
            (PullStyle::JetStream { .. }, EndOfPull::Deleted) => {
                jetstream::status_block(409, "Consumer Deleted", None)
            }
        };
        send(&broker, &pull.routes, &pull.reply, None, Some(&block), b"");
    }

    /// Sends waiting pulls what is now ready, and ends those that are filled or whose
    /// wait is over; a JetStream pull that still waits gets its heartbeat when due.
    async fn serve_waiting(&mut self) {
        let now = tokio::time::Instant::now();
        let mut still = VecDeque::with_capacity(self.waiting.len());
        let broker = self.broker.upgrade();
        while let Some(mut waiting) = self.waiting.pop_front() {
            // A client that stopped listening (a fetch it gave up on, a closed
            // connection) gets no more: what it would take goes to a pull that is read.
            if broker
                .as_ref()
                .is_some_and(|b| !b.has_interest(&waiting.pull.routes, &waiting.pull.reply))
            {
                continue;
            }
            let room = waiting.pull.max.saturating_sub(waiting.sent);
            let (sent, bytes) = self.answer(&waiting.pull, room).await;
            waiting.sent += sent;
            waiting.bytes += bytes;
            let terms = match &waiting.pull.style {
                PullStyle::JetStream { terms, .. } => Some(terms),
                PullStyle::Canopy => None,
            };
            let Some(terms) = terms else {
                if sent > 0 || waiting.until <= now {
                    self.end(&waiting.pull, waiting.sent, EndOfPull::Done);
                } else {
                    still.push_back(waiting);
                }
                continue;
            };
            let filled = waiting.sent >= waiting.pull.max
                || (terms.max_bytes > 0 && waiting.bytes >= terms.max_bytes);
            if filled {
                continue;
            }
            if terms.no_wait && waiting.sent > 0 {
                self.end(&waiting.pull, waiting.sent, EndOfPull::NoMessages);
                continue;
            }
            if waiting.until <= now {
                self.end(&waiting.pull, waiting.sent, EndOfPull::TimedOut);
                continue;
            }
            if sent > 0 {
                // A message counts as a sign of life: the heartbeat waits again.
                waiting.next_heartbeat = terms.heartbeat.map(|every| now + every);
            } else if let Some(beat) = waiting.next_heartbeat
                && beat <= now
            {
                self.end(&waiting.pull, waiting.sent, EndOfPull::Heartbeat);
                waiting.next_heartbeat = terms.heartbeat.map(|every| now + every);
            }
            still.push_back(waiting);
        }
        self.waiting = still;
    }

    /// Writes the cursors that moved.
    async fn flush(&mut self) {
        if self.stopped.load(Ordering::Acquire) {
            return;
        }
        let moved = self.dispatcher.take_cursors();
        if let Err(error) = self
            .store
            .put_cursors(&self.tenant, &self.spec.name, &moved)
            .await
        {
            tracing::warn!(group = %self.spec.name, %error, "a group could not write its cursors; acked messages may come again after a restart");
        }
    }

    /// Stores each dead letter under the group's dead-letter subject, with why.
    async fn dead_letters(&mut self, letters: Vec<DeadLetter>) {
        for letter in letters {
            let message = self
                .store
                .get(&self.tenant, &letter.subject, Some(letter.version))
                .await
                .ok()
                .flatten();
            let mut headers = message
                .as_ref()
                .and_then(|m| HeaderMap::parse(&m.headers).ok())
                .unwrap_or_default();
            headers.insert("Canopy-Dead-Subject", letter.subject.to_string());
            headers.insert("Canopy-Dead-Version", letter.version.to_string());
            headers.insert("Canopy-Dead-Attempts", letter.attempts.to_string());
            headers.insert("Canopy-Dead-Reason", letter.reason.as_str());
            let mut block = BytesMut::new();
            headers.encode(&mut block);
            let request = AppendRequest {
                tenant: Arc::clone(&self.tenant),
                subject: Arc::from(self.spec.dead_letter_subject(&letter.subject)),
                messages: vec![NewMessage {
                    headers: block.freeze(),
                    payload: message.map_or_else(Bytes::new, |m| m.payload),
                    flags: 0,
                }],
                expect: None,
                msg_id: None,
                durability: Durability::Durable,
                ack: None,
                route: RouteTag::default(),
                compaction: None,
                max_versions: 0,
                retain: false,
            };
            if self.store.append(request).await.is_err() {
                tracing::warn!(group = %self.spec.name, "a dead letter was not stored: the store is closing");
            }
            if !self.awaits.is_empty() {
                self.touched.push(letter.subject);
            }
        }
        let _ = self.store.durable_barrier().await;
    }
}

fn send(
    broker: &Broker,
    routes: &TenantRoutes,
    subject: &str,
    reply: Option<&[u8]>,
    headers: Option<&[u8]>,
    payload: &[u8],
) {
    let message = Message {
        subject,
        reply,
        headers,
        payload,
        ..Message::default()
    };
    route_one(broker, routes, &message);
}

/// Routes one message the group sends (its subscribers are woken when `Wakes` drops).
fn route_one(broker: &Broker, routes: &TenantRoutes, message: &Message<'_>) {
    let mut scratch = RouteScratch::default();
    let mut wakes = Wakes::default();
    broker.route(routes, None, message, &mut scratch, &mut wakes);
}

#[cfg(test)]
mod tests {
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

    #[tokio::test]
    async fn acks_past_a_full_queue_arrive_in_order_and_a_bounded_overflow_says_busy() {
        let (tx, mut rx) = mpsc::channel(2);
        let handle = Arc::new(Handle {
            name: "g".into(),
            pattern: Pattern::parse_native("orders.>").unwrap(),
            text: Arc::from("orders.>"),
            tx,
            lagging: Arc::default(),
            stopped: Arc::default(),
            overflow: parking_lot::Mutex::default(),
        });
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
