//! The rounds the journal holds and the engine does not yet: kept in memory, shown
//! to every read of the engine (`Engine::scan_with_options`, `Engine::get`), and
//! written to the engine together once they grow large or old.
//!
//! Why: the engine's cost is per key (memtable inserts, log and table entries,
//! compaction merges). A round writes one run key per subject it touched, so with
//! many subjects nearly every message was its own key. Held here across many rounds,
//! a subject's runs join (a later round's run extends the one before while neither
//! is in the engine), so the engine takes one key per subject per flush instead of
//! one per subject per round; a round costs the publish path a journal append and a
//! few map inserts. The journal is what makes this safe: what is here is acknowledged
//! and on disk, and a restart replays the rounds the engine does not hold (every
//! flush also writes `xjournal`, the last round it holds).
//!
//! Must never: let a flush write a round without every round before it (its
//! `xjournal` says all up to it are held), show a reader an engine that holds rounds
//! its look at this layer did not (a flush started between the two looks makes the
//! read look again), or extend a run in a round that also deletes one of its
//! subject's keys (the delete was decided on the runs as they were).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use slatedb::config::{PutOptions, Ttl, WriteOptions};
use slatedb::{Db, WriteBatch, WriteHandle};
use tokio::sync::watch;

use super::journaled::ROUND_KEY;
use super::keys;
use super::record;
use super::runs::{RUN_MAX_BYTES, RUN_MAX_MESSAGES};
use super::writes::{Write, Writes};

/// What this layer says of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Look {
    Put(Bytes),
    Deleted,
    /// Not here: the engine's value stands.
    Absent,
}

/// A run that later rounds may extend: the values as the rounds wrote them, joined
/// when read or flushed.
#[derive(Debug, Clone)]
struct Run {
    parts: Vec<Bytes>,
    count: u32,
    bytes: usize,
    joined: Option<Bytes>,
}

