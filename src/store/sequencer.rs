//! The one sequencer: the only code that assigns versions and offsets, and the only
//! writer of message keys.
//!
//! Each round drains up to `max_batch` queued appends, loads what it does not hold in
//! memory (a tenant's next offset, a subject's head, a msg id) by reverse seeks, then
//! decides every append in queue order, hands the accepted messages to routing in one
//! call, and writes them all in one engine write (group commit). A separate task waits
//! for each write's durability, in order, and only then sends the acks that asked for
//! it. Heads are never written per message: a head is recovered by one reverse seek of
//! its subject's range, so the only key a message costs is its own.
//!
//! Must never: write a message key from anywhere else, reorder appends of one subject,
//! send a durable ack before its write is durable.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use slatedb::config::{PutOptions, ScanOptions, Ttl, WriteOptions};
use slatedb::{Db, IterationOrder, WriteBatch, WriteHandle};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::record::{self, MsgIdEntry};
use super::snapshot::CompactionJob;
use super::{
    AckTo, AppendOutcome, AppendRequest, Durability, Expectation, Input, Sequenced, StoreError,
    StoreEvents, StoreSettings, StoredLimits, StoredUsage, TenantSet, keys,
};

/// Most msg ids remembered in memory per tenant; older ones are found in the store.
const MSG_ID_CACHE: usize = 100_000;
/// Group commits that may wait for durability before the sequencer holds back.
const DURABILITY_QUEUE: usize = 256;
/// Rounds the sequencer may decide ahead of the engine write of an earlier one: the
/// write (memtable insert) runs on another task, in parallel with the next round.
const WRITES_AHEAD: usize = 2;

#[derive(Debug, Clone, Copy, Default)]
struct Head {
    version: u64,
    /// Offset of the subject's last message (0 = none).
    offset: u64,
}

#[derive(Default)]
struct TenantState {
    /// The next offset to give; `None` until read from the store.
    next_offset: Option<u64>,
    /// How many subjects and message bytes the tenant has; read with `next_offset`.
    usage: StoredUsage,
    /// The usage changed this round: its key is written with the round.
    usage_changed: bool,
    heads: HashMap<Box<str>, Head>,
    msg_ids: MsgIds,
}

/// Recently stored msg ids, expiring by age and bounded by count.
#[derive(Default)]
struct MsgIds {
    entries: HashMap<Box<str>, MsgIdEntry>,
    order: VecDeque<Box<str>>,
}

impl MsgIds {
    fn expire(&mut self, now: u64, window_ms: u64) {
        while let Some(oldest) = self.order.front() {
            let stale = self
                .entries
                .get(oldest)
                .is_none_or(|e| e.time_ms.saturating_add(window_ms) < now);
            if !stale && self.order.len() <= MSG_ID_CACHE {
                break;
            }
            if let Some(id) = self.order.pop_front() {
                self.entries.remove(&id);
            }
        }
    }

    fn insert(&mut self, id: Box<str>, entry: MsgIdEntry) {
        if self.entries.insert(id.clone(), entry).is_none() {
            self.order.push_back(id);
        }
    }
}

/// One decided round, for the writer task.
#[derive(Default)]
struct RoundWrite {
    batch: Option<WriteBatch>,
    durable_acks: Vec<(Arc<str>, AckTo, AppendOutcome)>,
    /// Acks that do not wait for durability: conflicts, and `received` appends.
    immediate: Vec<(Arc<str>, AckTo, AppendOutcome)>,
    /// The failure count when the round was decided.
    epoch: u64,
    /// Signalled once this round (and so everything before it) is durable.
    durable_barriers: Vec<tokio::sync::oneshot::Sender<()>>,
    /// The round's number, for `Sequencer::written`.
    number: u64,
}

/// A write whose acks wait for its durability.
struct PendingDurable {
    /// When the write was handed to the engine.
    written_at: std::time::Instant,
    handle: Option<WriteHandle>,
    acks: Vec<(Arc<str>, AckTo, AppendOutcome)>,
    barriers: Vec<tokio::sync::oneshot::Sender<()>>,
}

