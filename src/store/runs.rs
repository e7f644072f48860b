//! A subject's messages as runs: the one place that knows a message key may hold
//! several consecutive versions.
//!
//! The sequencer writes each subject's messages of one round as one run, keyed by its
//! first version (`record::RunBuilder`), so a subject published to a thousand times a
//! round costs the engine one key, not a thousand. Everything that reads or deletes a
//! subject's messages comes through here: the newest message, one version, a scan
//! from a version, and deleting a prefix of versions (the only deletion there is:
//! purge, retention, snapshots and version limits all drop the oldest first).
//!
//! Must never: write a run's versions anywhere but under its first version, or leave
//! a version readable under two keys.

use bytes::Bytes;
use slatedb::config::{ReadOptions, ScanOptions};

use super::Scanned;
use slatedb::{IterationOrder, WriteBatch};

use super::record::{self, Record};
use super::{StoreError, keys, sealed};
use crate::sealing::TenantKeys;
use crate::store::Engine;

/// A run holds at most this many messages...
pub(super) const RUN_MAX_MESSAGES: u32 = 1024;
/// ...and about this many bytes, so reading one version never reads much more.
pub(super) const RUN_MAX_BYTES: usize = 64 * 1024;

/// What a read may see: only what is durable, also what is in the engine's memory
/// (the sequencer, which wrote it), or only what the engine itself holds durably
/// (deletions outside the sequencer, `Engine::scan_flushed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    Durable,
    Written,
    Flushed,
}

impl Seen {
    fn options(self, db: &Engine) -> ScanOptions {
        match self {
            Seen::Durable | Seen::Flushed => db.durable_scan(),
            Seen::Written => ScanOptions::default(),
        }
    }

    async fn scan(
        self,
        db: &Engine,
        range: std::ops::Range<Bytes>,
        order: IterationOrder,
    ) -> Result<Scanned, StoreError> {
        let options = self.options(db).with_order(order);
        Ok(match self {
            Seen::Flushed => db.scan_flushed(range, &options).await?,
            Seen::Durable | Seen::Written => db.scan_with_options(range, &options).await?,
        })
    }

    async fn get(self, db: &Engine, key: &Bytes) -> Result<Option<Bytes>, StoreError> {
        Ok(match self {
            Seen::Durable => db.get_with_options(key, &db.durable_read()).await?,
            Seen::Written => db.get_with_options(key, &ReadOptions::default()).await?,
            Seen::Flushed => db.get_flushed(key, &db.durable_read()).await?,
        })
    }
}

/// One stored run: its first version and its records in version order.
#[derive(Debug, Clone)]
pub(super) struct Run {
    pub first: u64,
    pub records: Vec<Record>,
}

impl Run {
    fn decode(key: &[u8], value: Bytes) -> Option<Run> {
        let first = keys::message_version(key)?;
        Some(Run {
            first,
            records: record::decode_run(value)?,
        })
    }

    /// [`Run::decode`] for a reader: sealed records opened with the tenant's `keys`
    /// (`sealed.rs`). Deletions and rewrites use `decode`, which leaves them sealed.
    fn read(keys: Option<&TenantKeys>, key: &[u8], value: Bytes) -> Option<Run> {
        let mut run = Run::decode(key, value)?;
        if run.records.iter().any(|r| r.flags & record::SEALED != 0) {
            let tenant_and_subject = key.get(1..key.len().checked_sub(8)?)?;
            for (version, record) in (run.first..).zip(run.records.iter_mut()) {
                sealed::open(keys, &sealed::context(tenant_and_subject, version), record);
            }
        }
        Some(run)
    }

    /// The version after the run's last.
    pub fn end(&self) -> u64 {
        self.first + self.records.len() as u64
    }

    pub fn get(&self, version: u64) -> Option<&Record> {
        let index = usize::try_from(version.checked_sub(self.first)?).ok()?;
        self.records.get(index)
    }

