//! The sequencer's path to durability through the journal (a local folder): each
//! decided round is appended to the journal, a group of them made durable by one
//! data sync started as soon as the previous one ends, and only then applied to the
//! unflushed rounds (`store/unflushed.rs`, which every read sees) and acknowledged.
//! A flusher writes those rounds to the engine in large batches behind; the engine's
//! own log is flushed behind that, on its timer; what it durably holds says when a
//! journal file may start over.
//!
//! The sequencer's task appends each round's record and sends its immediate acks
//! ([`Appender`]); the sync thread syncs groups of records, then applies their
//! rounds and sends their durable acks and barriers, so a lone publish's ack leaves
//! from the thread that saw its sync end; the flusher writes the unflushed rounds to
//! the engine; the tracker follows the last round the engine's own log holds durably.
//!
//! Must never: apply a round before the journal holds it (reads show the unflushed
//! rounds and the engine's memory as durable), send a durable ack before the sync
//! that covers its round, or go on after a failure that may have left a round in the
//! journal but not in the engine: from then on every append is refused until a
//! restart replays the journal.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::{Notify, watch};

use crate::store::Engine;
use crate::store::journaled::{Appended, JournalPair};
use crate::store::{StoreError, StoreEvents};

use super::writer::{Pacing, RoundWrite, STALE, refuse, report_failure};

/// Rounds appended and waiting for their sync: the next group's bound.
pub(super) const SYNC_QUEUE: usize = 256;

/// Unflushed rounds are written to the engine once they hold this much...
const FLUSH_BYTES: usize = 4 << 20;
/// ...or once the oldest has waited this long (what the engine's tables, and so a
/// restart's replay, lag behind)...
const FLUSH_AFTER: std::time::Duration = std::time::Duration::from_millis(250);
/// ...or this long when the last flush joined few messages per key (many subjects at
/// a low rate): waiting then only makes each flush a larger burst of engine work,
/// which shows in the latency of live messages (BENCHMARKS.md, session 23)...
const FLUSH_SOON: std::time::Duration = std::time::Duration::from_millis(50);
/// ...below this many messages per key.
const JOINING_WORTH_WAITING: f64 = 2.0;
/// ...and past this much the appender waits for a flush before taking more.
const UNFLUSHED_MAX: usize = 4 * FLUSH_BYTES;

/// What the appender, the sync thread, the flusher and the tracker share.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) engine: Arc<Engine>,
    pub(super) events: Arc<dyn StoreEvents>,
    /// Counts failures, as without a journal: a round decided before the count
    /// changed is refused before it is journaled.
    pub(super) failures: Arc<AtomicU64>,
    /// Set by a failure after which the journal and the engine may disagree.
    pub(super) broken: Arc<AtomicBool>,
    /// Set by a failed append or sync: a later sync that succeeds no longer says the
    /// earlier records are on disk (a failed `fdatasync` may drop their pages), so no
    /// round is acknowledged on the journal's word from then on.
    pub(super) journal_failed: Arc<AtomicBool>,
    pub(super) stats: Arc<crate::store::stats::StoreStats>,
    /// A journal round the appender waits for the engine to hold durably (a full
    /// file cannot start over before): the tracker, once it sees it written, flushes
    /// the engine's log instead of waiting for its timer.
    pub(super) flush_wanted: Arc<AtomicU64>,
    /// Wakes the flusher when the unflushed rounds reach [`FLUSH_BYTES`].
    pub(super) flush_due: Arc<Notify>,
}

const BROKEN: &str = "the store's journal or engine failed earlier; this server stores nothing \
                      more until it is restarted (what was acknowledged is kept)";

impl Shared {
    fn break_down(&self, error: &dyn std::fmt::Display) {
        if !self.broken.swap(true, Ordering::AcqRel) {
            tracing::error!(
                %error,
                "the store's journal or engine failed: this server refuses every durable \
                 publish until it is restarted, which replays the journal"
            );
        }
        self.failures.fetch_add(1, Ordering::AcqRel);
        self.events.lost();
    }

