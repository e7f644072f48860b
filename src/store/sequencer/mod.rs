//! The one sequencer: the only code that assigns versions and offsets, and the only
//! writer of message keys.
//!
//! Each round drains up to `max_batch` queued appends, loads what it does not hold in
//! memory (a tenant's next offset, a subject's head, a msg id) by reverse seeks, then
//! decides every append in queue order, hands the accepted messages to routing in one
//! call, and writes them all in one engine write (group commit) or journal record.
//! Rounds run one at a time, in whichever task queued an input when none is under
//! way, else in the sequencer's own (`combining.rs`). What makes rounds durable
//! (`journaled.rs`, or without a journal `writer.rs`) sends the acks that asked for
//! it only once their round is durable, in order. Heads are never written per message: a head is recovered by one reverse seek of
//! its subject's range, so the only key a message costs is its own.
//!
//! Must never: write a message key from anywhere else, reorder appends of one subject,
//! send a durable ack before its write is durable.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::journaled::JournalPair;
use super::snapshot::CompactionJob;
use super::{AppendRequest, Input, StoreEvents, StoreSettings, StoredLimits, TenantSet};
use crate::store::Engine;

use super::{retention, stats};

mod combining;
mod journaled;
mod open_run;
mod round;
mod tenant;
mod writer;

pub(super) use combining::{Inbox, start};
use tenant::TenantState;
pub(super) use tenant::{load_next_offset, load_usage};
use writer::{acknowledge, write_rounds};

/// Most msg ids remembered in memory per tenant; older ones are found in the store.
const MSG_ID_CACHE: usize = 100_000;
/// Group commits that may wait for durability before the sequencer holds back.
const DURABILITY_QUEUE: usize = 256;
/// Rounds the sequencer may decide ahead of the engine write of an earlier one: the
/// write (memtable insert) runs on another task, in parallel with the next round.
const WRITES_AHEAD: usize = 2;

pub(super) struct Sequencer {
    db: Arc<Engine>,
    events: Arc<dyn StoreEvents>,
    tenants: SeededMap<Arc<str>, TenantState>,
    window_ms: u64,
    max_batch: usize,
    clock: crate::clock::Clock,
    durable_tx: watch::Sender<u64>,
    compactions: mpsc::Sender<CompactionJob>,
    /// Counts failed writes; a change makes the next round forget memory's heads.
    failures: Arc<AtomicU64>,
    epoch_seen: u64,
    stats: Arc<super::stats::StoreStats>,
    /// Stored limits of the tenants that have any.
    limits: SeededMap<Arc<str>, StoredLimits>,
    /// Bytes deleted outside the sequencer, not yet taken off the tenants' usage.
    released: HashMap<Arc<str>, u64>,
    /// Tenants at their bytes limit, for front ends to refuse early.
    bytes_full: Arc<TenantSet>,
    /// Sizes of the messages a subject's version limit drops this round, read by
    /// `load`: (tenant, subject, version) to header and payload bytes.
    dropped_sizes: HashMap<MessageKey, u64>,
    /// Dropped versions that `load` found inside a run of several (written before the
    /// subject had a version limit): the key to delete with it, `Some` when it is
    /// the run's last version, so the run goes once all of it is out of the window.
    dropped_in_runs: HashMap<MessageKey, Option<u64>>,
    /// Sizes of the messages of version-limited subjects appended in the last
    /// rounds, which may not be in the engine yet when `load` looks for them.
    recent_sizes: VecDeque<(u64, HashMap<MessageKey, u64>)>,
    /// Rounds decided so far.
    rounds: u64,
    /// The number of the last round whose write reached the engine: its messages
    /// are read from the engine, which also sees what purges deleted since.
    written: Arc<AtomicU64>,
    /// Flush the write-ahead log as soon as an ack waits (a local folder), not on the
    /// engine's timer.
    eager_flush: bool,
    /// The journal rounds go through before the engine, and the next round's number.
    journal: Option<(JournalPair, u64)>,
    /// Most bytes of messages one round takes (a journal record must fit half a file).
    round_bytes: usize,
}

/// A message by tenant, subject and version.
type MessageKey = (Arc<str>, Arc<str>, u64);