    /// The bytes the sequencer counted for the run's messages (as published).
    fn bytes(&self) -> u64 {
        self.records.iter().map(published_bytes).sum()
    }
}

/// The header and payload bytes a record had when published, sealed or not.
fn published_bytes(record: &Record) -> u64 {
    let stored = (record.headers.len() + record.payload.len()) as u64;
    match record.flags & record::SEALED {
        0 => stored,
        _ => stored.saturating_sub(crate::sealing::OVERHEAD as u64),
    }
}

/// The run with the highest first version below `below` (none below: `None`).
async fn run_before(
    db: &Engine,
    tenant: &str,
    subject: &str,
    below: u64,
    seen: Seen,
) -> Result<Option<Run>, StoreError> {
    // The engine refuses an empty range (it panics): nothing is below version 1.
    if below <= 1 {
        return Ok(None);
    }
    let range = keys::message(tenant, subject, 1)..keys::message(tenant, subject, below);
    let mut iter = seen.scan(db, range, IterationOrder::Descending).await?;
    let keys = db.sealing().keys_of(tenant);
    Ok(iter
        .next()
        .await?
        .and_then(|kv| Run::read(keys.as_deref(), &kv.key, kv.value)))
}

/// The subject's newest message and its version.
pub(super) async fn newest(
    db: &Engine,
    tenant: &str,
    subject: &str,
    seen: Seen,
) -> Result<Option<(u64, Record)>, StoreError> {
    let Some(mut run) = run_before(db, tenant, subject, u64::MAX, seen).await? else {
        return Ok(None);
    };
    let version = run.end() - 1;
    Ok(run.records.pop().map(|r| (version, r)))
}

/// The newest message of each of `subjects` (sorted by their bytes) and its version,
/// found by one backward scan of the keys from the last subject's newest to the first
/// subject's oldest instead of a seek each: a page of a listing's subjects lies close
/// together. The scan stops after `max_keys` keys; a subject it did not reach is
/// `None`, for the caller to read on its own.
pub(super) async fn newest_of(
    db: &Engine,
    tenant: &str,
    subjects: &[&str],
    max_keys: usize,
    seen: Seen,
) -> Result<Vec<Option<(u64, Record)>>, StoreError> {
    let mut found: Vec<Option<(u64, Record)>> = subjects.iter().map(|_| None).collect();
    let (Some(first), Some(last)) = (subjects.first(), subjects.last()) else {
        return Ok(found);
    };
    let range = keys::message(tenant, first, 1)..keys::message_range(tenant, last, 0).end;
    let mut iter = seen.scan(db, range, IterationOrder::Descending).await?;
    let keys = db.sealing().keys_of(tenant);
    for _ in 0..max_keys {
        let Some(kv) = iter.next().await? else {
            break;
        };
        let Some((subject, _)) = keys::message_parts(tenant, &kv.key) else {
            continue;
        };
        // The first key of a subject seen going backward is its newest run.
        let Ok(i) = subjects.binary_search_by(|s| s.as_bytes().cmp(subject.as_bytes())) else {
            continue;
        };
        if found[i].is_some() {
            continue;
        }
        if let Some(mut run) = Run::read(keys.as_deref(), &kv.key, kv.value) {
            let version = run.end() - 1;
            found[i] = run.records.pop().map(|record| (version, record));
        }
    }
    Ok(found)
}

/// The run holding `version`, if that version is stored.
pub(super) async fn run_holding(
    db: &Engine,
    tenant: &str,
    subject: &str,
    version: u64,
    seen: Seen,
) -> Result<Option<Run>, StoreError> {
    // A version that starts a run (every message of a subject published once a
    // round) is one point read, which bloom filters answer.
    let key = keys::message(tenant, subject, version);
    if let Some(value) = seen.get(db, &key).await? {
        let keys = db.sealing().keys_of(tenant);
        return Ok(Run::read(keys.as_deref(), &key, value));
    }
    let run = run_before(db, tenant, subject, version, seen).await?;
    Ok(run.filter(|r| r.get(version).is_some()))
}

