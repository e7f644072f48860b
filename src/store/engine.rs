//! The engine as the store reads and writes it: SlateDB, with the rounds the journal
//! holds and the engine does not yet (`unflushed.rs`) laid over every read, and what
//! counts as durable.
//!
//! Must never: let a read reach SlateDB around the unflushed rounds (every read of
//! the store goes through [`Engine::scan_with_options`] or [`Engine::get_with_options`]),
//! or show a read a flush's rounds without the rounds its look at the layer saw.

use std::ops::Bound;

use bytes::Bytes;
use slatedb::config::{DurabilityLevel, FlushOptions, FlushType, ReadOptions, ScanOptions};
use slatedb::{ByteRangeBounds, Db, DbIterator, IterationOrder, WriteBatch, WriteHandle};

use super::unflushed::{Look, Unflushed};

/// A range's bounds as owned bytes, kept for the engine's scan (which may be opened
/// more than once) and lent to the unflushed rounds'.
type OwnedRange = (Bound<Bytes>, Bound<Bytes>);

fn owned(range: &impl ByteRangeBounds) -> OwnedRange {
    let own = |bound: Bound<&[u8]>| bound.map(Bytes::copy_from_slice);
    (own(range.start_bound()), own(range.end_bound()))
}

fn borrowed(range: &OwnedRange) -> (Bound<&[u8]>, Bound<&[u8]>) {
    (
        range.0.as_ref().map(|b| &b[..]),
        range.1.as_ref().map(|b| &b[..]),
    )
}

/// One key and its value, as a scan finds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub key: Bytes,
    pub value: Bytes,
}

/// The engine, and what counts as durable in it.
///
/// Without a journal, a write is durable once the engine's write-ahead log holds it,
/// and reads that must never show what a crash could take back read at
/// [`DurabilityLevel::Remote`]. With a journal (a local folder), a round reaches this
/// layer and then the engine only once the journal holds it, so both are already
/// durable for messages and those reads read memory; a write outside the sequencer
/// flushes the engine's log at once, since its timer is slow there.
pub(crate) struct Engine {
    db: Db,
    journaled: bool,
    unflushed: Unflushed,
    /// The data keys messages are sealed with and opened by (`sealed.rs`).
    sealing: crate::sealing::Sealing,
}

/// Looks at the layer and the engine that crossed a flush before a read holds
/// flushes off.
const LOOKS_BEFORE_HOLDING: usize = 3;

impl Engine {
    pub(super) fn new(db: Db, journaled: bool) -> Engine {
        Engine {
            db,
            journaled,
            unflushed: Unflushed::default(),
            sealing: crate::sealing::Sealing::default(),
        }
    }

    /// The tenants' data keys.
    pub(super) fn sealing(&self) -> &crate::sealing::Sealing {
        &self.sealing
    }

    /// Whether rounds are made durable by the journal.
    pub(super) fn journaled(&self) -> bool {
        self.journaled
    }

    /// The rounds the journal holds and the engine does not yet.
    pub(super) fn unflushed(&self) -> &Unflushed {
        &self.unflushed
    }

    /// Writes the unflushed rounds to the engine now: for a write outside the
    /// sequencer that must land after them (a purge or a retention pass deleting
    /// what a round wrote, which a later flush would otherwise write again).
    pub(super) async fn flush_unflushed(&self) -> Result<(), slatedb::Error> {
        if self.journaled {
            self.unflushed.flush(&self.db).await?;
        }
        Ok(())
    }

    fn durable_level(&self) -> DurabilityLevel {
        if self.journaled {
            DurabilityLevel::Memory
        } else {
            DurabilityLevel::Remote
        }
    }

    /// A scan that shows only what a crash cannot take back.
    pub(super) fn durable_scan(&self) -> ScanOptions {
        ScanOptions::default().with_durability_filter(self.durable_level())
    }

    /// A read that shows only what a crash cannot take back.
    pub(super) fn durable_read(&self) -> ReadOptions {
        ReadOptions::default().with_durability_filter(self.durable_level())
    }

    pub(super) async fn get(
        &self,
        key: impl AsRef<[u8]> + Send,
    ) -> Result<Option<Bytes>, slatedb::Error> {
        self.get_with_options(key, &ReadOptions::default()).await
    }

    /// One key's value: the unflushed rounds' when they have it, else the engine's.
    pub(super) async fn get_with_options(
        &self,
        key: impl AsRef<[u8]> + Send,
        options: &ReadOptions,
    ) -> Result<Option<Bytes>, slatedb::Error> {
        // One key needs no second look: a flush that lands between can only make
        // the engine's value newer.
        match self.unflushed.look(key.as_ref()) {
            Look::Put(value) => Ok(Some(value)),
            Look::Deleted => Ok(None),
            Look::Absent => self.db.get_with_options(key, options).await,
        }
    }

    pub(super) async fn scan(
        &self,
        range: impl ByteRangeBounds + Send,
    ) -> Result<Scanned, slatedb::Error> {
        self.scan_with_options(range, &ScanOptions::default()).await
    }

