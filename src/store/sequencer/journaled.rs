//! The sequencer's path to durability through the journal (a local folder): each
//! decided round is appended to the journal, a group of them made durable by one
//! data sync started as soon as the previous one ends, and only then written to the
//! engine and acknowledged. The engine's own log is flushed behind, on its timer;
//! what it durably holds says when a journal file may start over.
//!
//! Four tasks, each in round order: the appender (records, and the immediate acks),
//! the syncer (one `fdatasync` per group), the engine writer (memtable, durable acks,
//! barriers) and the tracker (the last round the engine holds durably).
//!
//! Must never: write a round to the engine before the journal holds it (reads show
//! the engine's memory as durable), send a durable ack before the sync that covers
//! its round, or go on after a failure that may have left a round in the journal
//! but not in the engine: from then on every append is refused until a restart
//! replays the journal.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use slatedb::WriteHandle;
use slatedb::config::{FlushOptions, FlushType, WriteOptions};
use tokio::sync::{mpsc, watch};

use crate::store::Engine;
use crate::store::journaled::{Appended, JournalPair, ROUND_KEY};
use crate::store::{StoreError, StoreEvents};

use super::writer::{Pacing, RoundWrite, refuse, report_failure};

/// Rounds appended and waiting for their sync: the next group's bound.
pub(super) const SYNC_QUEUE: usize = 256;

/// What every stage shares.
#[derive(Clone)]
pub(super) struct Shared {
    pub(super) engine: Arc<Engine>,
    pub(super) events: Arc<dyn StoreEvents>,
    /// Counts failures, as without a journal: a round decided before the count
    /// changed is refused before it is journaled.
    pub(super) failures: Arc<AtomicU64>,
    /// Set by a failure after which the journal and the engine may disagree.
    pub(super) broken: Arc<AtomicBool>,
    pub(super) stats: Arc<crate::store::stats::StoreStats>,
    /// A journal round the appender waits for the engine to hold durably: whoever
    /// sees it written flushes the engine's log instead of waiting for its timer.
    pub(super) flush_wanted: Arc<AtomicU64>,
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

    fn refuse(&self, round: RoundWrite, reason: &str) {
        refuse(&*self.events, round, reason);
    }
}

/// A round on its way through the stages.
pub(super) struct Journaled {
    round: RoundWrite,
    /// Its journal round number, when it writes anything.
    number: Option<u64>,
    /// The file its record went to, to sync.
    file: Option<Arc<std::fs::File>>,
}

/// Appends each round's record to the journal, in order, and sends the acks that do
/// not wait for durability.
pub(super) async fn append_rounds(
    shared: Shared,
    mut pair: JournalPair,
    mut next: u64,
    mut rounds: mpsc::Receiver<RoundWrite>,
    synced: mpsc::Sender<Journaled>,
    mut held: watch::Receiver<u64>,
) {
    let mut body = Vec::new();
    while let Some(mut round) = rounds.recv().await {
        if shared.broken.load(Ordering::Acquire) {
            shared.refuse(round, BROKEN);
            continue;
        }
        let (number, file) = match round.batch.as_ref() {
            None => (None, None),
            Some(_) if round.epoch != shared.failures.load(Ordering::Acquire) => {
                shared.refuse(round, "an earlier write failed before this one; retry");
                continue;
            }
            Some(writes) => {
                body.clear();
                writes.encode(&mut body);
                match append(&shared, &mut pair, next, &body, &mut held).await {
                    Ok(file) => {
                        next += 1;
                        (Some(next - 1), Some(file))
                    }
                    Err(Refusal::Round(reason)) => {
                        // Nothing of it is in the journal: later rounds decided
                        // before the sequencer hears of it are refused above.
                        shared.failures.fetch_add(1, Ordering::AcqRel);
                        shared.refuse(round, &reason);
                        continue;
                    }
                    Err(Refusal::Broken(error)) => {
                        shared.break_down(&error);
                        shared.refuse(round, BROKEN);
                        continue;
                    }
                }
            }
        };
        if !round.immediate.is_empty() {
            shared
                .events
                .acknowledged(std::mem::take(&mut round.immediate));
        }
        let journaled = Journaled {
            round,
            number,
            file,
        };
        if synced.send(journaled).await.is_err() {
            shared.events.lost();
            return;
        }
    }
}

enum Refusal {
    /// This round only: the journal is as it was.
    Round(String),
    /// The journal may hold what the engine never will.
    Broken(StoreError),
}

