//! Reading key streams back: one message, a page of one subject's history, a page
//! of a pattern's history in global offset order, and a page of subject names.
//!
//! Every read sees durable data only, so a reader never sees a message that a crash
//! could take back. Every read is paged: at most `max` messages and about
//! `max_bytes` per call, with a cursor to continue, so no caller holds a whole
//! stream in memory. Reads never write.

use bytes::Bytes;
use canopy_subjects::{Pattern, PatternToken, Subject};
use slatedb::IterationOrder;

use super::record::{self, Record};
use super::runs::{self, Seen};
use super::{Store, StoreError, keys};

/// Keys a listing's backward scan for its subjects' heads reads per subject at most.
const HEAD_KEYS_PER_SUBJECT: usize = 4;

/// Most messages one page of stored history holds, on every read path: the native
/// API's get/replay, `/ws` replay and catch-up, MQTT backlogs, table writers (the `/ws`
/// codec's `MAX_PAGE` is the same number).
pub const PAGE_MESSAGES: usize = 1000;
/// About the most bytes one page of stored history holds, on every read path.
pub const PAGE_BYTES: usize = 4 * 1024 * 1024;

/// One stored message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub subject: String,
    pub version: u64,
    pub offset: u64,
    pub time_ms: u64,
    /// What the front end recorded with the publish (MQTT QoS and retain).
    pub flags: u8,
    pub headers: Bytes,
    pub payload: Bytes,
}

/// One page of retained messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetainedPage {
    pub messages: Vec<StoredMessage>,
    /// Continue after this subject, when there may be more.
    pub next: Option<String>,
}

/// Where a replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayFrom {
    Start,
    /// A subject version (subject replays) — for a pattern, the same as `Start`.
    Version(u64),
    /// A tenant offset: the first message at or after it.
    Offset(u64),
    /// Milliseconds since the epoch: the first message stored at or after it.
    Time(u64),
}

/// One page of a replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayPage {
    pub messages: Vec<StoredMessage>,
    /// Where the next page starts: a version for a subject replay, an offset for a
    /// pattern replay.
    pub next: u64,
    /// Nothing durable is left after this page (for now).
    pub caught_up: bool,
}

/// A subject and its head, for listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectHead {
    pub subject: String,
    pub version: u64,
    pub offset: u64,
    pub time_ms: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubjectsPage {
    pub subjects: Vec<SubjectHead>,
    /// Continue after this subject, when there may be more.
    pub next: Option<String>,
}

/// The messages of `run` from `version` on.
fn messages_from(run: runs::Run, subject: &str, version: u64) -> Vec<StoredMessage> {
    let first = run.first;
    let skip = usize::try_from(version.saturating_sub(first)).unwrap_or(usize::MAX);
    run.records
        .into_iter()
        .enumerate()
        .skip(skip)
        .map(|(i, record)| stored(subject, first + i as u64, record))
        .collect()
}

pub(super) fn stored(subject: &str, version: u64, record: Record) -> StoredMessage {
    StoredMessage {
        subject: subject.to_owned(),
        version,
        offset: record.offset,
        time_ms: record.time_ms,
        flags: record.flags,
        headers: record.headers,
        payload: record.payload,
    }
}

impl Store {
    /// One message of a subject: a given version, or the latest.
    pub async fn get(
        &self,
        tenant: &str,
        subject: &str,
        version: Option<u64>,
    ) -> Result<Option<StoredMessage>, StoreError> {
        let found = match version {
            Some(version) => runs::at(self.db(), tenant, subject, version, Seen::Durable)
                .await?
                .map(|r| (version, r)),
            None => runs::newest(self.db(), tenant, subject, Seen::Durable).await?,
        };
        Ok(found.map(|(version, r)| stored(subject, version, r)))
    }

    /// `version` of `subject` and the versions after it stored in the same run (one
    /// round's messages of the subject, at most about 64 KiB), in version order: what a
    /// reader about to want the next versions too gets for the price of one read.
    /// Empty when `version` is not stored.
    pub async fn get_run_from(
        &self,
        tenant: &str,
        subject: &str,
        version: u64,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let Some(run) =
            runs::run_holding(self.db(), tenant, subject, version, Seen::Durable).await?
        else {
            return Ok(Vec::new());
        };
        Ok(messages_from(run, subject, version))
    }

