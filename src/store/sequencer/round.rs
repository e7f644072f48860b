//! One round of the sequencer: loads what the round's appends need and memory does not
//! hold, decides each append in queue order (versions, offsets, expectations, msg ids,
//! quotas), routes the accepted messages and builds the round's one write batch.
//!
//! Must never: write to the engine itself (the writer task does), send an ack that waits
//! for durability, or decide appends of one subject out of queue order.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::record::{self, MsgIdEntry};
use crate::store::runs::{self, Seen};
use crate::store::sealed;
use crate::store::snapshot::CompactionJob;
use crate::store::writes::Writes;
use crate::store::{
    AckTo, AppendOutcome, AppendRequest, Durability, Expectation, NewMessage, Sequenced,
    StoreError, StoredLimits, StoredUsage, keys,
};

use super::open_run::OpenRun;
use super::tenant::{Head, TenantState, encode_usage, load_head, load_next_offset, load_usage};
use super::writer::RoundWrite;
use super::{Assigned, MessageKey, RoundIndex, SeededMap, Sequencer, UNWRITTEN_ROUNDS};

/// An ack and the outcome it carries, for the tenant it belongs to.
type Ack = (Arc<str>, AckTo, AppendOutcome);

/// The keys one round writes, gathered into its one write batch.
struct RoundBatch {
    batch: Writes,
    /// Per (tenant, subject): the run of this round's messages being built.
    runs: SeededMap<(Arc<str>, Arc<str>), OpenRun>,
    /// Sizes of the messages appended to version-limited subjects this round.
    sizes: HashMap<MessageKey, u64>,
}

impl RoundBatch {
    /// Puts a message under its own key on a version-limited subject, or on its
    /// subject's open run otherwise.
    fn put_message(&mut self, request: &AppendRequest, message: &NewMessage, head: Head, now: u64) {
        if request.max_versions > 0 {
            // The sequencer drops this subject's oldest version by key, in the same
            // write: one key per version.
            self.batch.put(
                keys::message(&request.tenant, &request.subject, head.version),
                record::encode_record(
                    head.offset,
                    now,
                    message.flags,
                    &message.headers,
                    &message.payload,
                ),
            );
            return;
        }
        let run = self
            .runs
            .entry((Arc::clone(&request.tenant), Arc::clone(&request.subject)))
            .or_insert_with(|| OpenRun::new(head.version, message.payload.len()));
        if !run.takes(head.version) {
            let full = std::mem::replace(run, OpenRun::new(head.version, message.payload.len()));
            full.write(&mut self.batch, &request.tenant, &request.subject);
        }
        run.builder.push(
            head.offset,
            now,
            message.flags,
            &message.headers,
            &message.payload,
        );
    }

    fn put_retained(
        &mut self,
        request: &AppendRequest,
        message: &NewMessage,
        cleared: bool,
        head: Head,
        now: u64,
    ) {
        // MQTT's rule: an empty retained publish clears the retained message; the
        // publish itself is still stored and delivered. (A sealed empty payload is
        // not empty: the flag says whether it was sealed.)
        let key = keys::retained(&request.tenant, &request.subject);
        if message.payload.is_empty() || cleared {
            self.batch.delete(key);
        } else {
            self.batch.put(
                key,
                record::encode_retained(
                    head.version,
                    head.offset,
                    now,
                    message.flags,
                    &message.headers,
                    &message.payload,
                ),
            );
        }
    }