    /// Writes the unflushed rounds to the engine; a failure breaks the store down.
    async fn flush(&self) {
        if self.broken.load(Ordering::Acquire) {
            return;
        }
        let started = std::time::Instant::now();
        match self.engine.unflushed().flush(self.engine.slatedb()).await {
            Ok(_) => self.stats.write.record(started.elapsed()),
            Err(error) => {
                report_failure(&error, "store write failed after the journal held it");
                self.break_down(&error);
            }
        }
    }

    fn refuse(&self, round: RoundWrite, reason: &str) {
        refuse(&*self.events, round, reason);
    }
}

/// A round on its way to the engine.
struct Journaled {
    round: RoundWrite,
    /// Its journal round number and the file its record went to (to sync), when it
    /// writes anything.
    record: Option<(u64, Arc<std::fs::File>)>,
}

/// Rounds appended and not yet synced, from the appender to whoever syncs them: the
/// sync thread, or a caller that ran the round itself and found no sync under way.
#[derive(Default)]
struct SyncQueue {
    state: parking_lot::Mutex<Queued>,
    ready: parking_lot::Condvar,
}

#[derive(Default)]
struct Queued {
    rounds: Vec<Journaled>,
    /// A group is being synced and finished: the next waits for it, so groups are
    /// finished in round order.
    syncing: bool,
    /// No more rounds come: the thread ends once every one is finished.
    closed: bool,
}

/// A group of rounds a caller took to sync itself ([`Syncer::sync_claimed`]).
pub(super) struct Claimed(Vec<Journaled>);

impl SyncQueue {
    /// Queues a round; with `claim`, takes the queue's rounds as a group to sync in
    /// the caller when no sync is under way.
    fn push(&self, journaled: Journaled, claim: bool) -> Option<Claimed> {
        let mut state = self.state.lock();
        state.rounds.push(journaled);
        if state.syncing {
            // Whoever syncs now wakes the thread for these when done.
            return None;
        }
        if claim {
            state.syncing = true;
            return Some(Claimed(std::mem::take(&mut state.rounds)));
        }
        drop(state);
        self.ready.notify_one();
        None
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.ready.notify_one();
    }

    /// The sync thread's next group: every round appended so far, once there is one
    /// and no other sync is under way; `None` once closed and all finished.
    fn next_group(&self) -> Option<Vec<Journaled>> {
        let mut state = self.state.lock();
        loop {
            if !state.syncing && !state.rounds.is_empty() {
                state.syncing = true;
                return Some(std::mem::take(&mut state.rounds));
            }
            if state.closed && !state.syncing && state.rounds.is_empty() {
                return None;
            }
            self.ready.wait(&mut state);
        }
    }

    /// Ends a group's sync; the thread takes what was queued meanwhile.
    fn release(&self) {
        self.state.lock().syncing = false;
        self.ready.notify_one();
    }
}

/// Syncs groups of appended rounds, then applies them to the unflushed rounds and
/// acknowledges them, in round order. A thread of its own runs it behind the rounds
/// the sequencer's task decides, each sync started as soon as the previous one ended
/// with whatever was appended meanwhile; a publisher's task that ran a round itself
/// (`combining.rs`) syncs it in place when no sync is under way, so a lone publish
/// is acknowledged with no hop to another thread at all (BENCHMARKS.md, session 24).
pub(super) struct Syncer {
    shared: Shared,
    queue: Arc<SyncQueue>,
    /// Moves once per group of rounds applied, for followers.
    durable: watch::Sender<u64>,
    /// The sequencer's number of the last round its reads can see.
    written: Arc<AtomicU64>,
    /// Rounds finished so far, for the appender to wait on.
    finished: watch::Sender<u64>,
}

impl Syncer {
    /// The sync thread's loop.
    fn run(&self) {
        while let Some(group) = self.queue.next_group() {
            self.sync_group(group);
            self.queue.release();
        }
    }

