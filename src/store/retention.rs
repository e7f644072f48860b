//! Retention by age and by a tenant's total bytes, enforced in the background.
//!
//! A pass walks each tenant's batch index oldest first (one key per group commit,
//! with each message's subject, version and size), deletes the messages that are
//! past their subject's age or that keep the tenant over its byte budget, and stops
//! at the first batch that is neither. Deletes go out in chunks of separate engine
//! writes outside the sequencer, so publishing never waits for retention. Before a
//! subject loses messages, its marker records the highest version and offset
//! removed, so a subject whose history is all gone still never reuses a version.
//! (Versions per subject are enforced by the sequencer as it appends.)

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use slatedb::WriteBatch;
use tokio_util::sync::CancellationToken;

use super::{Store, StoreError, keys, put_durably, record, runs, write_durably};
use crate::store::Engine;

/// Deletes per engine write.
const DELETE_CHUNK: usize = 1000;

/// What retention keeps; implemented from the store policies.
pub trait RetentionRules: Send + Sync + 'static {
    /// Milliseconds a message of `tenant`'s `subject` is kept (0: no age limit).
    fn max_age_ms(&self, tenant: &str, subject: &str) -> u64;
    /// The shortest age limit of any of `tenant`'s subjects (0: none), so a pass can
    /// stop at the first batch younger than it.
    fn shortest_max_age_ms(&self, tenant: &str) -> u64;
    /// Bytes of messages one tenant keeps (0: no limit).
    fn max_tenant_bytes(&self) -> u64;
}

/// The size a batch index entry gets once retention deleted its message, so later
/// passes skip it; entries keep their place, since a place is an offset.
const DELETED: u32 = u32::MAX;

/// What one pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionPass {
    pub messages: u64,
    pub bytes: u64,
}

impl Store {
    /// Runs a retention pass every `every` until the store closes.
    pub fn start_retention(self: &Arc<Self>, rules: Arc<dyn RetentionRules>, every: Duration) {
        let store = Arc::clone(self);
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match store.enforce_retention(rules.as_ref(), &stop).await {
                    Ok(pass) if pass.messages > 0 => tracing::info!(
                        messages = pass.messages,
                        bytes = pass.bytes,
                        "retention removed old messages"
                    ),
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "retention pass failed; retrying later"),
                }
            }
        });
    }

    /// One retention pass over every tenant.
    pub async fn enforce_retention(
        &self,
        rules: &dyn RetentionRules,
        stop: &CancellationToken,
    ) -> Result<RetentionPass, StoreError> {
        let mut total = RetentionPass::default();
        for tenant in tenants(self.db()).await? {
            if stop.is_cancelled() {
                break;
            }
            let own_age = self.tenant_max_age.read().get(tenant.as_str()).copied();
            let now = self.clock.now_ms();
            let pass = {
                let _deleting = self.deleting.lock().await;
                enforce_tenant(self.db(), &tenant, rules, own_age.unwrap_or(0), now, stop).await?
            };
            self.release(&tenant, pass.bytes).await;
            total.messages += pass.messages;
            total.bytes += pass.bytes;
        }
        Ok(total)
    }
}

/// The shorter of two age limits, 0 being none.
pub fn shorter(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
}

/// The tenants that have a batch index, found by seeking from one to the next.
async fn tenants(db: &Engine) -> Result<Vec<String>, StoreError> {
    let mut found = Vec::new();
    let mut from = Bytes::from_static(&[keys::BATCH]);
    let end = Bytes::from_static(&[keys::BATCH + 1]);
    loop {
        let mut iter = db.scan(from.clone()..end.clone()).await?;
        let Some(kv) = iter.next().await? else {
            return Ok(found);
        };
        let rest = kv.key.get(1..).unwrap_or_default();
        let Some(len) = rest.iter().position(|b| *b == 0) else {
            return Ok(found);
        };
        let tenant = String::from_utf8_lossy(&rest[..len]).into_owned();
        let mut next = BytesMut::with_capacity(len + 2);
        next.put_u8(keys::BATCH);
        next.put_slice(&rest[..len]);
        next.put_u8(1);
        from = next.freeze();
        found.push(tenant);
    }
}