    /// For each of `wanted` (subject and version pairs, sorted by subject and then
    /// version), what [`Store::get_run_from`] gives, read in one forward scan of the
    /// keys between them that stops after `max_keys` keys. `None` is a pair the scan
    /// did not find, to be read on its own; the scan cannot tell it from a pair that is
    /// not stored.
    pub async fn get_runs_from(
        &self,
        tenant: &str,
        wanted: &[(&str, u64)],
        max_keys: usize,
    ) -> Result<Vec<Option<Vec<StoredMessage>>>, StoreError> {
        let runs = runs::runs_holding(self.db(), tenant, wanted, max_keys, Seen::Durable).await?;
        Ok(runs
            .into_iter()
            .zip(wanted)
            .map(|(run, &(subject, version))| Some(messages_from(run?, subject, version)))
            .collect())
    }

    /// A page of one subject's history: only that subject's key range is read.
    pub async fn replay_subject(
        &self,
        tenant: &str,
        subject: &str,
        from: ReplayFrom,
        max: usize,
        max_bytes: usize,
    ) -> Result<ReplayPage, StoreError> {
        let start = match from {
            ReplayFrom::Start => 1,
            ReplayFrom::Version(v) => v.max(1),
            // An offset or a time is found by walking the subject from its start.
            ReplayFrom::Offset(_) | ReplayFrom::Time(_) => 1,
        };
        let mut iter = runs::Scan::open(self.db(), tenant, subject, start, Seen::Durable).await?;
        let mut page = ReplayPage {
            next: start,
            ..ReplayPage::default()
        };
        let mut bytes = 0usize;
        loop {
            if page.messages.len() >= max.max(1) || bytes >= max_bytes {
                return Ok(page);
            }
            let Some((version, record)) = iter.next().await? else {
                page.caught_up = true;
                return Ok(page);
            };
            page.next = version + 1;
            let wanted = match from {
                ReplayFrom::Offset(o) => record.offset >= o,
                ReplayFrom::Time(t) => record.time_ms >= t,
                _ => true,
            };
            if wanted {
                bytes += record.payload.len() + record.headers.len();
                page.messages.push(stored(subject, version, record));
            }
        }
    }

    /// A page of every subject matching `pattern`, in tenant offset order, read through
    /// the per-batch index (one key per group commit) and point reads.
    pub async fn replay_pattern(
        &self,
        tenant: &str,
        pattern: &Pattern,
        from: ReplayFrom,
        max: usize,
        max_bytes: usize,
    ) -> Result<ReplayPage, StoreError> {
        let matches =
            |subject: &str| Subject::parse_native(subject).is_ok_and(|s| pattern.matches(&s));
        self.replay_matching(tenant, &matches, from, max, max_bytes)
            .await
    }

    /// [`Store::replay_pattern`] for any set of subjects: `matches` says which. A
    /// session's cursor reads its backlog this way, all its filters in one walk.
    pub async fn replay_matching(
        &self,
        tenant: &str,
        matches: &(dyn Fn(&str) -> bool + Sync),
        from: ReplayFrom,
        max: usize,
        max_bytes: usize,
    ) -> Result<ReplayPage, StoreError> {
        let from_offset = match from {
            ReplayFrom::Offset(o) => o.max(1),
            _ => 1,
        };
        let from_time = match from {
            ReplayFrom::Time(t) => t,
            _ => 0,
        };
        let mut batches = self.batches_from(tenant, from_offset).await?;
        let mut recent = runs::RecentRuns::default();
        let mut page = ReplayPage {
            next: from_offset,
            ..ReplayPage::default()
        };
        let mut bytes = 0usize;
        while let Some(kv) = batches.next().await? {
            let first = keys::batch_offset(&kv.key).unwrap_or(0);
            let Some(batch) = record::decode_batch(kv.value) else {
                continue;
            };
            if batch.time_ms < from_time {
                page.next = first + batch.messages.len() as u64;
                continue;
            }
            for (i, (subject, version, _)) in batch.messages.iter().enumerate() {
                let offset = first + i as u64;
                if offset < from_offset {
                    continue;
                }
                if page.messages.len() >= max.max(1) || bytes >= max_bytes {
                    return Ok(page);
                }
                page.next = offset + 1;
                if !matches(subject) {
                    continue;
                }
                let record = recent
                    .at(self.db(), tenant, subject, *version, Seen::Durable)
                    .await?;
                if let Some(record) = record {
                    bytes += record.payload.len() + record.headers.len();
                    page.messages.push(stored(subject, *version, record));
                }
            }
        }
        page.caught_up = true;
        Ok(page)
    }