pub(super) struct Sequencer {
    db: Arc<Db>,
    events: Arc<dyn StoreEvents>,
    tenants: HashMap<Arc<str>, TenantState>,
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
    limits: HashMap<Arc<str>, StoredLimits>,
    /// Bytes deleted outside the sequencer, not yet taken off the tenants' usage.
    released: HashMap<Arc<str>, u64>,
    /// Tenants at their bytes limit, for front ends to refuse early.
    bytes_full: Arc<TenantSet>,
    /// Sizes of the messages a subject's version limit drops this round, read by
    /// `load`: (tenant, subject, version) to header and payload bytes.
    dropped_sizes: HashMap<MessageKey, u64>,
    /// Sizes of the messages of version-limited subjects appended in the last
    /// rounds, which may not be in the engine yet when `load` looks for them.
    recent_sizes: VecDeque<(u64, HashMap<MessageKey, u64>)>,
    /// Rounds decided so far.
    rounds: u64,
    /// The number of the last round whose write reached the engine: its messages
    /// are read from the engine, which also sees what purges deleted since.
    written: Arc<AtomicU64>,
}

/// A message by tenant, subject and version.
type MessageKey = (Arc<str>, Arc<str>, u64);

/// Rounds whose write may still be on its way to the engine when a later round
/// loads: the ones queued for the writer and the one it is writing.
const UNWRITTEN_ROUNDS: usize = WRITES_AHEAD + 2;

