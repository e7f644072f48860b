//! The sequencer's path to durability through the journal (a local folder): each
//! decided round is appended to the journal, a group of them made durable by one
//! data sync started as soon as the previous one ends, and only then applied to the
//! unflushed rounds (`store/unflushed.rs`, which every read sees) and acknowledged.
//! A flusher writes those rounds to the engine in large batches behind; the engine's
//! own log is flushed behind that, on its timer; what it durably holds says when a
//! journal file may start over.
//!
//! Three tasks: the journal task does every step in round order (the record, the
//! immediate acks, applying the round, the durable acks and barriers), with only the
//! sync itself on a blocking thread, so a lone publish pays no hop between steps;
//! the flusher writes the unflushed rounds to the engine; the tracker follows the
//! last round the engine's own log holds durably.
//!
//! Must never: apply a round before the journal holds it (reads show the unflushed
//! rounds and the engine's memory as durable), send a durable ack before the sync
//! that covers its round, or go on after a failure that may have left a round in the
//! journal but not in the engine: from then on every append is refused until a
//! restart replays the journal.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::{Notify, mpsc, watch};

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
/// ...and past this much the journal task waits for a flush before taking more.
const UNFLUSHED_MAX: usize = 4 * FLUSH_BYTES;

/// What the journal task and the tracker share.
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
    /// A journal round the journal task waits for the engine to hold durably (a full
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

/// A group of appended rounds and the data sync that covers them, under way on a
/// blocking thread. (Run in place with `block_in_place` instead, a lone publish
/// waited longer: 300 µs p50 against 255 µs, BENCHMARKS.md.)
struct Syncing {
    sync: tokio::task::JoinHandle<std::io::Result<()>>,
    group: Vec<Journaled>,
}

/// The journal task: appends each round's record, makes groups of them durable, then
/// applies them to the unflushed rounds and acknowledges them, all in round order.
pub(super) struct JournalTask {
    pub(super) shared: Shared,
    pub(super) pair: JournalPair,
    /// The number the next journaled round takes.
    pub(super) next: u64,
    /// The last journal round the engine holds durably (the tracker's).
    pub(super) held: watch::Receiver<u64>,
    /// Moves once per group of rounds applied, for followers.
    pub(super) durable: watch::Sender<u64>,
    /// The sequencer's number of the last round its reads can see.
    pub(super) written: Arc<AtomicU64>,
    /// Appended, waiting for the next sync.
    appended: Vec<Journaled>,
    body: Vec<u8>,
}

impl JournalTask {
    pub(super) fn new(
        shared: Shared,
        (pair, next): (JournalPair, u64),
        held: watch::Receiver<u64>,
        durable: watch::Sender<u64>,
        written: Arc<AtomicU64>,
    ) -> JournalTask {
        JournalTask {
            shared,
            pair,
            next,
            held,
            durable,
            written,
            appended: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Runs until the sequencer stops and everything it sent is through. One task
    /// for every step, so a lone publish pays no hop between them: only the sync
    /// runs elsewhere (a blocking call), and it starts as soon as the previous one
    /// ended with whatever was appended meanwhile.
    pub(super) async fn run(mut self, mut rounds: mpsc::Receiver<RoundWrite>) {
        let (running, stopped) = watch::channel(());
        let flusher = tokio::spawn(flush_behind(self.shared.clone(), stopped));
        let mut syncing: Option<Syncing> = None;
        let mut open = true;
        loop {
            if syncing.is_none() && !self.appended.is_empty() {
                syncing = self.start_sync().await;
            }
            if !open && syncing.is_none() && self.appended.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                synced = wait(&mut syncing) => {
                    if let Some(done) = syncing.take() {
                        self.finish(done.group, synced).await;
                    }
                }
                round = rounds.recv(), if open && self.appended.len() < SYNC_QUEUE => {
                    let Some(round) = round else {
                        open = false;
                        continue;
                    };
                    self.take(round, &mut syncing).await;
                    while self.appended.len() < SYNC_QUEUE
                        && let Ok(round) = rounds.try_recv()
                    {
                        self.take(round, &mut syncing).await;
                    }
                }
            }
        }
        drop(running);
        let _ = flusher.await;
        // Not needed for what was acknowledged (a restart replays the journal), but
        // a store closed cleanly starts without replaying.
        self.shared.flush().await;
    }

    /// Appends one round's record and sends the acks that do not wait for durability.
    async fn take(&mut self, mut round: RoundWrite, syncing: &mut Option<Syncing>) {
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
        let record = match round.batch.as_ref() {
            None => None,
            Some(writes) => {
                let mut body = std::mem::take(&mut self.body);
                body.clear();
                writes.encode(&mut body);
                let appended = self.append(&body, syncing).await;
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
                        self.drain(syncing).await;
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
        self.appended.push(Journaled { round, record });
    }

    /// Makes durable and writes to the engine everything appended so far.
    async fn drain(&mut self, syncing: &mut Option<Syncing>) {
        if let Some(mut done) = syncing.take() {
            let synced = outcome(&mut done.sync).await;
            self.finish(done.group, synced).await;
        }
        while let Some(mut done) = self.start_sync().await {
            let synced = outcome(&mut done.sync).await;
            self.finish(done.group, synced).await;
        }
    }

    async fn append(
        &mut self,
        body: &[u8],
        syncing: &mut Option<Syncing>,
    ) -> Result<Arc<std::fs::File>, Refusal> {
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
                        self.drain(syncing).await;
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

    /// Starts the sync of what was appended; a group with nothing to sync (rounds
    /// that wrote nothing, behind rounds already synced) is finished at once.
    async fn start_sync(&mut self) -> Option<Syncing> {
        loop {
            if self.appended.is_empty() {
                return None;
            }
            let group = std::mem::take(&mut self.appended);
            let mut files: Vec<Arc<std::fs::File>> = Vec::new();
            for (_, file) in group.iter().filter_map(|j| j.record.as_ref()) {
                if !files.iter().any(|f| Arc::ptr_eq(f, file)) {
                    files.push(Arc::clone(file));
                }
            }
            if files.is_empty() {
                self.finish(group, Ok(())).await;
                continue;
            }
            let started = std::time::Instant::now();
            let stats = Arc::clone(&self.shared.stats);
            let sync_files = move || {
                let synced = files.iter().try_for_each(|file| file.sync_data());
                stats.durable.record(started.elapsed());
                synced
            };
            let sync = tokio::task::spawn_blocking(sync_files);
            return Some(Syncing { sync, group });
        }
    }

    /// Applies a synced group's rounds to the unflushed rounds in order, sends their
    /// durable acks, passes their barriers and moves the durable watch.
    async fn finish(&mut self, group: Vec<Journaled>, synced: std::io::Result<()>) {
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
        let held = unflushed.bytes();
        if held >= UNFLUSHED_MAX {
            // The flusher is behind (the engine paces its writes while compaction
            // catches up): wait for it rather than hold more in memory.
            self.shared.flush().await;
        } else if held >= FLUSH_BYTES {
            self.shared.flush_due.notify_one();
        }
    }
}

/// The outcome of a sync.
async fn outcome(sync: &mut tokio::task::JoinHandle<std::io::Result<()>>) -> std::io::Result<()> {
    sync.await
        .unwrap_or_else(|stopped| Err(std::io::Error::other(stopped)))
}

/// The outcome of the sync under way, or never when there is none.
async fn wait(syncing: &mut Option<Syncing>) -> std::io::Result<()> {
    match syncing {
        Some(under_way) => outcome(&mut under_way.sync).await,
        None => std::future::pending().await,
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