    /// Where a backlog read from `from_offset` should start so that it holds at most
    /// `max_messages` matching messages and `max_bytes`, none stored before
    /// `min_time_ms`: the newest ones are kept. Reads only the batch index. Returns
    /// the start offset and how many matching messages it skips.
    pub async fn backlog_start(
        &self,
        tenant: &str,
        matches: &(dyn Fn(&str) -> bool + Sync),
        from_offset: u64,
        min_time_ms: u64,
        max_messages: usize,
        max_bytes: usize,
    ) -> Result<(u64, u64), StoreError> {
        let mut batches = self.batches_from(tenant, from_offset.max(1)).await?;
        // (offset, bytes) of the matching messages kept so far, oldest first.
        let mut kept: std::collections::VecDeque<(u64, usize)> = std::collections::VecDeque::new();
        let (mut kept_bytes, mut skipped) = (0usize, 0u64);
        let mut end = from_offset.max(1);
        while let Some(kv) = batches.next().await? {
            let first = keys::batch_offset(&kv.key).unwrap_or(0);
            let Some(batch) = record::decode_batch(kv.value) else {
                continue;
            };
            for (i, (subject, _, size)) in batch.messages.iter().enumerate() {
                let offset = first + i as u64;
                if offset < from_offset {
                    continue;
                }
                end = offset + 1;
                // Deleted entries keep their place with size u32::MAX.
                if *size == u32::MAX || !matches(subject) {
                    continue;
                }
                if batch.time_ms < min_time_ms {
                    skipped += 1;
                    continue;
                }
                let size = usize::try_from(*size).unwrap_or(usize::MAX);
                kept.push_back((offset, size));
                kept_bytes = kept_bytes.saturating_add(size);
                while kept.len() > max_messages || (kept_bytes > max_bytes && kept.len() > 1) {
                    if let Some((_, dropped)) = kept.pop_front() {
                        kept_bytes -= dropped;
                        skipped += 1;
                    }
                }
            }
        }
        let start = if skipped == 0 {
            from_offset.max(1)
        } else {
            kept.front().map_or(end, |(offset, _)| *offset)
        };
        Ok((start, skipped))
    }

    /// The batch index of `tenant` from the batch holding `from_offset` on.
    async fn batches_from(
        &self,
        tenant: &str,
        from_offset: u64,
    ) -> Result<super::Scanned, StoreError> {
        // The batch holding `from_offset` starts at or before it.
        let first_batch = {
            let options = self
                .db()
                .durable_scan()
                .with_order(IterationOrder::Descending);
            let mut before = self
                .db()
                .scan_with_options(
                    keys::batch(tenant, 0)..keys::batch(tenant, from_offset.saturating_add(1)),
                    &options,
                )
                .await?;
            match before.next().await? {
                Some(kv) => keys::batch_offset(&kv.key).unwrap_or(0),
                None => 0,
            }
        };
        Ok(self
            .db()
            .scan_with_options(
                keys::batch_range(tenant, first_batch),
                &self.db().durable_scan(),
            )
            .await?)
    }

    /// A page of the subjects matching `pattern` with their heads, in subject order,
    /// after `after`. Only the range of the pattern's literal prefix is read.
    pub async fn subjects(
        &self,
        tenant: &str,
        pattern: &Pattern,
        after: Option<&str>,
        max: usize,
    ) -> Result<SubjectsPage, StoreError> {
        let (heads, next) = self.subject_heads(tenant, pattern, after, max).await?;
        Ok(SubjectsPage {
            subjects: heads
                .into_iter()
                .map(|head| SubjectHead {
                    subject: head.subject,
                    version: head.version,
                    offset: head.offset,
                    time_ms: head.time_ms,
                })
                .collect(),
            next,
        })
    }

    /// [`Store::subjects`] with each subject's newest message whole, as the listing
    /// reads it anyway: a consumer group's walk keeps the ones it owes, so a subject
    /// of one message is not read again to deliver it. Continue after the second
    /// value, when there may be more.
    pub async fn subject_heads(
        &self,
        tenant: &str,
        pattern: &Pattern,
        after: Option<&str>,
        max: usize,
    ) -> Result<(Vec<StoredMessage>, Option<String>), StoreError> {
        let prefix = literal_prefix(pattern);
        let mut markers = self
            .db()
            .scan_with_options(
                keys::subject_marker_range(tenant, &prefix, after),
                &self.db().durable_scan(),
            )
            .await?;
        let mut names = Vec::new();
        let mut more = false;
        while let Some(kv) = markers.next().await? {
            let Some(name) = keys::marker_subject(tenant, &kv.key) else {
                continue;
            };
            if !Subject::parse_native(name).is_ok_and(|s| pattern.matches(&s)) {
                continue;
            }
            if names.len() >= max.max(1) {
                more = true;
                break;
            }
            names.push(name.to_owned());
        }
        // The heads in one backward scan over the page's keys (a few per subject at
        // most); what it does not reach is read a subject at a time.
        let sorted: Vec<&str> = names.iter().map(String::as_str).collect();
        let max_keys = sorted.len() * HEAD_KEYS_PER_SUBJECT + 64;
        let newest = runs::newest_of(self.db(), tenant, &sorted, max_keys, Seen::Durable).await?;
        let mut heads = Vec::with_capacity(sorted.len());
        for (name, found) in sorted.iter().zip(newest) {
            let head = match found {
                Some((version, record)) => Some(stored(name, version, record)),
                None => self.get(tenant, name, None).await?,
            };
            heads.extend(head);
        }
        let next = if more { names.last().cloned() } else { None };
        Ok((heads, next))
    }
}