async fn append(
    shared: &Shared,
    pair: &mut JournalPair,
    number: u64,
    body: &[u8],
    held: &mut watch::Receiver<u64>,
) -> Result<Arc<std::fs::File>, Refusal> {
    if body.len() as u64 > pair.capacity() / 2 {
        return Err(Refusal::Round(format!(
            "this round ({} bytes) is larger than half the journal ({} bytes): raise \
             store.journal_mb",
            body.len(),
            pair.capacity()
        )));
    }
    for _ in 0..2 {
        match pair.append(number, body).map_err(Refusal::Broken)? {
            Appended::In(file) => return Ok(file),
            Appended::Full { wait_for } => {
                if *held.borrow() < wait_for {
                    // The engine's log timer is slow behind a journal: flush now what
                    // the engine has, and have the tracker flush once it has the
                    // rounds still on their way.
                    shared.flush_wanted.fetch_max(wait_for, Ordering::AcqRel);
                    let engine = Arc::clone(&shared.engine);
                    tokio::spawn(async move { flush_log(&engine).await });
                    if held.wait_for(|held| *held >= wait_for).await.is_err() {
                        return Err(Refusal::Broken(StoreError::Closed));
                    }
                }
                pair.switch().map_err(Refusal::Broken)?;
            }
        }
    }
    // A fresh file takes any record of at most half its size.
    Err(Refusal::Round(
        "the journal has no room for this round".to_owned(),
    ))
}

/// Makes groups of appended rounds durable, one data sync per group, started as soon
/// as the previous one ends.
pub(super) async fn sync_rounds(
    shared: Shared,
    mut appended: mpsc::Receiver<Journaled>,
    written: mpsc::Sender<Vec<Journaled>>,
) {
    while let Some(first) = appended.recv().await {
        let mut group = vec![first];
        while group.len() < SYNC_QUEUE
            && let Ok(next) = appended.try_recv()
        {
            group.push(next);
        }
        let mut files: Vec<Arc<std::fs::File>> = Vec::new();
        for file in group.iter().filter_map(|j| j.file.as_ref()) {
            if !files.iter().any(|f| Arc::ptr_eq(f, file)) {
                files.push(Arc::clone(file));
            }
        }
        if !files.is_empty() {
            let started = std::time::Instant::now();
            let synced = tokio::task::spawn_blocking(move || {
                files.iter().try_for_each(|file| file.sync_data())
            })
            .await
            .unwrap_or_else(|join| Err(std::io::Error::other(join)));
            shared.stats.durable.record(started.elapsed());
            if let Err(error) = synced {
                shared.break_down(&error);
                for journaled in group {
                    shared.refuse(journaled.round, BROKEN);
                }
                continue;
            }
        }
        if written.send(group).await.is_err() {
            shared.events.lost();
            return;
        }
    }
}

/// Writes journaled rounds to the engine in order, then sends their durable acks,
/// passes their barriers and moves the durable watch.
pub(super) async fn write_rounds(
    shared: Shared,
    mut groups: mpsc::Receiver<Vec<Journaled>>,
    durable: watch::Sender<u64>,
    written: Arc<AtomicU64>,
    latest: watch::Sender<Option<(u64, WriteHandle)>>,
) {
    let mut pacing = Pacing::default();
    while let Some(group) = groups.recv().await {
        for journaled in group {
            let mut round = journaled.round;
            let writes = round.batch.take();
            if let (Some(writes), Some(number), false) = (
                writes,
                journaled.number,
                shared.broken.load(Ordering::Acquire),
            ) {
                pacing.pace(&shared.engine).await;
                let started = std::time::Instant::now();
                let mut batch = writes.into_batch();
                batch.put(ROUND_KEY, number.to_be_bytes());
                match shared
                    .engine
                    .write_with_options(batch, &WriteOptions::default())
                    .await
                {
                    Ok(handle) => {
                        shared.stats.write.record(started.elapsed());
                        latest.send_replace(Some((number, handle)));
                        durable.send_modify(|n| *n += 1);
                    }
                    Err(error) => {
                        report_failure(&error, "store write failed after the journal held it");
                        shared.break_down(&error);
                    }
                }
            }
            // The journal holds the round: its acks are true even when the engine
            // did not take it (a restart writes it there). Its barriers promise
            // reads that see it, which only the engine gives.
            if !round.durable_acks.is_empty() {
                shared.events.acknowledged(round.durable_acks);
            }
            if !shared.broken.load(Ordering::Acquire) {
                written.fetch_max(round.number, Ordering::AcqRel);
                for passed in round.durable_barriers {
                    let _ = passed.send(());
                }
            }
        }
    }
}

/// Follows the engine's durability: the last journal round its own log holds, which
/// says when a journal file may start over. Its log is ordered, so waiting for the
/// latest write covers every one before it.
pub(super) async fn track_engine(
    shared: Shared,
    mut latest: watch::Receiver<Option<(u64, WriteHandle)>>,
    held: watch::Sender<u64>,
) {
    while latest.changed().await.is_ok() {
        let Some((number, handle)) = latest.borrow_and_update().clone() else {
            continue;
        };
        if shared.flush_wanted.load(Ordering::Acquire) > *held.borrow() {
            flush_log(&shared.engine).await;
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

/// Flushes the engine's log; a failure shows in the writes' own durability.
async fn flush_log(engine: &Engine) {
    let wal = FlushOptions {
        flush_type: FlushType::Wal,
    };
    let _ = engine.flush_with_options(wal).await;
}
