//! An object store wrapper that counts what the engine asks of the store below it,
//! and can make that store misbehave on demand.
//!
//! Counting proves "does not grow" claims (a restart reads a bounded number of
//! objects, whatever the history holds) without timing anything. [`Faults`] inject
//! errors and delays, to show that a failing store gives publishers errors or late
//! acks but never loses an acked message. It forwards every call unchanged
//! otherwise; it must never alter data.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// Requests seen so far.
#[derive(Debug, Default)]
pub struct StoreCounters {
    pub gets: AtomicU64,
    pub puts: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
}

impl StoreCounters {
    /// Reads of any kind: gets (whole, ranged) and listings.
    pub fn reads(&self) -> u64 {
        self.gets.load(Ordering::Relaxed) + self.lists.load(Ordering::Relaxed)
    }
}

/// Misbehaviour to inject, switchable while the store is in use.
#[derive(Debug, Default)]
pub struct Faults {
    fail_writes: AtomicBool,
    fail_reads: AtomicBool,
    delay_ms: AtomicU64,
}

impl Faults {
    /// Every put, copy and delete fails (as a network error would) while set.
    pub fn fail_writes(&self, on: bool) {
        self.fail_writes.store(on, Ordering::SeqCst);
    }

    /// Every get and list fails while set.
    pub fn fail_reads(&self, on: bool) {
        self.fail_reads.store(on, Ordering::SeqCst);
    }

    /// Every request waits this long first.
    pub fn delay(&self, delay: Duration) {
        self.delay_ms.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    async fn apply(&self, write: bool) -> Result<()> {
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let failing = if write {
            self.fail_writes.load(Ordering::SeqCst)
        } else {
            self.fail_reads.load(Ordering::SeqCst)
        };
        if failing {
            return Err(object_store::Error::Generic {
                store: "faults",
                source: Box::new(std::io::Error::other(
                    "injected fault: the store is unreachable",
                )),
            });
        }
        Ok(())
    }
}

/// Counts the requests to `inner`, and applies [`Faults`].
#[derive(Debug)]
pub struct ObservedStore {
    inner: Arc<dyn ObjectStore>,
    pub counters: Arc<StoreCounters>,
    pub faults: Arc<Faults>,
}

impl ObservedStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            counters: Arc::default(),
            faults: Arc::default(),
        }
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl fmt::Display for ObservedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "observed({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for ObservedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        Self::count(&self.counters.puts);
        self.faults.apply(true).await?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        Self::count(&self.counters.puts);
        self.faults.apply(true).await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        Self::count(&self.counters.gets);
        self.faults.apply(false).await?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        Self::count(&self.counters.gets);
        self.faults.apply(false).await?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        Self::count(&self.counters.deletes);
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        Self::count(&self.counters.lists);
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        Self::count(&self.counters.lists);
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        Self::count(&self.counters.lists);
        self.faults.apply(false).await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        Self::count(&self.counters.puts);
        self.faults.apply(true).await?;
        self.inner.copy_opts(from, to, options).await
    }
}