    /// Deletes a version that the subject's version limit pushes out, and returns its
    /// size when `load` or this round knows it.
    fn drop_version(
        &mut self,
        request: &AppendRequest,
        dropped: u64,
        dropped_sizes: &mut HashMap<MessageKey, u64>,
        dropped_in_runs: &mut HashMap<MessageKey, Option<u64>>,
    ) -> Option<u64> {
        let key = (
            Arc::clone(&request.tenant),
            Arc::clone(&request.subject),
            dropped,
        );
        let delete = dropped_in_runs.remove(&key).unwrap_or(Some(dropped));
        if let Some(first) = delete {
            // A run read whole may have joined several rounds' runs while unflushed
            // (`store/unflushed.rs`), which a restart replays each under its own first
            // version: deleting the key of every version it holds deletes all of them.
            for version in first..=dropped {
                self.batch
                    .delete(keys::message(&request.tenant, &request.subject, version));
            }
        }
        dropped_sizes
            .remove(&key)
            .or_else(|| self.sizes.get(&key).copied())
    }
}

/// What one round decides, gathered as it goes through its appends in queue order.
struct RoundDraft {
    /// The round's number (`Sequencer::rounds` once it is finished).
    round: u64,
    now: u64,
    writes: RoundBatch,
    /// The accepted messages, for routing.
    assigned: Vec<Assigned>,
    /// Acks sent once the round's write is durable: appends that asked for it, and
    /// duplicates.
    durable_acks: Vec<Ack>,
    /// Acks that do not wait for durability: conflicts, refusals, `received` appends.
    immediate: Vec<Ack>,
    /// Per tenant: first offset and (subject, version, bytes) list of this round.
    index: SeededMap<Arc<str>, RoundIndex>,
    /// Tenants whose usage this round changes, each once.
    changed: Vec<Arc<str>>,
    /// How long the engine keeps a msg id key.
    msg_id_ttl_ms: u64,
    /// The data key the append being assigned is sealed with (`store/sealed.rs`).
    sealing: Option<Arc<crate::sealing::DataKey>>,
}

impl RoundDraft {
    fn new(round: u64, now: u64, window_ms: u64) -> RoundDraft {
        RoundDraft {
            round,
            now,
            writes: RoundBatch {
                batch: Writes::default(),
                runs: SeededMap::default(),
                sizes: HashMap::new(),
            },
            assigned: Vec::new(),
            durable_acks: Vec::new(),
            immediate: Vec::new(),
            index: SeededMap::default(),
            changed: Vec::new(),
            msg_id_ttl_ms: window_ms.max(1),
            sealing: None,
        }
    }

