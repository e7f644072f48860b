//! Snapshots: a key stream's state as of a version, stored beside its history.
//!
//! Clients store their own snapshots (`put_snapshot`), and policies can have the
//! server fold every N versions with a [`Reducer`](super::reduce::Reducer) — the
//! compactor task below. "Replay from snapshot" is the latest snapshot and then the
//! versions after it. History is kept unless a policy says to drop what a snapshot
//! covers; the message at the snapshot's own version always stays, so the subject's
//! head can still be recovered from its range. The compactor is best effort: a job
//! that cannot run (a queue full, a version not durable in time) is skipped and the
//! next multiple of N covers it.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use slatedb::{IterationOrder, WriteBatch};
use tokio::sync::{mpsc, watch};

use super::reduce::ReducerKind;
use super::runs::{self, Seen};
use super::{Store, StoreError, keys, put_durably, record, write_durably};
use crate::store::Engine;

/// A stored snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub subject: String,
    pub version: u64,
    pub time_ms: u64,
    /// Whether the payload is JSON (`Content-Type: application/json`), so front ends
    /// can show it inline.
    pub json: bool,
    pub payload: Bytes,
}

/// A policy's instruction to fold a subject every `every` versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    pub every: u64,
    pub reducer: ReducerKind,
    /// Keep the events a snapshot covers (the default) or drop them.
    pub keep_history: bool,
}

/// One fold to do: `subject` up to `version`.
#[derive(Debug)]
pub(super) struct CompactionJob {
    pub tenant: Arc<str>,
    pub subject: Arc<str>,
    pub version: u64,
    pub compaction: Compaction,
}

/// How long a job waits for its version to become durable.
const DURABLE_WAIT: Duration = Duration::from_secs(30);
/// Deletes per engine write when dropping covered history.
const DELETE_CHUNK: usize = 1000;

/// The top bit of the stored time marks a JSON payload. Times never reach it, and
/// snapshots written before the flag existed read as not JSON.
const JSON_FLAG: u64 = 1 << 63;

/// The next bit marks a payload sealed with the subject's data key (`sealed.rs`).
const SEALED_FLAG: u64 = 1 << 62;

/// Where a snapshot is: its tenant, subject and version.
#[derive(Clone, Copy)]
struct At<'a> {
    tenant: &'a str,
    subject: &'a str,
    version: u64,
}

fn encode(db: &Engine, at: At<'_>, time_ms: u64, json: bool, payload: &[u8]) -> Bytes {
    let keys = db.sealing().keys_of(at.tenant);
    let sealed =
        super::sealed::seal_snapshot(keys.as_deref(), at.tenant, at.subject, at.version, payload);
    let mut stamp = if json { time_ms | JSON_FLAG } else { time_ms };
    if sealed.is_some() {
        stamp |= SEALED_FLAG;
    }
    let payload = sealed.as_deref().unwrap_or(payload);
    let mut out = BytesMut::with_capacity(8 + payload.len());
    out.put_u64(stamp);
    out.put_slice(payload);
    out.freeze()
}

/// A stored snapshot; `None` when it is malformed or sealed with a key that is gone.
fn decode(db: &Engine, at: At<'_>, mut value: Bytes) -> Option<Snapshot> {
    if value.len() < 8 {
        return None;
    }
    let stamp = value.get_u64();
    if stamp & SEALED_FLAG != 0 {
        let keys = db.sealing().keys_of(at.tenant);
        value = super::sealed::open_snapshot(
            keys.as_deref(),
            at.tenant,
            at.subject,
            at.version,
            &value,
        )?;
    }
    Some(Snapshot {
        subject: at.subject.to_owned(),
        version: at.version,
        time_ms: stamp & !(JSON_FLAG | SEALED_FLAG),
        json: stamp & JSON_FLAG != 0,
        payload: value,
    })
}

/// The newest snapshot of `subject` at or below `at_or_below`.
async fn latest(
    db: &Engine,
    tenant: &str,
    subject: &str,
    at_or_below: u64,
) -> Result<Option<Snapshot>, StoreError> {
    let options = db.durable_scan().with_order(IterationOrder::Descending);
    let mut newest = db
        .scan_with_options(
            keys::snapshots_up_to(tenant, subject, at_or_below),
            &options,
        )
        .await?;
    Ok(match newest.next().await? {
        Some(kv) => keys::message_version(&kv.key).and_then(|version| {
            let at = At {
                tenant,
                subject,
                version,
            };
            decode(db, at, kv.value)
        }),
        None => None,
    })
}

