//! The sequencer's writer and acker tasks: decided rounds are written to the engine in
//! order, then each write's durability is awaited in order before its acks are sent.
//!
//! Must never: decide anything (versions, offsets and refusals come decided in the
//! round), reorder rounds, or send a durable ack before its write is durable.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::FutureExt;
use slatedb::WriteHandle;
use slatedb::config::WriteOptions;
use tokio::sync::{mpsc, watch};

use crate::store::Engine;
use crate::store::writes::Writes;
use crate::store::{AckTo, AppendOutcome, StoreEvents};

/// One decided round, for the writer task.
#[derive(Default)]
pub(super) struct RoundWrite {
    pub(super) batch: Option<Writes>,
    pub(super) durable_acks: Vec<(Arc<str>, AckTo, AppendOutcome)>,
    /// Acks that do not wait for durability: conflicts, and `received` appends.
    pub(super) immediate: Vec<(Arc<str>, AckTo, AppendOutcome)>,
    /// The failure count when the round was decided.
    pub(super) epoch: u64,
    /// Signalled once this round (and so everything before it) is durable.
    pub(super) durable_barriers: Vec<tokio::sync::oneshot::Sender<()>>,
    /// The round's number, for `Sequencer::written`.
    pub(super) number: u64,
}

/// A write whose acks wait for its durability.
pub(super) struct PendingDurable {
    /// When the write was handed to the engine.
    pub(super) written_at: std::time::Instant,
    pub(super) handle: Option<WriteHandle>,
    pub(super) acks: Vec<(Arc<str>, AckTo, AppendOutcome)>,
    pub(super) barriers: Vec<tokio::sync::oneshot::Sender<()>>,
}

pub(super) fn is_fenced(error: &slatedb::Error) -> bool {
    error.kind() == slatedb::ErrorKind::Closed(slatedb::CloseReason::Fenced)
}

/// Logs a failed write; a fenced store is said loudly, since this server can no
/// longer store anything until it is restarted on a store of its own.
pub(super) fn report_failure(error: &slatedb::Error, what: &str) {
    if is_fenced(error) {
        tracing::error!(
            %error,
            "FENCED: another canopy server opened this store and took it over; this server \
             stores nothing more and refuses every durable publish. Stop it, or point it at \
             another store"
        );
    } else {
        tracing::error!(%error, "{what}");
    }
}

pub(super) fn failure_reason(what: &str, error: &slatedb::Error) -> String {
    if is_fenced(error) {
        "this server was fenced: another canopy server has taken over its store".to_owned()
    } else {
        format!("{what}: {error}")
    }
}

/// Acks a round may carry and still be flushed at once on a local folder.
const EAGER_MAX_ACKS: usize = 8;

/// L0 files from which writes are slowed down. SlateDB stops every write once L0 holds
/// `open::L0_MAX_SSTS` files and waits for a compaction, for seconds on a busy machine;
/// slowing down before, harder as L0 fills, gives the compactor time and turns that
/// stop into later acks.
const L0_SLOW: usize = super::super::open::L0_MAX_SSTS / 2;

/// How full L0 is, read from the engine's manifest at most every 10 ms.
#[derive(Default)]
pub(super) struct Pacing {
    checked: Option<std::time::Instant>,
    l0: usize,
}