/// A tenant's part of one round: its first offset and (subject, version, bytes) list.
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
        db: Arc<Db>,
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
            tenants: HashMap::new(),
            window_ms: u64::try_from(settings.dedupe_window.as_millis()).unwrap_or(u64::MAX),
            max_batch: settings.max_batch.max(1),
            clock: settings.clock.clone(),
            durable_tx,
            compactions,
            failures: Arc::new(AtomicU64::new(0)),
            epoch_seen: 0,
            stats,
            limits: HashMap::new(),
            released: HashMap::new(),
            bytes_full,
            dropped_sizes: HashMap::new(),
            recent_sizes: VecDeque::new(),
            rounds: 0,
            written: Arc::new(AtomicU64::new(0)),
        }
    }

    pub(super) async fn run(mut self, mut queue: mpsc::Receiver<Input>, stop: CancellationToken) {
        let (durable_tx, durable_rx) = mpsc::channel(DURABILITY_QUEUE);
        let acker = tokio::spawn(acknowledge(
            durable_rx,
            Arc::clone(&self.events),
            self.durable_tx.clone(),
            Arc::clone(&self.stats),
        ));
        let (write_tx, write_rx) = mpsc::channel(WRITES_AHEAD);
        let writer = tokio::spawn(write_rounds(
            Arc::clone(&self.db),
            Arc::clone(&self.events),
            Arc::clone(&self.failures),
            write_rx,
            durable_tx,
            Arc::clone(&self.stats),
            Arc::clone(&self.written),
        ));
        let mut requests = Vec::with_capacity(self.max_batch);
        let mut barriers = Vec::new();
        let mut durable_barriers = Vec::new();
        loop {
            let first = tokio::select! {
                biased;
                request = queue.recv() => request,
                _ = stop.cancelled() => {
                    // Take what is already queued, then stop.
                    queue.close();
                    queue.recv().await
                }
            };
            let Some(first) = first else { break };
            let mut next = Some(first);
            while let Some(input) = next.take() {
                match input {
                    Input::Append(request) => requests.push(request),
                    Input::Barrier(passed) => barriers.push(passed),
                    Input::DurableBarrier(passed) => durable_barriers.push(passed),
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
                if requests.len() < self.max_batch {
                    next = queue.try_recv().ok();
                }
            }
            let mut write = self.round(&mut requests).await;
            write.durable_barriers = std::mem::take(&mut durable_barriers);
            for passed in barriers.drain(..) {
                let _ = passed.send(());
            }
            if write_tx.send(write).await.is_err() {
                break;
            }
        }
        drop(write_tx);
        let _ = writer.await;
        let _ = acker.await;
    }

    /// Decides and routes one round of appends, and prepares its write.
    async fn round(&mut self, requests: &mut Vec<AppendRequest>) -> RoundWrite {
        // A write failed since the last round: what memory holds may be ahead of the
        // store, so read heads and offsets again.
        let epoch = self.failures.load(Ordering::Acquire);
        if epoch != self.epoch_seen {
            self.tenants.clear();
            // Sizes of rounds that were never written, whose versions come again.
            self.recent_sizes.clear();
            self.epoch_seen = epoch;
        }
        if let Err(error) = self.load(requests).await {
            tracing::error!(%error, "store read failed; refusing this round of appends");
            self.fail_all(requests, &error);
            return RoundWrite::default();
        }
        let now = self.clock.now_ms();
        let mut batch = WriteBatch::new();
        let mut assigned: Vec<Assigned> = Vec::new();
        let mut acks = Vec::new();
        let mut immediate = Vec::new();
        // Per tenant: first offset and (subject, version) list of this round.
        let mut index: HashMap<Arc<str>, RoundIndex> = HashMap::new();
        let msg_id_options = PutOptions {
            ttl: Ttl::ExpireAfterMillis(self.window_ms.max(1)),
        };

        let mut this_round_sizes = HashMap::new();
        // Tenants whose usage this round changes, each once.
        let mut changed: Vec<Arc<str>> = Vec::new();
        for (tenant, bytes) in self.released.drain() {
            if let Some(state) = self.tenants.get_mut(&tenant) {
                state.usage.bytes = state.usage.bytes.saturating_sub(bytes);
                if !std::mem::replace(&mut state.usage_changed, true) {
                    changed.push(tenant);
                }
            }
        }

        for (position, request) in requests.iter().enumerate() {
            let state = self.tenants.entry(Arc::clone(&request.tenant)).or_default();
            if let Some(id) = &request.msg_id {
                state.msg_ids.expire(now, self.window_ms);
                if let Some(seen) = state.msg_ids.entries.get(id) {
                    let outcome = AppendOutcome::Duplicate {
                        subject: Arc::from(seen.subject.as_str()),
                        version: seen.version,
                        offset: seen.offset,
                    };
                    if let Some(ack) = &request.ack {
                        acks.push((Arc::clone(&request.tenant), ack.clone(), outcome));
                    }
                    continue;
                }
            }
            let head = state
                .heads
                .get(&*request.subject)
                .copied()
                .unwrap_or_default();
            if let Some(expected) = request.expect {
                let holds = match expected {
                    Expectation::Version(v) => v == head.version,
                    Expectation::LastOffset(o) => o == head.offset,
                };
                if !holds {
                    let outcome = AppendOutcome::Conflict {
                        subject: Arc::clone(&request.subject),
                        expected,
                        current_version: head.version,
                        current_offset: head.offset,
                    };
                    if let Some(ack) = &request.ack {
                        immediate.push((Arc::clone(&request.tenant), ack.clone(), outcome));
                    }
                    continue;
                }
            }
            if request.messages.is_empty() {
                continue;
            }
            let limits = self
                .limits
                .get(&request.tenant)
                .copied()
                .unwrap_or_default();
            let bytes: u64 = request
                .messages
                .iter()
                .map(|m| (m.headers.len() + m.payload.len()) as u64)
                .sum();
            let over = if head.version == 0
                && limits
                    .max_subjects
                    .is_some_and(|max| state.usage.subjects >= max)
            {
                Some(format!(
                    "tenant {} is at its limit of {} subjects",
                    request.tenant,
                    limits.max_subjects.unwrap_or_default()
                ))
            } else if limits.max_bytes.is_some_and(|max| {
                // An append nobody hears back from is refused only at the limit, as
                // front ends refuse it with an error there: crossing the limit by
                // one append beats losing it without a word.
                match request.ack {
                    Some(_) => state.usage.bytes.saturating_add(bytes) > max,
                    None => state.usage.bytes >= max,
                }
            }) {
                Some(format!(
                    "tenant {} is at its limit of {} stored bytes",
                    request.tenant,
                    limits.max_bytes.unwrap_or_default()
                ))
            } else {
                None
            };
            if let Some(reason) = over {
                match &request.ack {
                    Some(ack) => immediate.push((
                        Arc::clone(&request.tenant),
                        ack.clone(),
                        AppendOutcome::QuotaExceeded { reason },
                    )),
                    None => tracing::debug!(%reason, "an append without an ack was refused"),
                }
                continue;
            }
            state.usage.bytes += bytes;
            if !std::mem::replace(&mut state.usage_changed, true) {
                changed.push(Arc::clone(&request.tenant));
            }
            let next_offset = state.next_offset.get_or_insert(1);
            let entry = index
                .entry(Arc::clone(&request.tenant))
                .or_insert_with(|| (*next_offset, Vec::new()));
            let mut new_head = head;
            for (i, message) in request.messages.iter().enumerate() {
                new_head.version += 1;
                new_head.offset = *next_offset;
                *next_offset += 1;
                batch.put(
                    keys::message(&request.tenant, &request.subject, new_head.version),
                    record::encode_record(
                        new_head.offset,
                        now,
                        message.flags,
                        &message.headers,
                        &message.payload,
                    ),
                );
                if request.retain {
                    // MQTT's rule: an empty retained publish clears the retained
                    // message; the publish itself is still stored and delivered.
                    let key = keys::retained(&request.tenant, &request.subject);
                    if message.payload.is_empty() {
                        batch.delete(key);
                    } else {
                        batch.put(
                            key,
                            record::encode_retained(
                                new_head.version,
                                new_head.offset,
                                now,
                                message.flags,
                                &message.headers,
                                &message.payload,
                            ),
                        );
                    }
                }
                if request.max_versions > 0 && new_head.version > request.max_versions {
                    let dropped = new_head.version - request.max_versions;
                    batch.delete(keys::message(&request.tenant, &request.subject, dropped));
                    let key = (
                        Arc::clone(&request.tenant),
                        Arc::clone(&request.subject),
                        dropped,
                    );
                    let size = self
                        .dropped_sizes
                        .remove(&key)
                        .or_else(|| this_round_sizes.get(&key).copied());
                    if let Some(size) = size {
                        state.usage.bytes = state.usage.bytes.saturating_sub(size);
                    }
                }
                let size = message.headers.len() + message.payload.len();
                if request.max_versions > 0 {
                    this_round_sizes.insert(
                        (
                            Arc::clone(&request.tenant),
                            Arc::clone(&request.subject),
                            new_head.version,
                        ),
                        size as u64,
                    );
                }
                entry.1.push((
                    Arc::clone(&request.subject),
                    new_head.version,
                    u32::try_from(size).unwrap_or(u32::MAX),
                ));
                assigned.push(Assigned {
                    request: position,
                    message: i,
                    version: new_head.version,
                    offset: new_head.offset,
                });
            }
            if let Some(compaction) = request.compaction.filter(|c| c.every > 0)
                && new_head.version / compaction.every > head.version / compaction.every
            {
                let job = CompactionJob {
                    tenant: Arc::clone(&request.tenant),
                    subject: Arc::clone(&request.subject),
                    version: new_head.version / compaction.every * compaction.every,
                    compaction,
                };
                // Best effort: when the compactor is behind, the next multiple covers it.
                let _ = self.compactions.try_send(job);
            }
            if head.version == 0 {
                batch.put(
                    keys::subject_marker(&request.tenant, &request.subject),
                    record::encode_marker(0, 0),
                );
                // The count rides in the same batch as the marker, so they never disagree.
                state.usage.subjects += 1;
            }
            match state.heads.get_mut(&*request.subject) {
                Some(h) => *h = new_head,
                None => {
                    state.heads.insert(Box::from(&*request.subject), new_head);
                }
            }
            if let Some(id) = &request.msg_id {
                let seen = MsgIdEntry {
                    subject: request.subject.to_string(),
                    version: new_head.version,
                    offset: new_head.offset,
                    time_ms: now,
                };
                batch.put_with_options(
                    keys::msg_id(&request.tenant, id),
                    record::encode_msg_id(&seen),
                    &msg_id_options,
                );
                state.msg_ids.insert(id.clone(), seen);
            }
            if let Some(ack) = &request.ack {
                let outcome = AppendOutcome::Stored {
                    subject: Arc::clone(&request.subject),
                    version: new_head.version,
                    offset: new_head.offset,
                    count: request.messages.len(),
                };
                match request.durability {
                    Durability::Durable => {
                        acks.push((Arc::clone(&request.tenant), ack.clone(), outcome))
                    }
                    Durability::Received => {
                        immediate.push((Arc::clone(&request.tenant), ack.clone(), outcome))
                    }
                }
            }
        }

        self.dropped_sizes.clear();
        if self.recent_sizes.len() >= UNWRITTEN_ROUNDS {
            self.recent_sizes.pop_front();
        }
        self.rounds += 1;
        self.recent_sizes.push_back((self.rounds, this_round_sizes));
        let mut usage_written = false;
        for tenant in &changed {
            if let Some(state) = self.tenants.get_mut(tenant) {
                state.usage_changed = false;
                batch.put(keys::tenant_usage(tenant), encode_usage(state.usage));
                usage_written = true;
            }
        }
        for tenant in &changed {
            if let Some(state) = self.tenants.get(tenant) {
                self.mark_full(tenant, state.usage);
            }
        }

        for (tenant, (first, messages)) in &index {
            batch.put(
                keys::batch(tenant, *first),
                record::encode_batch(now, messages.iter().map(|(s, v, b)| (&**s, *v, *b))),
            );
        }

        // Live delivery first: it never waits for the store.
        if !assigned.is_empty() {
            let sequenced: Vec<Sequenced<'_>> = assigned
                .iter()
                .filter_map(|a| {
                    let request = requests.get(a.request)?;
                    let message = request.messages.get(a.message)?;
                    Some(Sequenced {
                        tenant: &request.tenant,
                        subject: &request.subject,
                        version: a.version,
                        offset: a.offset,
                        time_ms: now,
                        flags: message.flags,
                        headers: &message.headers,
                        payload: &message.payload,
                        route: &request.route,
                    })
                })
                .collect();
            self.events.sequenced(&sequenced);
        }

        requests.clear();
        RoundWrite {
            batch: (!index.is_empty() || usage_written).then_some(batch),
            durable_acks: acks,
            immediate,
            epoch: self.epoch_seen,
            durable_barriers: Vec::new(),
            number: self.rounds,
        }
    }

    /// Reads what the round needs and memory does not hold.
    async fn load(&mut self, requests: &[AppendRequest]) -> Result<(), StoreError> {
        let mut queued: HashMap<(Arc<str>, Arc<str>), u64> = HashMap::new();
        let released: Vec<Arc<str>> = self.released.keys().cloned().collect();
        for tenant in released {
            if self
                .tenants
                .get(&tenant)
                .is_none_or(|s| s.next_offset.is_none())
            {
                self.load_tenant(&tenant).await?;
            }
        }
        for request in requests {
            let tenant = Arc::clone(&request.tenant);
            let known_offset = self
                .tenants
                .get(&tenant)
                .is_some_and(|s| s.next_offset.is_some());
            if !known_offset {
                self.load_tenant(&tenant).await?;
            }
            let state = self.tenants.entry(tenant).or_default();
            if !state.heads.contains_key(&*request.subject) {
                let head = load_head(&self.db, &request.tenant, &request.subject).await?;
                state.heads.insert(Box::from(&*request.subject), head);
            }
            if request.max_versions > 0 {
                // The versions this append pushes out, counting the round's earlier
                // appends to the subject (a refused one only makes a read in vain).
                let head = state.heads.get(&*request.subject).map_or(0, |h| h.version);
                let earlier = queued
                    .entry((Arc::clone(&request.tenant), Arc::clone(&request.subject)))
                    .or_default();
                let first = head + *earlier + 1;
                *earlier += request.messages.len() as u64;
                for version in first..first + request.messages.len() as u64 {
                    let Some(dropped) = version.checked_sub(request.max_versions) else {
                        continue;
                    };
                    if dropped == 0 {
                        continue;
                    }
                    let key = (
                        Arc::clone(&request.tenant),
                        Arc::clone(&request.subject),
                        dropped,
                    );
                    let written = self.written.load(Ordering::Acquire);
                    let recent = self
                        .recent_sizes
                        .iter()
                        .filter(|(round, _)| *round > written)
                        .find_map(|(_, sizes)| sizes.get(&key).copied());
                    let size = match recent {
                        Some(size) => Some(size),
                        None => self
                            .db
                            .get(keys::message(&request.tenant, &request.subject, dropped))
                            .await?
                            .and_then(record::decode_record)
                            .map(|r| (r.headers.len() + r.payload.len()) as u64),
                    };
                    // Not found: appended earlier in this very round, whose sizes
                    // the round itself keeps.
                    if let Some(size) = size {
                        self.dropped_sizes.insert(key, size);
                    }
                }
            }
            if let Some(id) = &request.msg_id
                && !state.msg_ids.entries.contains_key(id)
                && let Some(value) = self.db.get(keys::msg_id(&request.tenant, id)).await?
                && let Some(seen) = record::decode_msg_id(value)
                && seen.time_ms.saturating_add(self.window_ms) >= self.clock.now_ms()
            {
                state.msg_ids.insert(id.clone(), seen);
            }
        }
        Ok(())
    }

    /// Reads a tenant's next offset and usage into memory.
    async fn load_tenant(&mut self, tenant: &Arc<str>) -> Result<(), StoreError> {
        let next = load_next_offset(&self.db, tenant).await?;
        let usage = load_usage(&self.db, tenant).await?;
        let state = self.tenants.entry(Arc::clone(tenant)).or_default();
        state.next_offset = Some(next);
        state.usage = usage;
        self.mark_full(tenant, usage);
        Ok(())
    }

    /// Keeps the tenant in or out of the set of those at their bytes limit.
    fn mark_full(&self, tenant: &Arc<str>, usage: StoredUsage) {
        let full = self
            .limits
            .get(tenant)
            .and_then(|l| l.max_bytes)
            .is_some_and(|max| usage.bytes >= max);
        if full != self.bytes_full.contains(tenant) {
            self.bytes_full.set(tenant, full);
        }
    }

    fn fail_all(&mut self, requests: &mut Vec<AppendRequest>, error: &StoreError) {
        let reason = format!("the store could not read: {error}");
        let acks: Vec<_> = requests
            .drain(..)
            .filter_map(|r| {
                r.ack.map(|ack| {
                    (
                        r.tenant,
                        ack,
                        AppendOutcome::Failed {
                            reason: reason.clone(),
                        },
                    )
                })
            })
            .collect();
        if !acks.is_empty() {
            self.events.acknowledged(acks);
        }
    }
}