/// Rounds whose write may still be on its way to the engine when a later round
/// loads: the ones queued for the writer and the one it is writing, and behind a
/// journal those appended and waiting for or in a sync (a queue's worth at most).
const UNWRITTEN_ROUNDS: usize = WRITES_AHEAD + 2 + 2 * journaled::SYNC_QUEUE;

/// A tenant's part of one round: its first offset and (subject, version, bytes) list.
/// The maps the sequencer looks up once or more per append, keyed by tenant and
/// subject names that clients choose: foldhash, seeded at random per process, costs a
/// fraction of SipHash on short keys.
pub(super) type SeededMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

type RoundIndex = (u64, Vec<(Arc<str>, u64, u32)>);

/// One accepted message, by position in the round's requests.
struct Assigned {
    request: usize,
    message: usize,
    version: u64,
    offset: u64,
}

impl Sequencer {
    pub(super) fn new(
        db: Arc<Engine>,
        events: Arc<dyn StoreEvents>,
        settings: &StoreSettings,
        durable_tx: watch::Sender<u64>,
        compactions: mpsc::Sender<CompactionJob>,
        stats: Arc<super::stats::StoreStats>,
        bytes_full: Arc<TenantSet>,
    ) -> Self {
        Self {
            db,
            events,
            tenants: SeededMap::default(),
            window_ms: u64::try_from(settings.dedupe_window.as_millis()).unwrap_or(u64::MAX),
            max_batch: settings.max_batch.max(1),
            clock: settings.clock.clone(),
            durable_tx,
            compactions,
            failures: Arc::new(AtomicU64::new(0)),
            epoch_seen: 0,
            stats,
            limits: SeededMap::default(),
            released: HashMap::new(),
            bytes_full,
            dropped_sizes: HashMap::new(),
            dropped_in_runs: HashMap::new(),
            recent_sizes: VecDeque::new(),
            rounds: 0,
            written: Arc::new(AtomicU64::new(0)),
            eager_flush: matches!(settings.url, super::StoreUrl::File(_))
                && settings.object_store.is_none(),
            journal: None,
            round_bytes: usize::MAX,
        }
    }

    /// Makes rounds durable through `journal`, numbering them from `next`.
    pub(super) fn with_journal(mut self, journal: Option<(JournalPair, u64)>) -> Self {
        if let Some((pair, _)) = &journal {
            // Keys, msg ids and the index add to the messages' bytes: an eighth of a file
            // keeps a round well inside the half a record may take.
            self.round_bytes = usize::try_from(pair.capacity() / 8).unwrap_or(usize::MAX);
        }
        self.journal = journal;
        self
    }

    /// Starts what takes decided rounds to durability: the engine writer and the
    /// acker tasks, or behind a journal the appender (run in this task), its sync
    /// thread and the tracker.
    fn start_writing(&mut self) -> RoundSink {
        if let Some((pair, next)) = self.journal.take() {
            let shared = journaled::Shared {
                engine: Arc::clone(&self.db),
                events: Arc::clone(&self.events),
                failures: Arc::clone(&self.failures),
                broken: Default::default(),
                journal_failed: Default::default(),
                stats: Arc::clone(&self.stats),
                flush_wanted: Default::default(),
                flush_due: Default::default(),
            };
            let (held_tx, held_rx) = watch::channel(next - 1);
            let mut appender = journaled::Appender::new(
                shared.clone(),
                (pair, next),
                held_rx,
                self.durable_tx.clone(),
                Arc::clone(&self.written),
            );
            appender.start();
            // Not awaited at the end: it may wait on the engine's slow log timer,
            // which the store's close flushes anyway.
            let tracker = tokio::spawn(journaled::track_engine(shared, held_tx));
            return RoundSink::Journal(Box::new(appender), tracker);
        }
        let (write_tx, write_rx) = mpsc::channel(WRITES_AHEAD);
        let (durable_tx, durable_rx) = mpsc::channel(DURABILITY_QUEUE);
        let acker = tokio::spawn(acknowledge(
            durable_rx,
            Arc::clone(&self.events),
            self.durable_tx.clone(),
            Arc::clone(&self.stats),
            self.eager_flush.then(|| Arc::clone(&self.db)),
        ));
        let writer = tokio::spawn(write_rounds(
            Arc::clone(&self.db),
            Arc::clone(&self.events),
            Arc::clone(&self.failures),
            write_rx,
            durable_tx,
            Arc::clone(&self.stats),
            Arc::clone(&self.written),
        ));
        RoundSink::Writer(write_tx, vec![writer, acker])
    }