impl Store {
    /// Hands `each` the newest message of every subject `pattern` matches, in subject
    /// order, [`Store::subject_heads`] a page of `page` subjects at a time, at most
    /// `max_pages` pages. False when it stopped there with subjects left.
    pub async fn each_head<E: From<StoreError>>(
        &self,
        tenant: &str,
        pattern: &Pattern,
        (page, max_pages): (usize, usize),
        each: &mut (dyn FnMut(StoredMessage) -> Result<(), E> + Send),
    ) -> Result<bool, E> {
        let mut after: Option<String> = None;
        for _ in 0..max_pages {
            let (heads, next) = self
                .subject_heads(tenant, pattern, after.as_deref(), page)
                .await?;
            for head in heads {
                each(head)?;
            }
            match next {
                Some(next) => after = Some(next),
                None => return Ok(true),
            }
        }
        Ok(false)
    }

    /// The offset the tenant's next message will get (as far as the store knows
    /// it: a message being sequenced right now may take it).
    pub async fn next_offset(&self, tenant: &str) -> Result<u64, StoreError> {
        super::sequencer::load_next_offset(self.db(), tenant).await
    }

    /// How many subjects the tenant has (a subject counts from its first message on;
    /// purging its messages does not remove it).
    pub async fn subject_count(&self, tenant: &str) -> Result<u64, StoreError> {
        Ok(self.usage(tenant).await?.subjects)
    }

    /// What the tenant keeps in the store, as of the last sequenced round.
    pub async fn usage(&self, tenant: &str) -> Result<super::StoredUsage, StoreError> {
        super::sequencer::load_usage(self.db(), tenant).await
    }

    /// A front end's saved session state for `client_id`, if any.
    pub async fn session(
        &self,
        tenant: &str,
        client_id: &str,
    ) -> Result<Option<Bytes>, StoreError> {
        let Some(stored) = self.db().get(keys::session(tenant, client_id)).await? else {
            return Ok(None);
        };
        let keys = self.db().sealing().keys_of(tenant);
        Ok(super::sealed::open_session(
            keys.as_deref(),
            tenant,
            client_id,
            stored,
        ))
    }

    /// Saves (or with `None` removes) a session's state, durably.
    pub async fn save_session(
        &self,
        tenant: &str,
        client_id: &str,
        state: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let mut batch = slatedb::WriteBatch::new();
        let keys = self.db().sealing().keys_of(tenant);
        match state {
            Some(state) => {
                match super::sealed::seal_session(keys.as_deref(), tenant, client_id, state) {
                    Some(sealed) => batch.put(keys::session(tenant, client_id), sealed),
                    None => batch.put(keys::session(tenant, client_id), state),
                }
            }
            None => batch.delete(keys::session(tenant, client_id)),
        }
        super::write_durably(self.db(), batch).await
    }
}

/// The literal tokens a pattern starts with, joined and followed by `.` when a
/// wildcard follows (`a.b.*` -> `a.b.`; `a.b` -> `a.b`; `>` -> empty).
fn literal_prefix(pattern: &Pattern) -> String {
    let mut prefix = String::new();
    for token in pattern.tokens() {
        match token {
            PatternToken::Literal(lit) => {
                if !prefix.is_empty() {
                    prefix.push('.');
                }
                prefix.push_str(lit);
            }
            PatternToken::ZeroOrMore => return prefix,
            _ => {
                if !prefix.is_empty() {
                    prefix.push('.');
                }
                return prefix;
            }
        }
    }
    prefix
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_prefixes() {
        let p = |s: &str| literal_prefix(&Pattern::parse_native(s).expect("pattern"));
        assert_eq!(p("a.b.*"), "a.b.");
        assert_eq!(p("a.b"), "a.b");
        assert_eq!(p(">"), "");
        assert_eq!(p("a.>"), "a.");
        assert_eq!(
            literal_prefix(&Pattern::parse_mqtt("a/#").expect("filter")),
            "a"
        );
    }
}