async fn enforce_tenant(
    db: &Engine,
    tenant: &str,
    rules: &dyn RetentionRules,
    // The tenant's own age limit (0: none), on top of its subjects' policies.
    own_max_age_ms: u64,
    now: u64,
    stop: &CancellationToken,
) -> Result<RetentionPass, StoreError> {
    // Deleted from the engine, so first written there.
    db.flush_unflushed().await?;
    let cap = rules.max_tenant_bytes();
    let mut stored: u64 = 0;
    if cap > 0 {
        let mut batches = db
            .scan_flushed(keys::batch_range(tenant, 0), &db.durable_scan())
            .await?;
        while let Some(kv) = batches.next().await? {
            if let Some(batch) = record::decode_batch(kv.value) {
                stored += live_bytes(&batch);
            }
        }
    }
    let shortest = shorter(rules.shortest_max_age_ms(tenant), own_max_age_ms);
    let mut pass = RetentionPass::default();
    let mut work = Work::default();
    // Only what the engine holds: the rounds since the flush above are not deleted
    // this pass (their flush would write them again).
    let mut batches = db
        .scan_flushed(keys::batch_range(tenant, 0), &db.durable_scan())
        .await?;
    while let Some(kv) = batches.next().await? {
        let over_budget = cap > 0 && stored > cap;
        let Some(mut batch) = record::decode_batch(kv.value) else {
            continue;
        };
        let too_young = shortest == 0 || batch.time_ms.saturating_add(shortest) >= now;
        if !over_budget && too_young {
            // Batches are in time order: nothing later can have expired either.
            break;
        }
        let first = keys::batch_offset(&kv.key).unwrap_or(0);
        let mut changed = false;
        for (i, (subject, version, size)) in batch.messages.iter_mut().enumerate() {
            if *size == DELETED {
                continue;
            }
            let max_age = shorter(rules.max_age_ms(tenant, subject), own_max_age_ms);
            let expired = max_age > 0 && batch.time_ms.saturating_add(max_age) < now;
            if expired || (cap > 0 && stored > cap) {
                work.messages
                    .push((subject.clone(), *version, first + i as u64));
                stored = stored.saturating_sub(u64::from(*size));
                *size = DELETED;
                changed = true;
            }
        }
        if batch.messages.iter().all(|m| m.2 == DELETED) {
            work.floor = work.floor.max(first + batch.messages.len() as u64);
            work.batches.push((kv.key.clone(), None));
        } else if changed {
            let entries = batch.messages.iter().map(|(s, v, b)| (s.as_str(), *v, *b));
            work.batches.push((
                kv.key.clone(),
                Some(record::encode_batch(batch.time_ms, entries)),
            ));
        }
        if work.messages.len() >= DELETE_CHUNK {
            let (messages, bytes) = delete(db, tenant, &mut work).await?;
            pass.messages += messages;
            pass.bytes += bytes;
            if stop.is_cancelled() {
                return Ok(pass);
            }
        }
    }
    let (messages, bytes) = delete(db, tenant, &mut work).await?;
    pass.messages += messages;
    pass.bytes += bytes;
    Ok(pass)
}

pub(super) fn live_bytes(batch: &record::BatchEntry) -> u64 {
    batch
        .messages
        .iter()
        .filter(|m| m.2 != DELETED)
        .map(|m| u64::from(m.2))
        .sum()
}

/// Deletions gathered by a pass, written in chunks.
#[derive(Default)]
struct Work {
    /// (subject, version, offset) of each message to delete.
    messages: Vec<(String, u64, u64)>,
    /// Batch index keys to delete (`None`) or rewrite with entries marked deleted.
    batches: Vec<(Bytes, Option<Bytes>)>,
    /// The offset after the newest batch key deleted: the tenant's next offset can
    /// no longer be read from it, so it is kept as a floor.
    floor: u64,
}

/// Raises the subjects' markers, then deletes the messages and emptied batch keys.
/// Returns the messages deleted and the bytes of those that were still there (a
/// purge or a subject's version limit may have deleted one already).
async fn delete(db: &Engine, tenant: &str, work: &mut Work) -> Result<(u64, u64), StoreError> {
    if work.messages.is_empty() && work.batches.is_empty() {
        return Ok((0, 0));
    }
    let mut highest: HashMap<&str, (u64, u64)> = HashMap::new();
    for (subject, version, offset) in &work.messages {
        let entry = highest.entry(subject).or_insert((0, 0));
        if *version > entry.0 {
            *entry = (*version, *offset);
        }
    }
    for (subject, (version, offset)) in &highest {
        let current = db
            .get(keys::subject_marker(tenant, subject))
            .await?
            .and_then(record::decode_marker)
            .unwrap_or((0, 0));
        if *version > current.0 {
            put_durably(
                db,
                keys::subject_marker(tenant, subject),
                record::encode_marker(*version, *offset),
            )
            .await?;
        }
    }
    if work.floor > 0 {
        put_durably(db, keys::offset_floor(tenant), work.floor.to_be_bytes()).await?;
    }
    let count = work.messages.len() as u64;
    let mut bytes = 0;
    let mut batch = WriteBatch::new();
    // Oldest first, so each subject loses a prefix of its versions: everything up
    // to the highest one listed (what a purge or a version limit took is gone).
    for (subject, (version, _)) in &highest {
        let deleted =
            runs::delete_through(db, tenant, subject, *version, usize::MAX, &mut batch).await?;
        bytes += deleted.bytes;
    }
    work.messages.clear();
    for (key, rewrite) in work.batches.drain(..) {
        match rewrite {
            Some(value) => batch.put(&key, value),
            None => batch.delete(&key),
        }
    }
    write_durably(db, batch).await?;
    tokio::task::yield_now().await;
    Ok((count, bytes))
}