/// The offset after the last one the tenant's newest batch used (1 for a new tenant),
/// or the floor retention left when it deleted the newest batches.
pub(super) async fn load_next_offset(db: &Db, tenant: &str) -> Result<u64, StoreError> {
    let options = ScanOptions::default().with_order(IterationOrder::Descending);
    let mut newest = db
        .scan_with_options(keys::batch_range(tenant, 0), &options)
        .await?;
    let from_batches = match newest.next().await? {
        Some(kv) => {
            let first = keys::batch_offset(&kv.key).unwrap_or(0);
            let count = record::decode_batch(kv.value).map_or(0, |b| b.messages.len() as u64);
            first + count
        }
        None => 1,
    };
    let floor = db
        .get(keys::offset_floor(tenant))
        .await?
        .and_then(|v| <[u8; 8]>::try_from(&v[..]).ok())
        .map_or(0, u64::from_be_bytes);
    Ok(from_batches.max(floor).max(1))
}

/// The usage key's value: subjects, then bytes, big-endian.
fn encode_usage(usage: StoredUsage) -> Bytes {
    let mut value = [0u8; 16];
    value[..8].copy_from_slice(&usage.subjects.to_be_bytes());
    value[8..].copy_from_slice(&usage.bytes.to_be_bytes());
    Bytes::copy_from_slice(&value)
}

