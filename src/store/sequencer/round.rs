//! One round of the sequencer: loads what the round's appends need and memory does not
//! hold, decides each append in queue order (versions, offsets, expectations, msg ids,
//! quotas), routes the accepted messages and builds the round's one write batch.
//!
//! Must never: write to the engine itself (the writer task does), send an ack that waits
//! for durability, or decide appends of one subject out of queue order.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use slatedb::WriteBatch;
use slatedb::config::{PutOptions, Ttl};

use crate::store::record::{self, MsgIdEntry};
use crate::store::runs::{self, RUN_MAX_BYTES, RUN_MAX_MESSAGES, Seen};
use crate::store::snapshot::CompactionJob;
use crate::store::{
    AppendOutcome, AppendRequest, Durability, Expectation, Sequenced, StoreError, StoredUsage, keys,
};

use super::tenant::{encode_usage, load_head, load_next_offset, load_usage};
use super::writer::RoundWrite;
use super::{Assigned, RoundIndex, SeededMap, Sequencer, UNWRITTEN_ROUNDS};

/// The messages of one subject in one round, written as one key.
struct OpenRun {
    first: u64,
    builder: record::RunBuilder,
}

impl OpenRun {
    fn new(first: u64, payload: usize) -> OpenRun {
        OpenRun {
            first,
            builder: record::RunBuilder::new(payload),
        }
    }

    /// Whether `version` can go on this run: the next one, and the run not full.
    fn takes(&self, version: u64) -> bool {
        version == self.first + u64::from(self.builder.count())
            && self.builder.count() < RUN_MAX_MESSAGES
            && self.builder.bytes() < RUN_MAX_BYTES
    }

    fn write(self, batch: &mut WriteBatch, tenant: &str, subject: &str) {
        if self.builder.count() > 0 {
            batch.put(
                keys::message(tenant, subject, self.first),
                self.builder.finish(),
            );
        }
    }
}

impl Sequencer {
    /// Decides and routes one round of appends, and prepares its write.
    pub(super) async fn round(&mut self, requests: &mut Vec<AppendRequest>) -> RoundWrite {
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
            // A fenced engine fails the reads before any write: said as loudly.
            match &error {
                StoreError::Engine(engine) => super::writer::report_failure(
                    engine,
                    "store read failed; refusing this round of appends",
                ),
                other => {
                    tracing::error!(error = %other, "store read failed; refusing this round of appends")
                }
            }
            self.fail_all(requests, &error);
            return RoundWrite::default();
        }
        let now = self.clock.now_ms();
        let mut batch = WriteBatch::new();
        let mut assigned: Vec<Assigned> = Vec::new();
        let mut acks = Vec::new();
        let mut immediate = Vec::new();
        // Per tenant: first offset and (subject, version) list of this round.
        let mut index: SeededMap<Arc<str>, RoundIndex> = SeededMap::default();
        let msg_id_options = PutOptions {
            ttl: Ttl::ExpireAfterMillis(self.window_ms.max(1)),
        };

        let mut this_round_sizes = HashMap::new();
        // Per (tenant, subject): the run of this round's messages being built.
        let mut runs: SeededMap<(Arc<str>, Arc<str>), OpenRun> = SeededMap::default();
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
                // What the tenant's offsets reached so far, this round's earlier
                // appends included: they were decided before this one.
                let stream_last = state.next_offset.unwrap_or(1).saturating_sub(1);
                let (holds, current_offset) = match expected {
                    Expectation::Version(v) => (v == head.version, head.offset),
                    Expectation::LastOffset(o) => (o == head.offset, head.offset),
                    Expectation::StreamOffset(o) => (o == stream_last, stream_last),
                };
                if !holds {
                    let outcome = AppendOutcome::Conflict {
                        subject: Arc::clone(&request.subject),
                        expected,
                        current_version: head.version,
                        current_offset,
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
                if request.max_versions > 0 {
                    // The sequencer drops this subject's oldest version by key, in
                    // the same write: one key per version.
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
                } else {
                    let run = runs
                        .entry((Arc::clone(&request.tenant), Arc::clone(&request.subject)))
                        .or_insert_with(|| OpenRun::new(new_head.version, message.payload.len()));
                    if !run.takes(new_head.version) {
                        let full = std::mem::replace(
                            run,
                            OpenRun::new(new_head.version, message.payload.len()),
                        );
                        full.write(&mut batch, &request.tenant, &request.subject);
                    }
                    run.builder.push(
                        new_head.offset,
                        now,
                        message.flags,
                        &message.headers,
                        &message.payload,
                    );
                }
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
                    let key = (
                        Arc::clone(&request.tenant),
                        Arc::clone(&request.subject),
                        dropped,
                    );
                    let delete = self.dropped_in_runs.remove(&key).unwrap_or(Some(dropped));
                    if let Some(version) = delete {
                        batch.delete(keys::message(&request.tenant, &request.subject, version));
                    }
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
        self.dropped_in_runs.clear();
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

        for ((tenant, subject), run) in runs {
            run.write(&mut batch, &tenant, &subject);
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
    pub(super) async fn load(&mut self, requests: &[AppendRequest]) -> Result<(), StoreError> {
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
                        None => {
                            let run = runs::run_holding(
                                &self.db,
                                &request.tenant,
                                &request.subject,
                                dropped,
                                Seen::Written,
                            )
                            .await?;
                            if let Some(run) = run.as_ref().filter(|r| r.records.len() > 1) {
                                let last = run.end() - 1 == dropped;
                                self.dropped_in_runs
                                    .insert(key.clone(), last.then_some(run.first));
                            }
                            run.and_then(|r| {
                                r.get(dropped)
                                    .map(|r| (r.headers.len() + r.payload.len()) as u64)
                            })
                        }
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
    pub(super) fn mark_full(&self, tenant: &Arc<str>, usage: StoredUsage) {
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
        // A fenced engine fails reads too; the publisher hears why, as for a write.
        let reason = match error {
            StoreError::Engine(engine) => {
                super::writer::failure_reason("the store could not read", engine)
            }
            other => format!("the store could not read: {other}"),
        };
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