impl Pacing {
    pub(super) async fn pace(&mut self, db: &Engine) {
        let now = std::time::Instant::now();
        if self
            .checked
            .is_none_or(|at| now.duration_since(at) >= std::time::Duration::from_millis(10))
        {
            self.l0 = db.slatedb().manifest().l0().len();
            self.checked = Some(now);
        }
        if let Some(wait) = pause_for(self.l0) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// How long a round waits with `l0` files in L0: nothing below `L0_SLOW`, then 0.25 ms,
/// doubling per file, at most 16 ms.
fn pause_for(l0: usize) -> Option<std::time::Duration> {
    let over = l0.checked_sub(L0_SLOW)?;
    Some(std::time::Duration::from_micros(250 << over.min(6)))
}

/// Why a round decided before a failed write is refused.
pub(super) const STALE: &str = "an earlier write failed before this one; retry";

/// Writes decided rounds in order. A failed write, and every round decided before the
/// sequencer learned of it (their versions follow the lost ones), is refused, so a
/// subject's versions never skip.
pub(super) async fn write_rounds(
    db: Arc<Engine>,
    events: Arc<dyn StoreEvents>,
    failures: Arc<AtomicU64>,
    mut rounds: mpsc::Receiver<RoundWrite>,
    durable: mpsc::Sender<PendingDurable>,
    stats: Arc<super::stats::StoreStats>,
    written: Arc<AtomicU64>,
) {
    let mut pacing = Pacing::default();
    while let Some(mut round) = rounds.recv().await {
        let failed_before = failures.load(Ordering::Acquire);
        if round.batch.is_some() && round.epoch == failed_before {
            pacing.pace(&db).await;
        }
        // The engine's own write time, without the pacing's wait.
        let started = std::time::Instant::now();
        let stale = round.epoch != failed_before;
        let result = match round.batch.take() {
            // Durable acks without writes (duplicates) vouch for an earlier round,
            // which may be the one that failed.
            None if stale && !round.durable_acks.is_empty() => Err(STALE.to_owned()),
            None => Ok(None),
            Some(_) if stale => Err(STALE.to_owned()),
            Some(writes) => match db
                .write_with_options(writes.into_batch(), &WriteOptions::default())
                .await
            {
                Ok(handle) => {
                    stats.write.record(started.elapsed());
                    Ok(Some(handle))
                }
                Err(error) => {
                    report_failure(
                        &error,
                        "store write failed; the round's appends are refused",
                    );
                    failures.fetch_add(1, Ordering::AcqRel);
                    Err(failure_reason("the store could not write", &error))
                }
            },
        };
        match result {
            Ok(handle) => {
                written.fetch_max(round.number, Ordering::AcqRel);
                if !round.immediate.is_empty() {
                    events.acknowledged(round.immediate);
                }
                let pending = PendingDurable {
                    written_at: started,
                    handle,
                    acks: round.durable_acks,
                    barriers: round.durable_barriers,
                };
                if durable.send(pending).await.is_err() {
                    // The acker is gone: nothing written from here is vouched for.
                    events.lost();
                    return;
                }
            }
            Err(reason) => refuse(&*events, round, &reason),
        }
    }
}

/// Refuses a round that was not stored: what it stored is not, its refusals
/// (conflicts, quotas) stand, and its barriers drop, so their waiters learn.
pub(super) fn refuse(events: &dyn StoreEvents, round: RoundWrite, reason: &str) {
    // Before the round's barriers drop: a barrier's waiter then learns.
    events.lost();
    let failed = round
        .durable_acks
        .into_iter()
        .chain(round.immediate)
        .map(|(tenant, ack, outcome)| match outcome {
            AppendOutcome::Stored { .. } | AppendOutcome::Duplicate { .. } => (
                tenant,
                ack,
                AppendOutcome::Failed {
                    reason: reason.to_owned(),
                },
            ),
            refused => (tenant, ack, refused),
        })
        .collect();
    events.acknowledged(failed);
}

/// Waits for each write's durability in order, then sends its acks and moves the
/// durable watch.
///
/// With `eager` (a local folder), a small write that is not durable yet and has no
/// other write queued behind it is flushed at once instead of at the next tick of the
/// engine's flush timer, so a lone publish waits for one flush, not for the timer;
/// a busy store keeps the timer's larger groups. On object storage every flush is
/// a billed PUT, and the timer (`store.flush_interval_ms`) paces them.
pub(super) async fn acknowledge(
    mut queue: mpsc::Receiver<PendingDurable>,
    events: Arc<dyn StoreEvents>,
    durable: watch::Sender<u64>,
    stats: Arc<super::stats::StoreStats>,
    eager: Option<Arc<Engine>>,
) {
    // What was queued behind the write being waited for, taken out of the channel so
    // the acker can see whether any of it is a write (a round without one is only a
    // barrier: a consumer group waiting for durability, say, which must not turn a
    // lone publish's flush into a wait for the timer).
    let mut behind: std::collections::VecDeque<PendingDurable> = Default::default();
    loop {
        let pending = match behind.pop_front() {
            Some(pending) => pending,
            None => match queue.recv().await {
                Some(pending) => pending,
                None => break,
            },
        };
        // At most a queue's worth: with the channel's own, at most twice
        // DURABILITY_QUEUE writes wait, and the writer is still held back.
        while behind.len() < super::DURABILITY_QUEUE
            && let Ok(next) = queue.try_recv()
        {
            behind.push_back(next);
        }
        let result = match &pending.handle {
            Some(handle) => {
                // Only for a small write with no write queued behind it: a queue or a
                // large round means a busy store, where the timer's larger groups
                // cost fewer fsyncs.
                if let Some(db) = &eager
                    && behind.iter().all(|b| b.handle.is_none())
                    && pending.acks.len() + pending.barriers.len() <= EAGER_MAX_ACKS
                    && handle.await_durable().now_or_never().is_none()
                {
                    // A failed flush shows in the handle's own result below.
                    let _ = db.flush_log().await;
                }
                let result = handle.await_durable().await;
                stats.durable.record(pending.written_at.elapsed());
                result
            }
            None => Ok(()),
        };
        let acks = match result {
            Ok(()) => pending.acks,
            Err(error) => {
                report_failure(&error, "a store write did not become durable");
                events.lost();
                let reason = failure_reason("the store could not make the write durable", &error);
                pending
                    .acks
                    .into_iter()
                    .map(|(tenant, ack, _)| {
                        (
                            tenant,
                            ack,
                            AppendOutcome::Failed {
                                reason: reason.clone(),
                            },
                        )
                    })
                    .collect()
            }
        };
        if pending.handle.is_some() {
            durable.send_modify(|n| *n += 1);
        }
        if !acks.is_empty() {
            events.acknowledged(acks);
        }
        for passed in pending.barriers {
            let _ = passed.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{L0_SLOW, pause_for};

    #[test]
    fn rounds_wait_longer_as_l0_fills_and_never_past_16_ms() {
        assert_eq!(pause_for(0), None);
        assert_eq!(pause_for(L0_SLOW - 1), None);
        assert_eq!(pause_for(L0_SLOW), Some(Duration::from_micros(250)));
        assert_eq!(pause_for(L0_SLOW + 2), Some(Duration::from_millis(1)));
        assert_eq!(pause_for(L0_SLOW + 6), Some(Duration::from_millis(16)));
        assert_eq!(pause_for(usize::MAX), Some(Duration::from_millis(16)));
        // The engine stops writes at L0_MAX_SSTS: by then a round waits the longest.
        assert_eq!(
            pause_for(crate::store::open::L0_MAX_SSTS),
            Some(Duration::from_millis(16))
        );
    }
}