impl Store {
    /// Stores a client's snapshot of `subject` at `version`, which must exist;
    /// `json` says the payload is JSON.
    pub async fn put_snapshot(
        &self,
        tenant: &str,
        subject: &str,
        version: u64,
        payload: &[u8],
        json: bool,
    ) -> Result<(), StoreError> {
        let head = self
            .get(tenant, subject, None)
            .await?
            .map_or(0, |m| m.version);
        if version == 0 || version > head {
            return Err(StoreError::Refused(format!(
                "{subject} is at version {head}: a snapshot must be at a version from 1 to {head}"
            )));
        }
        let at = At {
            tenant,
            subject,
            version,
        };
        put_durably(
            self.db(),
            keys::snapshot(tenant, subject, version),
            encode(self.db(), at, self.clock.now_ms(), json, payload),
        )
        .await?;
        Ok(())
    }

    /// The newest snapshot of `subject`, or the newest at or below a version.
    pub async fn snapshot(
        &self,
        tenant: &str,
        subject: &str,
        at_or_below: Option<u64>,
    ) -> Result<Option<Snapshot>, StoreError> {
        latest(self.db(), tenant, subject, at_or_below.unwrap_or(u64::MAX)).await
    }
}

/// Runs folds as the sequencer asks for them, one at a time.
pub(super) async fn compactor(
    db: Arc<Engine>,
    mut durable: watch::Receiver<u64>,
    mut jobs: mpsc::Receiver<CompactionJob>,
    deleting: Arc<tokio::sync::Mutex<()>>,
    clock: crate::clock::Clock,
) {
    while let Some(job) = jobs.recv().await {
        if let Err(error) = compact(&db, &deleting, &mut durable, &job, &clock).await {
            tracing::warn!(
                %error,
                tenant = &*job.tenant,
                subject = &*job.subject,
                version = job.version,
                "compaction skipped"
            );
        }
    }
}

async fn compact(
    db: &Engine,
    deleting: &tokio::sync::Mutex<()>,
    durable: &mut watch::Receiver<u64>,
    job: &CompactionJob,
    clock: &crate::clock::Clock,
) -> Result<(), StoreError> {
    let (tenant, subject, target) = (&*job.tenant, &*job.subject, job.version);
    let deadline = tokio::time::Instant::now() + DURABLE_WAIT;
    loop {
        durable.borrow_and_update();
        if runs::at(db, tenant, subject, target, Seen::Durable)
            .await?
            .is_some()
        {
            break;
        }
        if tokio::time::timeout_at(deadline, durable.changed())
            .await
            .is_err()
        {
            return Err(StoreError::Refused(format!(
                "version {target} did not become durable in time"
            )));
        }
    }
    let base = latest(db, tenant, subject, target).await?;
    let from = base.as_ref().map_or(1, |s| s.version + 1);
    if from > target {
        return Ok(());
    }
    let reducer = job.compaction.reducer.reducer();
    // A merged state is JSON; a "last" state is JSON when the message it came from said so.
    let mut json = match job.compaction.reducer {
        ReducerKind::JsonMerge => true,
        ReducerKind::Last => base.as_ref().is_some_and(|s| s.json),
    };
    let mut state: Option<Vec<u8>> = base.map(|s| s.payload.to_vec());
    let mut events = runs::Scan::open(db, tenant, subject, from, Seen::Durable).await?;
    while let Some((version, event)) = events.next().await? {
        if version > target {
            break;
        }
        match reducer.fold(state.as_deref(), &event.payload) {
            Ok(next) => {
                state = Some(next);
                if job.compaction.reducer == ReducerKind::Last {
                    json = record::says_json(&event.headers);
                }
            }
            Err(reason) => {
                tracing::warn!(subject, version, reason, "event left out of the snapshot");
            }
        }
    }
    let Some(state) = state else {
        return Ok(());
    };
    let at = At {
        tenant,
        subject,
        version: target,
    };
    put_durably(
        db,
        keys::snapshot(tenant, subject, target),
        encode(db, at, clock.now_ms(), json, &state),
    )
    .await?;
    if !job.compaction.keep_history {
        drop_covered(db, deleting, tenant, subject, target).await?;
    }
    Ok(())
}

/// Deletes the messages below `version`; the message at `version` stays so the
/// subject's head is still recovered from its own range.
async fn drop_covered(
    db: &Engine,
    deleting: &tokio::sync::Mutex<()>,
    tenant: &str,
    subject: &str,
    version: u64,
) -> Result<(), StoreError> {
    let _deleting = deleting.lock().await;
    // Deleted from the engine, so first written there.
    db.flush_unflushed().await?;
    loop {
        let mut batch = WriteBatch::new();
        let deleted = runs::delete_through(
            db,
            tenant,
            subject,
            version.saturating_sub(1),
            DELETE_CHUNK,
            &mut batch,
        )
        .await?;
        write_durably(db, batch).await?;
        if deleted.done {
            return Ok(());
        }
    }
}