/// What the tenant keeps: its usage key, or what is missing from it in a store
/// written before it (the subjects by counting markers, the bytes by summing the
/// batch index), found once.
pub(super) async fn load_usage(db: &Db, tenant: &str) -> Result<StoredUsage, StoreError> {
    let value = db.get(keys::tenant_usage(tenant)).await?;
    let word = |at: usize| {
        value
            .as_ref()
            .and_then(|v| v.get(at..at + 8))
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map(u64::from_be_bytes)
    };
    let subjects = match word(0) {
        Some(subjects) => subjects,
        None => {
            let mut markers = db
                .scan(keys::subject_marker_range(tenant, "", None))
                .await?;
            let mut count = 0;
            while markers.next().await?.is_some() {
                count += 1;
            }
            count
        }
    };
    let bytes = match word(8) {
        Some(bytes) => bytes,
        None => {
            let mut batches = db.scan(keys::batch_range(tenant, 0)).await?;
            let mut bytes = 0;
            while let Some(kv) = batches.next().await? {
                if let Some(batch) = record::decode_batch(kv.value) {
                    bytes += super::retention::live_bytes(&batch);
                }
            }
            bytes
        }
    };
    Ok(StoredUsage { subjects, bytes })
}

fn is_fenced(error: &slatedb::Error) -> bool {
    error.kind() == slatedb::ErrorKind::Closed(slatedb::CloseReason::Fenced)
}