    /// Takes one queued input into the round being gathered.
    fn gather(&mut self, input: Input, gathered: &mut Gathered) {
        match input {
            Input::Append(request) => {
                gathered.bytes += request
                    .messages
                    .iter()
                    .map(|m| m.headers.len() + m.payload.len())
                    .sum::<usize>();
                gathered.requests.push(request);
            }
            Input::Barrier(passed) => gathered.barriers.push(passed),
            Input::DurableBarrier(passed) => gathered.durable_barriers.push(passed),
            Input::Forget(tenant) => {
                self.tenants.remove(&tenant);
                self.released.remove(&tenant);
                self.bytes_full.set(&tenant, false);
            }
            Input::Limits(tenant, limits) => {
                if limits == StoredLimits::default() {
                    self.limits.remove(&tenant);
                } else {
                    self.limits.insert(Arc::clone(&tenant), limits);
                }
                if let Some(state) = self.tenants.get(&tenant) {
                    self.mark_full(&tenant, state.usage);
                } else if limits.max_bytes.is_none() {
                    self.bytes_full.set(&tenant, false);
                }
            }
            Input::Released(tenant, bytes) => {
                *self.released.entry(tenant).or_default() += bytes;
            }
        }
    }

    /// Whether the round being gathered may take another input.
    fn has_room(&self, gathered: &Gathered) -> bool {
        gathered.requests.len() < self.max_batch && gathered.bytes < self.round_bytes
    }

    /// Runs the gathered round and hands its write on.
    async fn run_round(&mut self, gathered: &mut Gathered, sink: &mut RoundSink) {
        let mut write = self.round(&mut gathered.requests).await;
        write.durable_barriers = std::mem::take(&mut gathered.durable_barriers);
        for passed in gathered.barriers.drain(..) {
            let _ = passed.send(());
        }
        gathered.bytes = 0;
        if !sink.take(write).await {
            // The writer is gone: this round's messages were routed, never stored.
            self.events.lost();
        }
    }
}

/// The inputs of the next round.
#[derive(Default)]
struct Gathered {
    requests: Vec<AppendRequest>,
    barriers: Vec<tokio::sync::oneshot::Sender<()>>,
    durable_barriers: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Message bytes of `requests`.
    bytes: usize,
}

/// Where decided rounds go: the engine writer task, or the journal.
enum RoundSink {
    Writer(mpsc::Sender<writer::RoundWrite>, Vec<JoinHandle<()>>),
    Journal(Box<journaled::Appender>, JoinHandle<()>),
}

impl RoundSink {
    /// Takes a round on its way; false once the writer is gone.
    async fn take(&mut self, write: writer::RoundWrite) -> bool {
        match self {
            RoundSink::Writer(write_tx, _) => write_tx.send(write).await.is_ok(),
            RoundSink::Journal(appender, _) => {
                appender.take(write).await;
                true
            }
        }
    }

    /// Lets the caller of the next round sync it in place (behind a journal, when no
    /// sync is under way then).
    fn claim_next(&mut self) {
        if let RoundSink::Journal(appender, _) = self {
            appender.claim_next();
        }
    }

    /// What the last round claimed to sync in place, with what syncs it.
    fn claimed(&mut self) -> Option<(journaled::Claimed, Arc<journaled::Syncer>)> {
        match self {
            RoundSink::Writer(..) => None,
            RoundSink::Journal(appender, _) => appender.claimed(),
        }
    }

    /// Waits until every round taken is through.
    async fn close(self) {
        match self {
            RoundSink::Writer(write_tx, tasks) => {
                drop(write_tx);
                for task in tasks {
                    let _ = task.await;
                }
            }
            RoundSink::Journal(appender, tracker) => {
                appender.close().await;
                tracker.abort();
            }
        }
    }
}