    /// The keys in `range` in the order `options` asks for, the unflushed rounds'
    /// over the engine's.
    pub(super) async fn scan_with_options(
        &self,
        range: impl ByteRangeBounds + Send,
        options: &ScanOptions,
    ) -> Result<Scanned, slatedb::Error> {
        let descending = matches!(options.order, IterationOrder::Descending);
        let range = owned(&range);
        let borrowed = || borrowed(&range);
        if !self.journaled {
            let engine = self.db.scan_with_options(range.clone(), options).await?;
            return Ok(Scanned::new(engine, Vec::new(), descending));
        }
        // The layer first, then the engine: a flush that started between them may
        // have given the engine rounds the first look did not see, so look again.
        for _ in 0..LOOKS_BEFORE_HOLDING {
            let (layer, flushes) = self.unflushed.range(borrowed(), descending);
            let engine = self.db.scan_with_options(range.clone(), options).await?;
            if self.unflushed.flushes() == flushes {
                return Ok(Scanned::new(engine, layer, descending));
            }
        }
        let _held = self.unflushed.hold_flushes().await;
        let (layer, _) = self.unflushed.range(borrowed(), descending);
        let engine = self.db.scan_with_options(range.clone(), options).await?;
        Ok(Scanned::new(engine, layer, descending))
    }

    /// What the engine itself holds, without the unflushed rounds: for deletions
    /// outside the sequencer, which first flush the rounds and then must delete only
    /// what the engine holds (deleting what only the unflushed rounds hold would be
    /// undone by their flush, and a run there may still grow).
    ///
    /// A key the unflushed rounds delete is hidden: the sequencer already took it
    /// (a version limit's drop, with its bytes off the usage), and deleting or cutting
    /// it again would count it twice or write a part of it back.
    pub(super) async fn scan_flushed(
        &self,
        range: impl ByteRangeBounds + Send,
        options: &ScanOptions,
    ) -> Result<Scanned, slatedb::Error> {
        let descending = matches!(options.order, IterationOrder::Descending);
        let range = owned(&range);
        let (layer, _) = self.unflushed.range(borrowed(&range), descending);
        let deleted = layer
            .into_iter()
            .filter(|(_, value)| value.is_none())
            .collect();
        let engine = self.db.scan_with_options(range.clone(), options).await?;
        Ok(Scanned::new(engine, deleted, descending))
    }

    /// [`Engine::scan_flushed`] for one key.
    pub(super) async fn get_flushed(
        &self,
        key: impl AsRef<[u8]> + Send,
        options: &ReadOptions,
    ) -> Result<Option<Bytes>, slatedb::Error> {
        if self.unflushed.look(key.as_ref()) == Look::Deleted {
            return Ok(None);
        }
        self.db.get_with_options(key, options).await
    }

    pub(super) async fn write(&self, batch: WriteBatch) -> Result<WriteHandle, slatedb::Error> {
        self.db.write(batch).await
    }

    pub(super) async fn write_with_options(
        &self,
        batch: WriteBatch,
        options: &slatedb::config::WriteOptions,
    ) -> Result<WriteHandle, slatedb::Error> {
        self.db.write_with_options(batch, options).await
    }

    /// Flushes the engine's write-ahead log now instead of at its timer's next tick.
    pub(super) async fn flush_log(&self) -> Result<(), slatedb::Error> {
        let wal = FlushOptions {
            flush_type: FlushType::Wal,
        };
        self.db.flush_with_options(wal).await
    }

    /// Flushes the engine's memory to its tables.
    pub(super) async fn flush(&self) -> Result<(), slatedb::Error> {
        self.db.flush().await
    }

    pub(super) async fn close(&self) -> Result<(), slatedb::Error> {
        self.db.close().await
    }

    /// SlateDB itself, for what the store does not wrap (its manifest and metrics).
    pub(super) fn slatedb(&self) -> &Db {
        &self.db
    }
}

/// A scan's keys: the unflushed rounds' (a deleted key hides the engine's) merged
/// with the engine's, each key once.
pub(crate) struct Scanned {
    engine: DbIterator,
    /// The engine's next key, read ahead to compare.
    ahead: Option<Found>,
    engine_done: bool,
    layer: std::iter::Peekable<std::vec::IntoIter<(Bytes, Option<Bytes>)>>,
    descending: bool,
}

impl Scanned {
    fn new(engine: DbIterator, layer: Vec<(Bytes, Option<Bytes>)>, descending: bool) -> Scanned {
        Scanned {
            engine,
            ahead: None,
            engine_done: false,
            layer: layer.into_iter().peekable(),
            descending,
        }
    }

    async fn engine_next(&mut self) -> Result<Option<Found>, slatedb::Error> {
        if let Some(found) = self.ahead.take() {
            return Ok(Some(found));
        }
        if self.engine_done {
            return Ok(None);
        }
        let next = self.engine.next().await?.map(|kv| Found {
            key: kv.key,
            value: kv.value,
        });
        self.engine_done = next.is_none();
        Ok(next)
    }

    pub(crate) async fn next(&mut self) -> Result<Option<Found>, slatedb::Error> {
        loop {
            if self.layer.peek().is_none() {
                return self.engine_next().await;
            }
            if self.ahead.is_none() {
                self.ahead = self.engine_next().await?;
            }
            let Some((layer_key, _)) = self.layer.peek() else {
                continue;
            };
            let layer_first = match &self.ahead {
                None => true,
                Some(found) => {
                    let order = layer_key.as_ref().cmp(found.key.as_ref());
                    let order = if self.descending {
                        order.reverse()
                    } else {
                        order
                    };
                    match order {
                        std::cmp::Ordering::Less => true,
                        std::cmp::Ordering::Equal => {
                            // The layer's value is newer than the engine's.
                            self.ahead = None;
                            true
                        }
                        std::cmp::Ordering::Greater => false,
                    }
                }
            };
            if !layer_first {
                return Ok(self.ahead.take());
            }
            if let Some((key, Some(value))) = self.layer.next() {
                return Ok(Some(Found { key, value }));
            }
        }
    }
}