/// Logs a failed write; a fenced store is said loudly, since this server can no
/// longer store anything until it is restarted on a store of its own.
fn report_failure(error: &slatedb::Error, what: &str) {
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

fn failure_reason(what: &str, error: &slatedb::Error) -> String {
    if is_fenced(error) {
        "this server was fenced: another canopy server has taken over its store".to_owned()
    } else {
        format!("{what}: {error}")
    }
}

/// A subject's head. A subject that never existed has no marker: one point lookup,
/// which the engine's bloom filters answer without reading data, so publishing to
/// new subjects stays cheap however much is stored. An existing subject's head is one
/// reverse seek of its message range; when the range is empty (purged or expired) the
/// marker says how far versions went.
async fn load_head(db: &Db, tenant: &str, subject: &str) -> Result<Head, StoreError> {
    let Some(marker) = db.get(keys::subject_marker(tenant, subject)).await? else {
        return Ok(Head::default());
    };
    let options = ScanOptions::default().with_order(IterationOrder::Descending);
    let mut newest = db
        .scan_with_options(keys::message_range(tenant, subject, 1), &options)
        .await?;
    if let Some(kv) = newest.next().await? {
        return Ok(Head {
            version: keys::message_version(&kv.key).unwrap_or(0),
            offset: record::decode_record(kv.value).map_or(0, |r| r.offset),
        });
    }
    let (version, offset) = record::decode_marker(marker).unwrap_or((0, 0));
    Ok(Head { version, offset })
}

/// Writes decided rounds in order. A failed write, and every round decided before the
/// sequencer learned of it (their versions follow the lost ones), is refused, so a
/// subject's versions never skip.
async fn write_rounds(
    db: Arc<Db>,
    events: Arc<dyn StoreEvents>,
    failures: Arc<AtomicU64>,
    mut rounds: mpsc::Receiver<RoundWrite>,
    durable: mpsc::Sender<PendingDurable>,
    stats: Arc<super::stats::StoreStats>,
    written: Arc<AtomicU64>,
) {
    while let Some(round) = rounds.recv().await {
        let started = std::time::Instant::now();
        let failed_before = failures.load(Ordering::Acquire);
        let result = match round.batch {
            None => Ok(None),
            Some(_) if round.epoch != failed_before => {
                Err("an earlier write failed before this one; retry".to_owned())
            }
            Some(batch) => match db.write_with_options(batch, &WriteOptions::default()).await {
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
                    return;
                }
            }
            Err(reason) => {
                let failed = round
                    .durable_acks
                    .into_iter()
                    .chain(round.immediate)
                    .map(|(tenant, ack, outcome)| match outcome {
                        // What was stored is not; refusals (conflicts, quotas) stand.
                        AppendOutcome::Stored { .. } | AppendOutcome::Duplicate { .. } => (
                            tenant,
                            ack,
                            AppendOutcome::Failed {
                                reason: reason.clone(),
                            },
                        ),
                        refused => (tenant, ack, refused),
                    })
                    .collect();
                events.acknowledged(failed);
            }
        }
    }
}

/// Waits for each write's durability in order, then sends its acks and moves the
/// durable watch.
async fn acknowledge(
    mut queue: mpsc::Receiver<PendingDurable>,
    events: Arc<dyn StoreEvents>,
    durable: watch::Sender<u64>,
    stats: Arc<super::stats::StoreStats>,
) {
    while let Some(pending) = queue.recv().await {
        let result = match &pending.handle {
            Some(handle) => {
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