    /// Gives an accepted append's messages their versions and offsets and puts their
    /// keys, dropping the versions its subject's limit pushes out; returns the
    /// subject's new head.
    fn assign(
        &mut self,
        state: &mut TenantState,
        dropped_sizes: &mut HashMap<MessageKey, u64>,
        dropped_in_runs: &mut HashMap<MessageKey, Option<u64>>,
        position: usize,
        request: &AppendRequest,
        head: Head,
    ) -> Head {
        let next_offset = state.next_offset.get_or_insert(1);
        let entry = self
            .index
            .entry(Arc::clone(&request.tenant))
            .or_insert_with(|| (*next_offset, Vec::new()));
        let mut new_head = head;
        if request.max_versions == 0 {
            new_head.run_round = self.round;
        }
        for (i, message) in request.messages.iter().enumerate() {
            new_head.version += 1;
            new_head.offset = *next_offset;
            *next_offset += 1;
            let sealed = sealed::stored_form(
                self.sealing.as_deref(),
                &request.tenant,
                &request.subject,
                new_head.version,
                message,
            );
            let stored = sealed.as_ref().unwrap_or(message);
            self.writes.put_message(request, stored, new_head, self.now);
            if request.retain {
                self.writes.put_retained(
                    request,
                    stored,
                    message.payload.is_empty(),
                    new_head,
                    self.now,
                );
            }
            if request.max_versions > 0 && new_head.version > request.max_versions {
                let dropped = new_head.version - request.max_versions;
                let size =
                    self.writes
                        .drop_version(request, dropped, dropped_sizes, dropped_in_runs);
                if let Some(size) = size {
                    state.usage.bytes = state.usage.bytes.saturating_sub(size);
                }
            }
            let size = message.headers.len() + message.payload.len();
            if request.max_versions > 0 {
                self.writes.sizes.insert(
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
            self.assigned.push(Assigned {
                request: position,
                message: i,
                version: new_head.version,
                offset: new_head.offset,
            });
        }
        new_head
    }

    /// Records what an accepted append changes besides its messages: a new subject's
    /// marker and count, the subject's head, the msg id, and the append's ack.
    fn record_accepted(
        &mut self,
        state: &mut TenantState,
        request: &AppendRequest,
        head: Head,
        new_head: Head,
    ) {
        if head.version == 0 {
            self.writes.batch.put(
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
                time_ms: self.now,
            };
            self.writes.batch.put_expiring(
                keys::msg_id(&request.tenant, id),
                record::encode_msg_id(&seen),
                self.msg_id_ttl_ms,
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
            let ack = (Arc::clone(&request.tenant), ack.clone(), outcome);
            match request.durability {
                Durability::Durable => self.durable_acks.push(ack),
                Durability::Received => self.immediate.push(ack),
            }
        }
    }

    /// Puts the runs still open and each tenant's batch index for this round.
    fn close_runs_and_index(&mut self) {
        for ((tenant, subject), run) in self.writes.runs.drain() {
            run.write(&mut self.writes.batch, &tenant, &subject);
        }
        for (tenant, (first, messages)) in &self.index {
            self.writes.batch.put(
                keys::batch(tenant, *first),
                record::encode_batch(self.now, messages.iter().map(|(s, v, b)| (&**s, *v, *b))),
            );
        }
    }
}

/// The outcome of an append whose msg id the window still remembers.
fn duplicate_of(
    state: &mut TenantState,
    request: &AppendRequest,
    now: u64,
    window_ms: u64,
) -> Option<AppendOutcome> {
    let id = request.msg_id.as_ref()?;
    state.msg_ids.expire(now, window_ms);
    let seen = state.msg_ids.entries.get(id)?;
    Some(AppendOutcome::Duplicate {
        subject: Arc::from(seen.subject.as_str()),
        version: seen.version,
        offset: seen.offset,
    })
}

/// The conflict of an append whose expectation does not hold.
fn conflict_of(state: &TenantState, request: &AppendRequest, head: Head) -> Option<AppendOutcome> {
    let expected = request.expect?;
    // What the tenant's offsets reached so far, this round's earlier appends included:
    // they were decided before this one.
    let stream_last = state.next_offset.unwrap_or(1).saturating_sub(1);
    let (holds, current_offset) = match expected {
        Expectation::Version(v) => (v == head.version, head.offset),
        Expectation::LastOffset(o) => (o == head.offset, head.offset),
        Expectation::StreamOffset(o) => (o == stream_last, stream_last),
    };
    (!holds).then(|| AppendOutcome::Conflict {
        subject: Arc::clone(&request.subject),
        expected,
        current_version: head.version,
        current_offset,
    })
}

/// Why the tenant's stored limits refuse an append of `bytes` bytes, if they do.
fn over_limit(
    limits: StoredLimits,
    usage: StoredUsage,
    request: &AppendRequest,
    head: Head,
    bytes: u64,
) -> Option<String> {
    if head.version == 0 && limits.max_subjects.is_some_and(|max| usage.subjects >= max) {
        return Some(format!(
            "tenant {} is at its limit of {} subjects",
            request.tenant,
            limits.max_subjects.unwrap_or_default()
        ));
    }
    let over_bytes = limits.max_bytes.is_some_and(|max| {
        // An append nobody hears back from is refused only at the limit, as front
        // ends refuse it with an error there: crossing the limit by one append beats
        // losing it without a word.
        match request.ack {
            Some(_) => usage.bytes.saturating_add(bytes) > max,
            None => usage.bytes >= max,
        }
    });
    over_bytes.then(|| {
        format!(
            "tenant {} is at its limit of {} stored bytes",
            request.tenant,
            limits.max_bytes.unwrap_or_default()
        )
    })
}

/// The snapshot due when an append takes its subject past a multiple of `every`.
fn compaction_due(request: &AppendRequest, head: Head, new_head: Head) -> Option<CompactionJob> {
    let compaction = request.compaction.filter(|c| c.every > 0)?;
    (new_head.version / compaction.every > head.version / compaction.every).then(|| CompactionJob {
        tenant: Arc::clone(&request.tenant),
        subject: Arc::clone(&request.subject),
        version: new_head.version / compaction.every * compaction.every,
        compaction,
    })
}

fn report_read_failure(error: &StoreError) {
    // A fenced engine fails the reads before any write: said as loudly.
    match error {
        StoreError::Engine(engine) => super::writer::report_failure(
            engine,
            "store read failed; refusing this round of appends",
        ),
        other => {
            tracing::error!(error = %other, "store read failed; refusing this round of appends")
        }
    }
}

impl Sequencer {
    /// Decides and routes one round of appends, and prepares its write.
    pub(super) async fn round(&mut self, requests: &mut Vec<AppendRequest>) -> RoundWrite {
        self.forget_after_failed_write();
        if let Err(error) = self.load(requests).await {
            report_read_failure(&error);
            self.fail_all(requests, &error);
            return RoundWrite::default();
        }
        let mut draft = RoundDraft::new(self.rounds + 1, self.clock.now_ms(), self.window_ms);
        self.take_released(&mut draft.changed);
        for (position, request) in requests.iter().enumerate() {
            self.decide(&mut draft, position, request);
        }
        self.finish(draft, requests)
    }

    fn forget_after_failed_write(&mut self) {
        // A write failed since the last round: what memory holds may be ahead of the
        // store, so read heads and offsets again.
        let epoch = self.failures.load(Ordering::Acquire);
        if epoch != self.epoch_seen {
            self.tenants.clear();
            // Sizes of rounds that were never written, whose versions come again.
            self.recent_sizes.clear();
            self.epoch_seen = epoch;
        }
    }

    /// Takes the bytes deleted outside the sequencer off their tenants' usage.
    fn take_released(&mut self, changed: &mut Vec<Arc<str>>) {
        for (tenant, bytes) in self.released.drain() {
            if let Some(state) = self.tenants.get_mut(&tenant) {
                state.usage.bytes = state.usage.bytes.saturating_sub(bytes);
                if !std::mem::replace(&mut state.usage_changed, true) {
                    changed.push(tenant);
                }
            }
        }
    }

    /// Decides one append: a duplicate, a conflict, a refusal at the tenant's limits,
    /// or versions and offsets for its messages.
    fn decide(&mut self, draft: &mut RoundDraft, position: usize, request: &AppendRequest) {
        let state = self.tenants.entry(Arc::clone(&request.tenant)).or_default();
        if let Some(outcome) = duplicate_of(state, request, draft.now, self.window_ms) {
            if let Some(ack) = &request.ack {
                draft
                    .durable_acks
                    .push((Arc::clone(&request.tenant), ack.clone(), outcome));
            }
            return;
        }
        let head = state
            .heads
            .get(&*request.subject)
            .copied()
            .unwrap_or_default();
        if let Some(outcome) = conflict_of(state, request, head) {
            if let Some(ack) = &request.ack {
                draft
                    .immediate
                    .push((Arc::clone(&request.tenant), ack.clone(), outcome));
            }
            return;
        }
        if request.messages.is_empty() {
            return;
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
        if let Some(reason) = over_limit(limits, state.usage, request, head, bytes) {
            match &request.ack {
                Some(ack) => draft.immediate.push((
                    Arc::clone(&request.tenant),
                    ack.clone(),
                    AppendOutcome::QuotaExceeded { reason },
                )),
                None => tracing::debug!(%reason, "an append without an ack was refused"),
            }
            return;
        }
        state.usage.bytes += bytes;
        if !std::mem::replace(&mut state.usage_changed, true) {
            draft.changed.push(Arc::clone(&request.tenant));
        }
        draft.sealing =
            sealed::sealing_key_of(self.db.sealing(), &request.tenant, &request.subject);
        let new_head = draft.assign(
            state,
            &mut self.dropped_sizes,
            &mut self.dropped_in_runs,
            position,
            request,
            head,
        );
        if let Some(job) = compaction_due(request, head, new_head) {
            // Best effort: when the compactor is behind, the next multiple covers it.
            let _ = self.compactions.try_send(job);
        }
        draft.record_accepted(state, request, head, new_head);
    }

    /// Ends the round once every append is decided: keeps its sizes for later rounds'
    /// loads, puts the changed usages, routes the accepted messages and hands back
    /// the round's write.
    fn finish(&mut self, mut draft: RoundDraft, requests: &mut Vec<AppendRequest>) -> RoundWrite {
        self.dropped_sizes.clear();
        self.dropped_in_runs.clear();
        let written = self.written.load(Ordering::Acquire);
        while self.recent_sizes.len() >= UNWRITTEN_ROUNDS
            || self
                .recent_sizes
                .front()
                .is_some_and(|(round, _)| *round <= written)
        {
            self.recent_sizes.pop_front();
        }
        self.rounds += 1;
        let sizes = std::mem::take(&mut draft.writes.sizes);
        self.recent_sizes.push_back((self.rounds, sizes));
        let usage_written = self.put_usage(&mut draft.writes.batch, &draft.changed);
        draft.close_runs_and_index();
        // Live delivery first: it never waits for the store.
        self.route(&draft.assigned, requests, draft.now);
        requests.clear();
        RoundWrite {
            batch: (!draft.index.is_empty() || usage_written).then_some(draft.writes.batch),
            durable_acks: draft.durable_acks,
            immediate: draft.immediate,
            epoch: self.epoch_seen,
            durable_barriers: Vec::new(),
            number: self.rounds,
        }
    }

    /// Puts the usage of each tenant whose usage changed, and marks those now at or
    /// below their bytes limit; says whether any was put.
    fn put_usage(&mut self, batch: &mut Writes, changed: &[Arc<str>]) -> bool {
        let mut usage_written = false;
        for tenant in changed {
            if let Some(state) = self.tenants.get_mut(tenant) {
                state.usage_changed = false;
                batch.put(keys::tenant_usage(tenant), encode_usage(state.usage));
                usage_written = true;
            }
        }
        for tenant in changed {
            if let Some(state) = self.tenants.get(tenant) {
                self.mark_full(tenant, state.usage);
            }
        }
        usage_written
    }

    /// Hands the round's accepted messages to routing in one call.
    fn route(&self, assigned: &[Assigned], requests: &[AppendRequest], now: u64) {
        if assigned.is_empty() {
            return;
        }
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
                            let run_round = state
                                .heads
                                .get(&*request.subject)
                                .map_or(0, |h| h.run_round);
                            if run_round > written && self.db.journaled() {
                                wait_applied(&self.written, &self.durable_tx, run_round).await?;
                            }
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

/// Waits until round `round` is applied, so that reads show the runs it extended:
/// a decision that deletes a run's key must see the run as it will be written.
async fn wait_applied(
    written: &AtomicU64,
    applied: &tokio::sync::watch::Sender<u64>,
    round: u64,
) -> Result<(), StoreError> {
    let mut changes = applied.subscribe();
    let deadline = tokio::time::Instant::now() + APPLY_WAIT;
    while written.load(Ordering::Acquire) < round {
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(StoreError::Closed),
            // A refused round is never applied: its failure makes the sequencer
            // read every head again, and this round is refused meanwhile.
            Err(_) => {
                return Err(StoreError::Refused(
                    "an earlier round did not reach the store; retry".into(),
                ));
            }
        }
    }
    Ok(())
}

/// How long a round waits for an earlier one to be applied before it is refused.
const APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