/// One version of a subject.
pub(super) async fn at(
    db: &Engine,
    tenant: &str,
    subject: &str,
    version: u64,
    seen: Seen,
) -> Result<Option<Record>, StoreError> {
    let run = run_holding(db, tenant, subject, version, seen).await?;
    Ok(run.and_then(|r| r.get(version).cloned()))
}

/// The runs holding each of `wanted` (subject and version pairs in key order: by
/// subject bytes, then version), found by one forward scan of the keys between the
/// first and the last instead of a read each: the runs of subjects that sort close
/// together lie close together. The scan stops after `max_keys` keys; a pair it did
/// not find (its run starts before the pair's subject was reached, the scan stopped,
/// or it is not stored) is `None`, for the caller to read on its own.
pub(super) async fn runs_holding(
    db: &Engine,
    tenant: &str,
    wanted: &[(&str, u64)],
    max_keys: usize,
    seen: Seen,
) -> Result<Vec<Option<Run>>, StoreError> {
    let mut found: Vec<Option<Run>> = wanted.iter().map(|_| None).collect();
    let (Some(&(first, from)), Some(&(last, _))) = (wanted.first(), wanted.last()) else {
        return Ok(found);
    };
    let start = keys::message(tenant, first, from);
    let end = keys::message_range(tenant, last, 0).end;
    let mut iter = seen.scan(db, start..end, IterationOrder::Ascending).await?;
    let keys = db.sealing().keys_of(tenant);
    let mut i = 0;
    for _ in 0..max_keys {
        let Some(kv) = iter.next().await? else {
            break;
        };
        let Some((subject, run_first)) = keys::message_parts(tenant, &kv.key) else {
            continue;
        };
        // Pairs of subjects the scan has passed were not found here.
        while i < wanted.len() && wanted[i].0.as_bytes() < subject.as_bytes() {
            i += 1;
        }
        // A pair whose run starts before this key's is before the scan's reach.
        while i < wanted.len() && wanted[i].0 == subject && wanted[i].1 < run_first {
            i += 1;
        }
        if i == wanted.len() {
            break;
        }
        if wanted[i].0 != subject {
            continue;
        }
        let Some(run) = Run::read(keys.as_deref(), &kv.key, kv.value) else {
            continue;
        };
        let end = run.end();
        let mut j = i;
        while j < wanted.len() && wanted[j].0 == subject && wanted[j].1 < end {
            j += 1;
        }
        if j > i {
            for slot in &mut found[i + 1..j] {
                *slot = Some(run.clone());
            }
            found[i] = Some(run);
            i = j;
        }
    }
    Ok(found)
}

/// A subject's messages from a version on, in version order.
pub(super) struct Scan {
    iter: super::Scanned,
    from: u64,
    run: std::vec::IntoIter<Record>,
    next_version: u64,
    /// The tenant's data keys when the scan opened.
    keys: Option<std::sync::Arc<TenantKeys>>,
}

impl Scan {
    pub async fn open(
        db: &Engine,
        tenant: &str,
        subject: &str,
        from: u64,
        seen: Seen,
    ) -> Result<Scan, StoreError> {
        let from = from.max(1);
        // The run holding `from` may start before it.
        let start = match run_before(db, tenant, subject, from, seen).await? {
            Some(run) if run.end() > from => run.first,
            _ => from,
        };
        let range = keys::message_range(tenant, subject, start);
        let iter = seen.scan(db, range, IterationOrder::Ascending).await?;
        Ok(Scan {
            iter,
            from,
            run: Vec::new().into_iter(),
            next_version: start,
            keys: db.sealing().keys_of(tenant),
        })
    }