impl Run {
    fn value(&mut self) -> Bytes {
        match self.parts.as_slice() {
            [only] => only.clone(),
            parts => {
                let count = self.count;
                self.joined
                    .get_or_insert_with(|| record::join_runs(parts, count))
                    .clone()
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Value {
    Put(Bytes),
    Expiring { value: Bytes, expires: Instant },
    Run(Run),
    Delete,
}

impl Value {
    fn size(&self) -> usize {
        match self {
            Value::Put(value) | Value::Expiring { value, .. } => value.len(),
            Value::Run(run) => run.bytes,
            Value::Delete => 0,
        }
    }

    fn look(&mut self, now: Instant) -> Look {
        match self {
            Value::Put(value) => Look::Put(value.clone()),
            Value::Expiring { value, expires } if *expires > now => Look::Put(value.clone()),
            Value::Expiring { .. } | Value::Delete => Look::Deleted,
            Value::Run(run) => Look::Put(run.value()),
        }
    }
}

#[derive(Debug)]
struct Entry {
    value: Value,
    /// The layer's generation when it last changed: a flush removes only the
    /// entries it wrote as they are.
    generation: u64,
}

#[derive(Debug, Default)]
struct Layer {
    entries: BTreeMap<Bytes, Entry>,
    /// Per subject (its message key without the version): the key of the run its
    /// next run may extend.
    tails: HashMap<Bytes, Bytes>,
    /// Keys and values held, for the flush's trigger.
    bytes: usize,
    generation: u64,
    /// The last journal round applied.
    round: Option<u64>,
    /// When the oldest unflushed round was applied.
    since: Option<Instant>,
    /// Flushes started, for readers that look here and then at the engine.
    flushes: u64,
    /// Messages per run key in the last flush: how much waiting joined.
    joining: f64,
}

impl Layer {
    fn set(&mut self, key: Bytes, value: Value) {
        let added = key.len() + value.size();
        let entry = Entry {
            value,
            generation: self.generation,
        };
        if let Some(old) = self.entries.insert(key.clone(), entry) {
            self.bytes = self.bytes.saturating_sub(key.len() + old.value.size());
        }
        self.bytes += added;
    }

    /// Extends the subject's open run with `value` when it starts where that run
    /// ends and the joined run stays within a run's bounds.
    fn extend(&mut self, prefix: &[u8], key: &[u8], value: &Bytes) -> bool {
        let Some(tail) = self.tails.get(prefix) else {
            return false;
        };
        let (Some(first), Some(version)) =
            (keys::message_version(tail), keys::message_version(key))
        else {
            return false;
        };
        let Some(entry) = self.entries.get_mut(tail) else {
            return false;
        };
        let Value::Run(run) = &mut entry.value else {
            return false;
        };
        let count = record::run_count(value);
        if first + u64::from(run.count) != version
            || run.count + count > RUN_MAX_MESSAGES
            || run.bytes + value.len() > RUN_MAX_BYTES
        {
            return false;
        }
        run.parts.push(value.clone());
        run.count += count;
        run.bytes += value.len();
        run.joined = None;
        entry.generation = self.generation;
        self.bytes += value.len();
        true
    }
}

/// A subject's message key without its version (sharing the key's bytes), or `None`
/// for another kind of key.
fn subject_of(key: &Bytes) -> Option<Bytes> {
    if key.first() != Some(&keys::MESSAGE) {
        return None;
    }
    Some(key.slice(..key.len().checked_sub(8)?))
}

/// A layer written out: the batch, the round it ends with and the generation it saw.
struct Snapshot {
    entries: Vec<(Bytes, Value)>,
    round: u64,
    generation: u64,
}

/// The unflushed rounds of a journaled store. Empty and unused without a journal.
pub(crate) struct Unflushed {
    layer: Mutex<Layer>,
    /// One flush at a time, so they reach the engine in round order.
    flushing: tokio::sync::Mutex<()>,
    /// The last flush's round and write, for the tracker of the engine's durability.
    latest: watch::Sender<Option<(u64, WriteHandle)>>,
    failed: AtomicBool,
}

impl Default for Unflushed {
    fn default() -> Self {
        Unflushed {
            layer: Mutex::new(Layer::default()),
            flushing: tokio::sync::Mutex::new(()),
            latest: watch::Sender::new(None),
            failed: AtomicBool::new(false),
        }
    }
}

impl Unflushed {
    /// Takes a round the journal holds, numbered `round`.
    pub(crate) fn apply(&self, writes: Writes, round: u64) {
        let now = Instant::now();
        let mut layer = self.layer.lock();
        layer.generation += 1;
        layer.round = Some(round);
        layer.since.get_or_insert(now);
        // A round that deletes a subject's message keys decided which from the runs
        // it read: none of that subject's runs grows in it.
        let mut deleting: HashSet<Bytes> = HashSet::new();
        for write in writes.as_slice() {
            if let Write::Delete { key } = write
                && let Some(prefix) = subject_of(key)
            {
                deleting.insert(prefix);
            }
        }
        for write in writes.into_writes() {
            match write {
                Write::Run { key, value } => {
                    let Some(prefix) = subject_of(&key) else {
                        layer.set(key, Value::Put(value));
                        continue;
                    };
                    if !deleting.contains(&prefix) && layer.extend(&prefix, &key, &value) {
                        continue;
                    }
                    let run = Run {
                        count: record::run_count(&value),
                        bytes: value.len(),
                        parts: vec![value],
                        joined: None,
                    };
                    layer.set(key.clone(), Value::Run(run));
                    if deleting.contains(&prefix) {
                        layer.tails.remove(&prefix);
                    } else {
                        layer.tails.insert(prefix, key);
                    }
                }
                Write::Put { key, value } => {
                    if let Some(prefix) = subject_of(&key) {
                        layer.tails.remove(&prefix);
                    }
                    layer.set(key, Value::Put(value));
                }
                Write::PutExpiring { key, value, ttl_ms } => {
                    let expires = now + Duration::from_millis(ttl_ms);
                    layer.set(key, Value::Expiring { value, expires });
                }
                Write::Delete { key } => {
                    if let Some(prefix) = subject_of(&key) {
                        layer.tails.remove(&prefix);
                    }
                    layer.set(key, Value::Delete);
                }
            }
        }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.layer.lock().bytes
    }

    /// How long the oldest unflushed round has waited.
    pub(crate) fn age(&self) -> Option<Duration> {
        self.layer.lock().since.map(|since| since.elapsed())
    }

    /// What this layer says of `key`.
    pub(crate) fn look(&self, key: &[u8]) -> Look {
        let mut layer = self.layer.lock();
        match layer.entries.get_mut(key) {
            Some(entry) => entry.value.look(Instant::now()),
            None => Look::Absent,
        }
    }

    /// The entries in `range` in the order asked for (a deleted or expired one as
    /// `None`), and the count of flushes started so far.
    pub(crate) fn range(
        &self,
        range: (Bound<&[u8]>, Bound<&[u8]>),
        descending: bool,
    ) -> (Vec<(Bytes, Option<Bytes>)>, u64) {
        let now = Instant::now();
        let mut layer = self.layer.lock();
        let flushes = layer.flushes;
        if layer.entries.is_empty() || is_empty_range(range) {
            return (Vec::new(), flushes);
        }
        let look = |(key, entry): (&Bytes, &mut Entry)| {
            let value = match entry.value.look(now) {
                Look::Put(value) => Some(value),
                Look::Deleted | Look::Absent => None,
            };
            (key.clone(), value)
        };
        let found = layer.entries.range_mut::<[u8], _>(range);
        let found = if descending {
            found.rev().map(look).collect()
        } else {
            found.map(look).collect()
        };
        (found, flushes)
    }

    /// Messages per run key in the last flush (0 before the first): how much
    /// waiting to flush joined runs.
    pub(crate) fn joining(&self) -> f64 {
        self.layer.lock().joining
    }

    /// Flushes started so far.
    pub(crate) fn flushes(&self) -> u64 {
        self.layer.lock().flushes
    }

    /// Waits until no flush is under way and holds further ones off while the guard
    /// lives: for a reader whose looks keep crossing flushes.
    pub(crate) async fn hold_flushes(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.flushing.lock().await
    }

    /// The last flush's round and write, as they happen.
    pub(crate) fn latest(&self) -> watch::Receiver<Option<(u64, WriteHandle)>> {
        self.latest.subscribe()
    }

    /// Whether a flush failed: the engine then lacks acknowledged rounds that only
    /// the journal holds, until a restart replays them.
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Writes everything held to the engine as one batch (not waiting for the
    /// engine's log), with `xjournal` = the last round applied, then forgets what it
    /// wrote. Returns that round, or `None` when nothing was held.
    pub(crate) async fn flush(&self, db: &Db) -> Result<Option<u64>, slatedb::Error> {
        let _one_at_a_time = self.flushing.lock().await;
        let Some(snapshot) = self.snapshot() else {
            return Ok(None);
        };
        let now = Instant::now();
        let mut batch = WriteBatch::new();
        for (key, value) in snapshot.entries {
            match value {
                Value::Put(value) => batch.put_bytes(key, value),
                Value::Run(mut run) => batch.put_bytes(key, run.value()),
                Value::Expiring { value, expires } => {
                    // An expired key still hides an older one the engine may hold.
                    let left = expires.saturating_duration_since(now).as_millis().max(1);
                    let ttl = Ttl::ExpireAfterMillis(u64::try_from(left).unwrap_or(u64::MAX));
                    batch.put_bytes_with_options(key, value, &PutOptions { ttl });
                }
                Value::Delete => batch.delete(key),
            }
        }
        batch.put(ROUND_KEY, snapshot.round.to_be_bytes());
        let written = db.write_with_options(batch, &WriteOptions::default()).await;
        let handle = match written {
            Ok(handle) => handle,
            Err(error) => {
                self.failed.store(true, Ordering::Release);
                return Err(error);
            }
        };
        {
            let mut layer = self.layer.lock();
            let generation = snapshot.generation;
            layer
                .entries
                .retain(|_, entry| entry.generation > generation);
            let left = layer
                .entries
                .iter()
                .map(|(key, entry)| key.len() + entry.value.size())
                .sum();
            layer.bytes = left;
            if layer.entries.is_empty() {
                layer.since = None;
            }
        }
        self.latest.send_replace(Some((snapshot.round, handle)));
        Ok(Some(snapshot.round))
    }

    fn snapshot(&self) -> Option<Snapshot> {
        let mut layer = self.layer.lock();
        let round = layer.round?;
        if layer.entries.is_empty() {
            return None;
        }
        layer.flushes += 1;
        // What is written now is not extended after: a run grows only while nothing
        // of it is in the engine.
        layer.tails.clear();
        let (mut runs, mut messages) = (0u64, 0u64);
        for entry in layer.entries.values() {
            if let Value::Run(run) = &entry.value {
                runs += 1;
                messages += u64::from(run.count);
            }
        }
        layer.joining = if runs == 0 {
            0.0
        } else {
            messages as f64 / runs as f64
        };
        let entries = layer
            .entries
            .iter()
            .map(|(key, entry)| (key.clone(), entry.value.clone()))
            .collect();
        layer.since = Some(Instant::now());
        Some(Snapshot {
            entries,
            round,
            generation: layer.generation,
        })
    }
}

/// Whether `range` holds no key (`BTreeMap::range` panics on a reversed one).
fn is_empty_range((start, end): (Bound<&[u8]>, Bound<&[u8]>)) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e))
        | (Bound::Excluded(s), Bound::Excluded(e)) => s >= e,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