    /// Syncs and finishes a group a caller claimed: a blocking data sync on the
    /// caller's thread, taken only when nothing else was syncing.
    pub(super) fn sync_claimed(&self, claimed: Claimed) {
        self.sync_group(claimed.0);
        self.queue.release();
    }

    fn sync_group(&self, group: Vec<Journaled>) {
        let mut files: Vec<Arc<std::fs::File>> = Vec::new();
        for (_, file) in group.iter().filter_map(|j| j.record.as_ref()) {
            if !files.iter().any(|f| Arc::ptr_eq(f, file)) {
                files.push(Arc::clone(file));
            }
        }
        let synced = if files.is_empty() {
            // Rounds that wrote nothing, behind rounds already synced.
            Ok(())
        } else {
            let started = std::time::Instant::now();
            let synced = files.iter().try_for_each(|file| file.sync_data());
            self.shared.stats.durable.record(started.elapsed());
            synced
        };
        let count = group.len() as u64;
        self.finish(group, synced);
        self.finished.send_modify(|n| *n += count);
    }

    /// Applies a synced group's rounds to the unflushed rounds in order, sends their
    /// durable acks, passes their barriers and moves the durable watch.
    fn finish(&self, group: Vec<Journaled>, synced: std::io::Result<()>) {
        if let Err(error) = &synced {
            self.shared.journal_failed.store(true, Ordering::Release);
            self.shared.break_down(error);
        }
        if self.shared.journal_failed.load(Ordering::Acquire) {
            for journaled in group {
                self.shared.refuse(journaled.round, BROKEN);
            }
            return;
        }
        let unflushed = self.shared.engine.unflushed();
        if unflushed.failed() && !self.shared.broken.load(Ordering::Acquire) {
            self.shared
                .break_down(&"an earlier write of unflushed rounds to the engine failed");
        }
        let mut applied = false;
        for journaled in group {
            let mut round = journaled.round;
            if let (Some(writes), Some((number, _)), false) = (
                round.batch.take(),
                journaled.record,
                self.shared.broken.load(Ordering::Acquire),
            ) {
                unflushed.apply(writes, number);
                applied = true;
            }
            // The journal holds the round: its acks are true even when the engine
            // did not take it (a restart writes it there). Its barriers promise
            // reads that see it, which the unflushed rounds give once applied.
            if !round.durable_acks.is_empty() {
                self.shared.events.acknowledged(round.durable_acks);
            }
            if !self.shared.broken.load(Ordering::Acquire) {
                self.written.fetch_max(round.number, Ordering::AcqRel);
                for passed in round.durable_barriers {
                    let _ = passed.send(());
                }
            }
        }
        if applied {
            // After `written`: a round waiting for an earlier one to be applied
            // looks at it when this moves.
            self.durable.send_modify(|n| *n += 1);
        }
        if unflushed.bytes() >= FLUSH_BYTES {
            self.shared.flush_due.notify_one();
        }
    }
}