    /// The next message and its version; `None` at the end of what is stored.
    pub async fn next(&mut self) -> Result<Option<(u64, Record)>, StoreError> {
        loop {
            if let Some(record) = self.run.next() {
                let version = self.next_version;
                self.next_version += 1;
                if version >= self.from {
                    return Ok(Some((version, record)));
                }
                continue;
            }
            let Some(kv) = self.iter.next().await? else {
                return Ok(None);
            };
            // A value that does not decode is skipped, as reads skip what they
            // cannot trust.
            if let Some(run) = Run::read(self.keys.as_deref(), &kv.key, kv.value) {
                self.next_version = run.first;
                self.run = run.records.into_iter();
            }
        }
    }
}

/// The last runs read for one page of a pattern replay, one per subject, so a page
/// that reads a run's versions one by one reads the run once.
#[derive(Default)]
pub(super) struct RecentRuns {
    runs: std::collections::HashMap<String, Run>,
}

/// Subjects whose last run a page keeps.
const RECENT_RUNS: usize = 256;

impl RecentRuns {
    pub async fn at(
        &mut self,
        db: &Engine,
        tenant: &str,
        subject: &str,
        version: u64,
        seen: Seen,
    ) -> Result<Option<Record>, StoreError> {
        if let Some(record) = self.runs.get(subject).and_then(|run| run.get(version)) {
            return Ok(Some(record.clone()));
        }
        let Some(run) = run_holding(db, tenant, subject, version, seen).await? else {
            return Ok(None);
        };
        let record = run.get(version).cloned();
        if run.records.len() > 1 {
            if self.runs.len() >= RECENT_RUNS {
                self.runs.clear();
            }
            self.runs.insert(subject.to_owned(), run);
        }
        Ok(record)
    }
}

/// What deleting a prefix of a subject removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Deleted {
    pub messages: u64,
    /// Header and payload bytes of the messages removed.
    pub bytes: u64,
    /// Every version up to the limit is gone; otherwise call again after writing.
    pub done: bool,
}

/// Adds to `batch` the deletion of every version of `subject` up to `last` that the
/// engine holds (its caller flushed the unflushed rounds first), reading at most
/// `max_keys` keys: runs wholly below go, and a run reaching past `last` is
/// written again from `last + 1`. The caller writes the batch; while `done` is
/// false, it calls again afterwards. Callers deleting the same subject at once must
/// not overlap (the store's deletion lock), or a rewritten run could bring back
/// versions another deletion removed.
pub(super) async fn delete_through(
    db: &Engine,
    tenant: &str,
    subject: &str,
    last: u64,
    max_keys: usize,
    batch: &mut WriteBatch,
) -> Result<Deleted, StoreError> {
    let mut deleted = Deleted::default();
    if last == 0 {
        deleted.done = true;
        return Ok(deleted);
    }
    let end = keys::message(tenant, subject, last.saturating_add(1));
    let range = keys::message(tenant, subject, 1)..end;
    let mut iter = Seen::Flushed
        .scan(db, range, IterationOrder::Ascending)
        .await?;
    for _ in 0..max_keys.max(1) {
        let Some(kv) = iter.next().await? else {
            deleted.done = true;
            return Ok(deleted);
        };
        batch.delete(&kv.key);
        let Some(run) = Run::decode(&kv.key, kv.value) else {
            continue;
        };
        if run.end() <= last.saturating_add(1) {
            deleted.messages += run.records.len() as u64;
            deleted.bytes += run.bytes();
            continue;
        }
        let keep = usize::try_from(last + 1 - run.first).unwrap_or(usize::MAX);
        let mut rest = record::RunBuilder::new(0);
        for (i, r) in run.records.iter().enumerate() {
            if i < keep {
                deleted.messages += 1;
                deleted.bytes += published_bytes(r);
            } else {
                rest.push(r.offset, r.time_ms, r.flags, &r.headers, &r.payload);
            }
        }
        batch.put(keys::message(tenant, subject, last + 1), rest.finish());
    }
    deleted.done = iter.next().await?.is_none();
    Ok(deleted)
}