/// The sequencer's journal appender: appends each round's record in round order, in
/// the task that ran the round (no hop between deciding a round and journaling it),
/// sends the acks that do not wait for durability, and hands the round to the sync
/// thread, or to its caller to sync in place ([`Appender::claim_next`]).
pub(super) struct Appender {
    pub(super) shared: Shared,
    pub(super) pair: JournalPair,
    /// The number the next journaled round takes.
    pub(super) next: u64,
    /// The last journal round the engine holds durably (the tracker's).
    pub(super) held: watch::Receiver<u64>,
    syncer: Arc<Syncer>,
    queue: Arc<SyncQueue>,
    /// Whether the next round taken may be claimed by its caller to sync in place...
    claim: bool,
    /// ...and the group it claimed.
    claimed: Option<Claimed>,
    /// Rounds handed to the sync thread so far...
    pushed: u64,
    /// ...and those it has finished.
    finished: watch::Receiver<u64>,
    body: Vec<u8>,
    /// The flusher task and the sender whose drop stops it, once started.
    flusher: Option<(tokio::task::JoinHandle<()>, watch::Sender<()>)>,
    /// Closes when the sync thread ends.
    ended: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Appender {
    pub(super) fn new(
        shared: Shared,
        (pair, next): (JournalPair, u64),
        held: watch::Receiver<u64>,
        durable: watch::Sender<u64>,
        written: Arc<AtomicU64>,
    ) -> Appender {
        let queue = Arc::<SyncQueue>::default();
        let (finished_tx, finished) = watch::channel(0);
        let syncer = Arc::new(Syncer {
            shared: shared.clone(),
            queue: Arc::clone(&queue),
            durable,
            written,
            finished: finished_tx,
        });
        Appender {
            shared,
            pair,
            next,
            held,
            syncer,
            queue,
            claim: false,
            claimed: None,
            pushed: 0,
            finished,
            body: Vec::new(),
            flusher: None,
            ended: None,
        }
    }

    /// Starts the flusher and the sync thread; a thread that cannot start breaks
    /// the store down (every round is refused).
    pub(super) fn start(&mut self) {
        let (running, stopped) = watch::channel(());
        self.flusher = Some((
            tokio::spawn(flush_behind(self.shared.clone(), stopped)),
            running,
        ));
        let (ended_tx, ended) = tokio::sync::oneshot::channel::<()>();
        let syncer = Arc::clone(&self.syncer);
        let runtime = tokio::runtime::Handle::current();
        let spawned = std::thread::Builder::new()
            .name("canopy-journal-sync".into())
            .spawn(move || {
                // Acks may start tasks (a publish that awaits consumer groups).
                let _runtime = runtime.enter();
                syncer.run();
                drop(ended_tx);
            });
        match spawned {
            Ok(_) => self.ended = Some(ended),
            Err(error) => self.shared.break_down(&error),
        }
    }

    /// Lets the caller of the next round taken sync it in place, when no sync is
    /// under way then: see [`Appender::claimed`].
    pub(super) fn claim_next(&mut self) {
        self.claim = true;
    }

    /// The group the last round taken claimed, with what syncs it: the caller syncs
    /// it ([`Syncer::sync_claimed`]) once it holds nothing others wait for.
    pub(super) fn claimed(&mut self) -> Option<(Claimed, Arc<Syncer>)> {
        self.claim = false;
        let claimed = self.claimed.take()?;
        Some((claimed, Arc::clone(&self.syncer)))
    }

    /// Waits until every round taken is through, then flushes the unflushed rounds.
    pub(super) async fn close(mut self) {
        self.queue.close();
        if let Some(ended) = self.ended.take() {
            let _ = ended.await;
        }
        if let Some((flusher, running)) = self.flusher.take() {
            drop(running);
            let _ = flusher.await;
        }
        // Not needed for what was acknowledged (a restart replays the journal), but
        // a store closed cleanly starts without replaying.
        self.shared.flush().await;
    }

    /// Appends one round's record, sends the acks that do not wait for durability
    /// and hands the round to the sync thread.
    pub(super) async fn take(&mut self, mut round: RoundWrite) {
        if self.shared.broken.load(Ordering::Acquire) {
            self.shared.refuse(round, BROKEN);
            return;
        }
        let stale = round.epoch != self.shared.failures.load(Ordering::Acquire);
        // Durable acks without writes (duplicates) vouch for an earlier round, which
        // may be the one that failed.
        if stale && (round.batch.is_some() || !round.durable_acks.is_empty()) {
            self.shared.refuse(round, STALE);
            return;
        }
        self.keep_up().await;
        let record = match round.batch.as_ref() {
            None => None,
            Some(writes) => {
                let mut body = std::mem::take(&mut self.body);
                body.clear();
                writes.encode(&mut body);
                let appended = self.append(&body).await;
                self.body = body;
                match appended {
                    Ok(file) => {
                        self.next += 1;
                        Some((self.next - 1, file))
                    }
                    Err(Refusal::Round(reason)) => {
                        // Nothing of it is in the journal: later rounds decided
                        // before the sequencer hears of it are refused above. The
                        // sequencer then reads heads and offsets from the engine, so
                        // every round before this one must be there first, or their
                        // versions would be given again.
                        self.drain().await;
                        self.shared.failures.fetch_add(1, Ordering::AcqRel);
                        self.shared.refuse(round, &reason);
                        return;
                    }
                    Err(Refusal::Broken(error)) => {
                        self.shared.journal_failed.store(true, Ordering::Release);
                        self.shared.break_down(&error);
                        self.shared.refuse(round, BROKEN);
                        return;
                    }
                }
            }
        };
        if !round.immediate.is_empty() {
            self.shared
                .events
                .acknowledged(std::mem::take(&mut round.immediate));
        }
        self.pushed += 1;
        // Synced in place only for acks and barriers that wait for it: a round of
        // `received` publishes was answered above, and its caller has its own work.
        let waits = !round.durable_acks.is_empty() || !round.durable_barriers.is_empty();
        let claim = std::mem::take(&mut self.claim) && waits;
        self.claimed = self.queue.push(Journaled { round, record }, claim);
    }

    /// Holds the next round back while the sync thread is a queue's worth behind, or
    /// while the unflushed rounds are past their bound: the flusher is behind (the
    /// engine paces its writes while compaction catches up), so it waits for a flush
    /// rather than hold more in memory.
    async fn keep_up(&mut self) {
        let pushed = self.pushed;
        let _ = self
            .finished
            .wait_for(|finished| pushed - finished < SYNC_QUEUE as u64)
            .await;
        if self.shared.engine.unflushed().bytes() >= UNFLUSHED_MAX {
            self.shared.flush().await;
        }
    }

    /// Waits until everything appended so far is synced and applied.
    async fn drain(&mut self) {
        let pushed = self.pushed;
        let _ = self.finished.wait_for(|finished| *finished >= pushed).await;
    }

    async fn append(&mut self, body: &[u8]) -> Result<Arc<std::fs::File>, Refusal> {
        if body.len() as u64 > self.pair.capacity() / 2 {
            return Err(Refusal::Round(format!(
                "this round ({} bytes) is larger than half the journal ({} bytes): raise \
                 store.journal_mb",
                body.len(),
                self.pair.capacity()
            )));
        }
        for _ in 0..2 {
            match self.pair.append(self.next, body).map_err(Refusal::Broken)? {
                Appended::In(file) => return Ok(file),
                Appended::Full { wait_for } => {
                    if *self.held.borrow() < wait_for {
                        // Everything appended must reach the engine before the
                        // engine can hold it: this task is the one that writes it.
                        self.drain().await;
                        self.shared.flush().await;
                        if self.shared.broken.load(Ordering::Acquire) {
                            // What the other file holds may never reach the engine.
                            return Err(Refusal::Broken(StoreError::Refused(BROKEN.into())));
                        }
                        // The engine's log timer is slow behind a journal: flush now.
                        self.shared
                            .flush_wanted
                            .fetch_max(wait_for, Ordering::AcqRel);
                        let _ = self.shared.engine.flush_log().await;
                        if self.held.wait_for(|held| *held >= wait_for).await.is_err() {
                            return Err(Refusal::Broken(StoreError::Closed));
                        }
                    }
                    self.pair.switch().map_err(Refusal::Broken)?;
                }
            }
        }
        // A fresh file takes any record of at most half its size.
        Err(Refusal::Round(
            "the journal has no room for this round".to_owned(),
        ))
    }
}

enum Refusal {
    /// This round only: the journal is as it was.
    Round(String),
    /// The journal may hold what the engine never will.
    Broken(StoreError),
}

/// Follows the engine's durability: the last journal round its own log holds, which
/// says when a journal file may start over. Its log is ordered, so waiting for the
/// latest write covers every one before it.
pub(super) async fn track_engine(shared: Shared, held: watch::Sender<u64>) {
    let mut latest = shared.engine.unflushed().latest();
    while latest.changed().await.is_ok() {
        let Some((number, handle)) = latest.borrow_and_update().clone() else {
            continue;
        };
        if shared.flush_wanted.load(Ordering::Acquire) > *held.borrow() {
            let _ = shared.engine.flush_log().await;
        }
        match handle.await_durable().await {
            Ok(()) => {
                held.send_replace(number);
            }
            Err(error) => {
                report_failure(&error, "the engine's log could not be made durable");
                shared.break_down(&error);
                return;
            }
        }
    }
}

/// Writes the unflushed rounds to the engine once they are large or old enough,
/// pacing itself as the engine's L0 fills, until `stopped` closes.
async fn flush_behind(shared: Shared, mut stopped: watch::Receiver<()>) {
    let mut pacing = Pacing::default();
    let engine = Arc::clone(&shared.engine);
    let unflushed = engine.unflushed();
    loop {
        if shared.broken.load(Ordering::Acquire) {
            // Nothing is flushed any more (a restart replays the journal); waiting
            // on an old map's age would spin.
            return;
        }
        let joins_little = unflushed.joining() < JOINING_WORTH_WAITING;
        let after = if unflushed.flushes() > 0 && joins_little {
            FLUSH_SOON
        } else {
            FLUSH_AFTER
        };
        let wait = match unflushed.age() {
            Some(age) => after.saturating_sub(age),
            None => after,
        };
        tokio::select! {
            _ = stopped.changed() => return,
            () = shared.flush_due.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
        let due =
            unflushed.bytes() >= FLUSH_BYTES || unflushed.age().is_some_and(|age| age >= after);
        if !due {
            continue;
        }
        pacing.pace(&engine).await;
        shared.flush().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{RecvTimeoutError, channel};
    use std::time::Duration;

    use super::*;

    fn round(number: u64) -> Journaled {
        Journaled {
            round: RoundWrite {
                number,
                ..RoundWrite::default()
            },
            record: None,
        }
    }

    fn numbers(group: &[Journaled]) -> Vec<u64> {
        group.iter().map(|j| j.round.number).collect()
    }

    #[test]
    fn a_caller_claims_its_round_only_while_nothing_syncs_and_the_thread_waits_for_it() {
        let queue = Arc::new(SyncQueue::default());
        let claimed = queue.push(round(1), true).expect("nothing syncs: claimed");
        assert_eq!(numbers(&claimed.0), vec![1]);
        // A sync is under way: neither a caller nor the thread takes round 2 yet.
        assert!(queue.push(round(2), true).is_none());
        let (taken_tx, taken) = channel();
        let thread_queue = Arc::clone(&queue);
        let thread = std::thread::spawn(move || {
            while let Some(group) = thread_queue.next_group() {
                taken_tx.send(numbers(&group)).expect("test waits");
                thread_queue.release();
            }
        });
        assert_eq!(
            taken.recv_timeout(Duration::from_millis(100)),
            Err(RecvTimeoutError::Timeout),
            "the thread waits while the claimed group syncs"
        );
        queue.release();
        assert_eq!(taken.recv_timeout(Duration::from_secs(5)), Ok(vec![2]));
        // Without a claim the round goes to the thread.
        assert!(queue.push(round(3), false).is_none());
        assert_eq!(taken.recv_timeout(Duration::from_secs(5)), Ok(vec![3]));
        queue.close();
        thread
            .join()
            .expect("the thread ends once closed and empty");
    }

    #[test]
    fn a_closed_queue_ends_the_thread_only_once_a_claimed_group_is_done() {
        let queue = Arc::new(SyncQueue::default());
        let claimed = queue.push(round(1), true).expect("claimed");
        queue.close();
        let (ended_tx, ended) = channel();
        let thread_queue = Arc::clone(&queue);
        std::thread::spawn(move || {
            let next = thread_queue.next_group().map(|group| numbers(&group));
            ended_tx.send(next).expect("test waits");
        });
        assert_eq!(
            ended.recv_timeout(Duration::from_millis(100)),
            Err(RecvTimeoutError::Timeout),
            "a store closing waits for the claimed group"
        );
        drop(claimed);
        queue.release();
        assert_eq!(ended.recv_timeout(Duration::from_secs(5)), Ok(None));
    }
}
