//! Key streams on object storage: every leaf subject is a durable, versioned stream.
//!
//! The store owns the engine (SlateDB on `object_store`) and the one sequencer that
//! gives each stored message its subject version and tenant offset, checks expected
//! versions and msg ids, hands the message to routing at once (through
//! [`StoreEvents`]), and writes many messages per engine write (group commit). Reads
//! (get, replay, subject listing) see durable data only.
//!
//! The store knows nothing about protocols, connections or routing: what it is told
//! to call back is the [`StoreEvents`] trait, and acks are opaque [`AckTo`] values it
//! returns untouched. Everything above it goes through this module's API, so an
//! engine upgrade touches this folder only.

mod data_keys;
mod engine;
mod groups;
pub mod journal;
mod journaled;
mod keys;
pub mod observed;
mod open;
mod plugins;
mod purge;
mod read;
mod record;
pub mod reduce;
mod retained;
mod retention;
mod runs;
mod schemas;
mod sealed;
mod sequencer;
mod snapshot;
pub mod stats;
mod streams;
mod tenants;
#[cfg(test)]
pub(crate) mod tests;
mod unflushed;
mod users;
mod writes;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

pub use data_keys::MAX_DATA_KEYS;
pub(crate) use engine::{Engine, Found, Scanned};
pub use open::{S3Settings, StoreLock, StoreUrl, s3_client};
pub use purge::Purged;
pub use read::{
    PAGE_BYTES, PAGE_MESSAGES, ReplayFrom, ReplayPage, RetainedPage, StoredMessage, SubjectHead,
    SubjectsPage,
};
pub use record::Record;
pub use retention::{RetentionPass, RetentionRules, shorter};
pub use schemas::SchemaRecord;
pub use snapshot::{Compaction, Snapshot};
pub use tenants::{
    DEFAULT_TENANT, PatternRate, TenantLimits, TenantRecord, check_tenant_name, new_tenant,
};
pub use users::{Permissions, Rules, TokenRecord, UserRecord, check_user_name};

/// The on-store format this binary writes. Older formats are opened (and migrated
/// when one exists); newer ones are refused. Format 2 keeps a subject's messages of
/// one round under one key (a run); a format 1 message is a run of one, so a format 1
/// store opens as it is and is marked format 2 (older binaries then refuse it).
pub const FORMAT_VERSION: u64 = 2;

/// Folds waiting for the compactor; more are skipped (the next multiple covers them).
const COMPACTION_QUEUE: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "store location `{0}` is not understood: use file://PATH, s3://BUCKET/PREFIX or memory://"
    )]
    Url(String),
    #[error("{0}")]
    S3(String),
    #[error(
        "another canopy process is using the store at {path} (its lock file {lock} is held); \
         stop it first, or point this one at another data folder"
    )]
    Locked { path: String, lock: String },
    #[error("cannot prepare the data folder {path}: {source}")]
    Folder {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "the store was written by a newer canopy (format {found}, this binary knows up to \
         {known}); upgrade canopy to open it"
    )]
    NewerFormat { found: u64, known: u64 },
    #[error(
        "the store holds data that canopy did not write (no format record); refusing to use it"
    )]
    Foreign,
    #[error("storage engine: {0}")]
    Engine(#[from] slatedb::Error),
    #[error("the store's journal in {path}: {source}")]
    Journal {
        path: String,
        source: journal::JournalError,
    },
    #[error("{0}")]
    Refused(String),
    #[error("the store is shutting down")]
    Closed,
}

/// When a publish counts as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// In the engine's memory: fast, lost on a crash.
    Received,
    /// In the write-ahead log in the object store (with the local folder, fsynced).
    #[default]
    Durable,
}

/// A precondition on an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expectation {
    /// The subject's head version must be exactly this (0 = the subject must not exist).
    Version(u64),
    /// The offset of the subject's last message must be exactly this (0 = none):
    /// JetStream's `Nats-Expected-Last-Subject-Sequence`.
    LastOffset(u64),
    /// The offset of the tenant's last message (its stream's last sequence) must be
    /// exactly this (0 = none): JetStream's `Nats-Expected-Last-Sequence`.
    StreamOffset(u64),
}

/// Where an ack goes; opaque to the store, handed back with the outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckTo {
    pub address: Bytes,
    pub flags: u32,
    /// What the layer above hangs on the ack (the consumer groups a `Canopy-Await`
    /// publish waits for); carried back untouched.
    pub cargo: Option<AckCargo>,
}

/// A value the store carries with an ack or a route and never looks into, so the
/// layers above can attach their own state without the store knowing their types.
#[derive(Clone)]
pub struct AckCargo(Arc<dyn std::any::Any + Send + Sync>);

impl AckCargo {
    pub fn new<T: std::any::Any + Send + Sync>(value: Arc<T>) -> Self {
        Self(value)
    }

    /// The value, when it is a `T`.
    pub fn get<T: std::any::Any + Send + Sync>(self) -> Option<Arc<T>> {
        self.0.downcast().ok()
    }

    /// The value, when it is a `T`, without taking it.
    pub fn peek<T: std::any::Any + Send + Sync>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl std::fmt::Debug for AckCargo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AckCargo(..)")
    }
}

/// Two cargoes are equal when they are the same value.
impl PartialEq for AckCargo {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for AckCargo {}

/// One message of an append.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// The raw NATS header block, or empty.
    pub headers: Bytes,
    pub payload: Bytes,
    /// Kept with the message, opaque to the store (see [`record::Record::flags`]).
    pub flags: u8,
}

/// Messages for one subject, stored all or none, in order.
#[derive(Debug)]
pub struct AppendRequest {
    pub tenant: Arc<str>,
    pub subject: Arc<str>,
    pub messages: Vec<NewMessage>,
    pub expect: Option<Expectation>,
    pub msg_id: Option<Box<str>>,
    pub durability: Durability,
    /// Set when the publisher wants to know the outcome.
    pub ack: Option<AckTo>,
    /// Opaque to the store: handed to [`StoreEvents::sequenced`] for routing.
    pub route: RouteTag,
    /// Fold the subject into a snapshot every N versions.
    pub compaction: Option<Compaction>,
    /// Versions kept for the subject (0 = all): older ones are deleted as new ones
    /// are appended.
    pub max_versions: u64,
    /// The message becomes the subject's retained message (an empty payload clears
    /// it), MQTT's RETAIN.
    pub retain: bool,
}

/// How the caller wants a stored message routed live; opaque to the store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteTag {
    pub origin: u64,
    pub flags: u32,
    pub reply: Option<Bytes>,
    /// The publishing connection, which routing tells when a subscriber it feeds
    /// falls behind (flow control).
    pub publisher: Option<AckCargo>,
}

/// What the sequencer's queue carries.
#[derive(Debug)]
pub(crate) enum Input {
    Append(AppendRequest),
    /// Signalled once everything queued before it was handed to routing.
    Barrier(tokio::sync::oneshot::Sender<()>),
    /// Signalled once everything queued before it is durable (and was routed).
    DurableBarrier(tokio::sync::oneshot::Sender<()>),
    /// Drops what the sequencer remembers of a tenant (heads, offsets, counts), so a
    /// purged tenant is read afresh from the store.
    Forget(Arc<str>),
    /// A tenant's stored limits, as its record says (sent at start and on change).
    Limits(Arc<str>, StoredLimits),
    /// Bytes of a tenant's messages deleted outside the sequencer (retention, purges).
    Released(Arc<str>, u64),
}

/// What a tenant may keep in the store; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoredLimits {
    pub max_subjects: Option<u64>,
    pub max_bytes: Option<u64>,
    /// Retention by age for the whole tenant, on top of the subjects' policies.
    pub max_age_ms: Option<u64>,
}

/// What a tenant keeps in the store: its subjects, and the header and payload bytes
/// of its messages not yet deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoredUsage {
    pub subjects: u64,
    pub bytes: u64,
}

/// What became of an append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendOutcome {
    Stored {
        subject: Arc<str>,
        /// Version and offset of the last message of the append.
        version: u64,
        offset: u64,
        count: usize,
    },
    /// The msg id was seen within the dedupe window: nothing was stored again.
    Duplicate {
        subject: Arc<str>,
        version: u64,
        offset: u64,
    },
    /// The expectation did not hold: nothing was stored.
    Conflict {
        subject: Arc<str>,
        expected: Expectation,
        current_version: u64,
        current_offset: u64,
    },
    /// The store could not take the append.
    Failed { reason: String },
    /// The tenant is at a stored limit (bytes, or subjects for a new subject):
    /// nothing was stored.
    QuotaExceeded { reason: String },
}

/// A message that has just been sequenced, borrowed for routing.
#[derive(Debug, Clone, Copy)]
pub struct Sequenced<'a> {
    pub tenant: &'a str,
    pub subject: &'a str,
    pub version: u64,
    pub offset: u64,
    pub time_ms: u64,
    pub flags: u8,
    /// Shared, not copied: a follower that keeps the message clones the handle.
    pub headers: &'a Bytes,
    pub payload: &'a Bytes,
    pub route: &'a RouteTag,
}

/// What the store calls back. Implemented by the broker.
pub trait StoreEvents: Send + Sync + 'static {
    /// Messages that have their versions, in version order per subject: deliver them
    /// live now. Called from the sequencer task: must not block.
    fn sequenced(&self, batch: &[Sequenced<'_>]);
    /// Outcomes of appends that asked for an ack, once their durability holds.
    fn acknowledged(&self, acks: Vec<(Arc<str>, AckTo, AppendOutcome)>);
    /// A write failed or did not become durable, so messages `sequenced` before this
    /// call may not be stored. Called before any durability barrier queued after
    /// those messages resolves.
    fn lost(&self) {}
}

/// Settings of the store, from `[store]` in the configuration.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    pub url: StoreUrl,
    /// How often the write-ahead log is flushed: the floor of a durable ack's latency.
    pub flush_interval: Duration,
    /// How long a msg id is remembered.
    pub dedupe_window: Duration,
    /// On a local folder: the garbage collector's interval for manifests and the
    /// write-ahead log, and the age their files must have.
    pub local_gc: Duration,
    /// Compress the engine's SSTs with LZ4.
    pub compress: bool,
    /// Most appends one group commit takes.
    pub max_batch: usize,
    /// Appends that may wait for the sequencer before publishers are held back.
    pub queue_depth: usize,
    /// How to reach S3, for `s3://` URLs.
    pub s3: S3Settings,
    /// Memory for cached SST data blocks.
    pub block_cache_bytes: u64,
    /// Memory for cached SST indexes and filters.
    pub meta_cache_bytes: u64,
    /// An object store to use instead of the one `url` names (tests, fault
    /// injection); no lock is taken on it.
    pub object_store: Option<Arc<dyn object_store::ObjectStore>>,
    /// The clock messages are stamped and aged by (shared with the broker).
    pub clock: crate::clock::Clock,
    /// On a local folder: acks wait for the store's own journal, not the engine's
    /// write-ahead log (ignored elsewhere).
    pub journal: bool,
    /// The size of each of the journal's two files.
    pub journal_bytes: u64,
    /// Where key-encryption keys come from, for tenants' sealed patterns (none:
    /// sealing is refused).
    pub keys: Option<Arc<dyn crate::sealing::KeyProvider>>,
}

impl StoreSettings {
    /// Where a local folder's journal lives, whether or not this run keeps one (a
    /// journal left by an earlier run is replayed either way).
    pub(crate) fn journal_folder(&self) -> Option<std::path::PathBuf> {
        match (&self.url, &self.object_store) {
            (StoreUrl::File(folder), None) => Some(journaled::folder_of(folder)),
            _ => None,
        }
    }
}

/// The open store. Cheap to share behind an `Arc`.
pub struct Store {
    db: Arc<Engine>,
    clock: crate::clock::Clock,
    /// Cancelled by `close`: stops the sequencer and background passes.
    appends: sequencer::Inbox,
    durable: watch::Receiver<u64>,
    /// Held until [`Store::close`] (or the last drop), so the folder is free for the
    /// next server as soon as this one has closed, whoever still holds the store.
    lock: parking_lot::Mutex<Option<StoreLock>>,
    stop: tokio_util::sync::CancellationToken,
    sequencer: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    stats: Arc<stats::StoreStats>,
    /// Tenants at their stored bytes limit, kept by the sequencer.
    bytes_full: Arc<TenantSet>,
    /// Tenants with a retention age of their own, for retention passes.
    tenant_max_age: parking_lot::RwLock<std::collections::HashMap<Arc<str>, u64>>,
    /// Held by whatever deletes old versions outside the sequencer (purge, retention,
    /// a snapshot dropping what it covers): a run cut in two is written again, which
    /// must not bring back versions another deletion just removed.
    deleting: Arc<tokio::sync::Mutex<()>>,
    key_provider: Option<Arc<dyn crate::sealing::KeyProvider>>,
    /// Serialises changes to data keys (`data_keys.rs`).
    key_changes: tokio::sync::Mutex<()>,
}

/// A set of tenant names the sequencer keeps and front ends ask about on every
/// publish: while it is empty (the usual case) asking takes no lock.
#[derive(Debug, Default)]
pub(crate) struct TenantSet {
    members: parking_lot::RwLock<std::collections::HashSet<Arc<str>>>,
    len: std::sync::atomic::AtomicUsize,
}

impl TenantSet {
    pub(crate) fn contains(&self, tenant: &str) -> bool {
        self.len.load(std::sync::atomic::Ordering::Acquire) > 0
            && self.members.read().contains(tenant)
    }

    /// Puts `tenant` in or out.
    pub(crate) fn set(&self, tenant: &Arc<str>, member: bool) {
        let mut members = self.members.write();
        if member {
            members.insert(Arc::clone(tenant));
        } else {
            members.remove(tenant);
        }
        self.len
            .store(members.len(), std::sync::atomic::Ordering::Release);
    }
}

impl Store {
    /// Opens (or creates) the store, checks its format and starts the sequencer.
    pub async fn open(
        settings: StoreSettings,
        events: Arc<dyn StoreEvents>,
    ) -> Result<Store, StoreError> {
        let journal_folder = settings.journal_folder();
        let journaled = settings.journal && journal_folder.is_some();
        let opened = open::open_engine(&settings, journaled).await?;
        let db = Arc::new(Engine::new(opened.db, journaled));
        open::check_format(&db).await?;
        let journal = match &journal_folder {
            Some(folder) => {
                let opened =
                    journaled::open(&db, folder, settings.journal_bytes, journaled).await?;
                opened.pair.map(|pair| (pair, opened.next_round))
            }
            None => None,
        };
        let (durable_tx, durable) = watch::channel(0);
        let stop = tokio_util::sync::CancellationToken::new();
        let (jobs, job_queue) = mpsc::channel(COMPACTION_QUEUE);
        let deleting = Arc::new(tokio::sync::Mutex::new(()));
        tokio::spawn(snapshot::compactor(
            Arc::clone(&db),
            durable.clone(),
            job_queue,
            Arc::clone(&deleting),
            settings.clock.clone(),
        ));
        let stats = Arc::new(stats::StoreStats::default());
        let bytes_full = Arc::new(TenantSet::default());
        let sequencer = sequencer::Sequencer::new(
            Arc::clone(&db),
            events,
            &settings,
            durable_tx,
            jobs,
            Arc::clone(&stats),
            Arc::clone(&bytes_full),
        )
        .with_journal(journal);
        let (appends, task) = sequencer::start(sequencer, settings.queue_depth, stop.clone());
        Ok(Store {
            db,
            appends,
            durable,
            lock: parking_lot::Mutex::new(opened.lock),
            stop,
            sequencer: tokio::sync::Mutex::new(Some(task)),
            stats,
            bytes_full,
            tenant_max_age: Default::default(),
            deleting,
            clock: settings.clock,
            key_provider: settings.keys,
            key_changes: tokio::sync::Mutex::new(()),
        })
    }

    /// The clock messages are stamped and aged by.
    pub fn clock(&self) -> &crate::clock::Clock {
        &self.clock
    }

    /// Queues an append; waits only while the sequencer's queue is full.
    pub async fn append(&self, request: AppendRequest) -> Result<(), StoreError> {
        self.try_append(request)
            .await
            .map_err(|_| StoreError::Closed)
    }

    /// [`Store::append`] that gives the request back when the store is closed, so
    /// the caller can take it elsewhere (a cluster node whose shard just moved).
    pub async fn try_append(&self, request: AppendRequest) -> Result<(), Box<AppendRequest>> {
        self.queue_append(request).await?;
        self.run_queued().await;
        Ok(())
    }

    /// Queues an append without running a round: a caller with several queues them
    /// all, then calls [`Store::run_queued`] once, so they share one round.
    pub async fn queue_append(&self, request: AppendRequest) -> Result<(), Box<AppendRequest>> {
        let Err(tokio::sync::mpsc::error::SendError(refused)) =
            self.appends.queue(Input::Append(request)).await
        else {
            return Ok(());
        };
        match refused {
            Input::Append(request) => Err(Box::new(request)),
            // What was sent is what comes back: an append, never anything else.
            _ => Ok(()),
        }
    }

    /// Runs a round of what is queued in the caller's task when none is under way
    /// (a lone publish pays no hop to the sequencer's task); else the sequencer's
    /// task runs it.
    pub async fn run_queued(&self) {
        self.appends.run_queued().await;
    }

    /// Makes the sequencer forget a tenant before its data is purged.
    /// Sets a tenant's stored limits, enforced from the next append on.
    pub async fn set_limits(&self, tenant: &str, limits: StoredLimits) -> Result<(), StoreError> {
        match limits.max_age_ms.filter(|ms| *ms > 0) {
            Some(ms) => self.tenant_max_age.write().insert(Arc::from(tenant), ms),
            None => self.tenant_max_age.write().remove(tenant),
        };
        self.appends
            .send(Input::Limits(Arc::from(tenant), limits))
            .await
            .map_err(|_| StoreError::Closed)
    }

    /// Tells the sequencer that `bytes` of a tenant's messages were deleted.
    pub(crate) async fn release(&self, tenant: &str, bytes: u64) {
        if bytes > 0 {
            // Closing: the count errs high until the next start reads it.
            let _ = self
                .appends
                .send(Input::Released(Arc::from(tenant), bytes))
                .await;
        }
    }

    /// Whether the tenant is at its stored bytes limit: publishes to stored subjects
    /// are refused until retention or a purge frees room.
    pub fn at_bytes_limit(&self, tenant: &str) -> bool {
        self.bytes_full.contains(tenant)
    }

    pub async fn forget_tenant(&self, tenant: &str) -> Result<(), StoreError> {
        self.appends
            .send(Input::Forget(Arc::from(tenant)))
            .await
            .map_err(|_| StoreError::Closed)?;
        // Every round of the tenant decided before is applied (behind a journal: in
        // the unflushed rounds), so the purge's flush takes it and its scan sees it.
        self.durable_barrier().await
    }

    /// Resolves once every append queued before it has been sequenced and handed to
    /// routing: how a connection answers PING only after its earlier publishes were
    /// delivered, as NATS clients expect of a flush.
    pub async fn barrier(&self) -> Result<(), StoreError> {
        let (passed, wait) = tokio::sync::oneshot::channel();
        self.appends
            .send(Input::Barrier(passed))
            .await
            .map_err(|_| StoreError::Closed)?;
        wait.await.map_err(|_| StoreError::Closed)
    }

    /// Resolves once every append queued before it was routed and is durable, so a
    /// durable read started afterwards sees every message that routing did not hand
    /// to subscriptions made before the call: how a session moves from reading
    /// stored history to live delivery without a gap.
    pub async fn durable_barrier(&self) -> Result<(), StoreError> {
        let (passed, wait) = tokio::sync::oneshot::channel();
        self.appends
            .send(Input::DurableBarrier(passed))
            .await
            .map_err(|_| StoreError::Closed)?;
        // A write that failed drops the barrier: nothing it held became durable, and
        // nothing more will.
        let _ = wait.await;
        Ok(())
    }

    /// A watch of the highest offset (of any tenant) known durable; it moves whenever
    /// a group commit becomes durable. Followers wait on it.
    pub fn durable_watch(&self) -> watch::Receiver<u64> {
        self.durable.clone()
    }

    /// Stops the sequencer after it has written what it was given, then flushes and
    /// closes the engine.
    pub async fn close(&self) -> Result<(), StoreError> {
        self.stop.cancel();
        if let Some(task) = self.sequencer.lock().await.take() {
            let _ = task.await;
        }
        let closed = async {
            self.db.flush().await?;
            self.db.close().await
        }
        .await;
        // Nothing more is written through this store either way: free the folder.
        self.lock.lock().take();
        closed.map_err(StoreError::from)
    }

    /// Write and durability latencies, for `/metrics`.
    pub fn stats(&self) -> &stats::StoreStats {
        &self.stats
    }

    pub(crate) fn db(&self) -> &Engine {
        &self.db
    }
}

/// Writes `batch` and waits until it is durable: for the writes outside the
/// sequencer (snapshots, purges, the format record), whose callers answer only once
/// the change holds. SlateDB's own `write` returns after the memtable. Behind a
/// journal the engine's log is flushed on a slow timer, so such a write flushes it.
pub(crate) async fn write_durably(
    db: &Engine,
    batch: slatedb::WriteBatch,
) -> Result<(), StoreError> {
    use futures::FutureExt;
    let handle = db.write(batch).await?;
    if db.journaled() && handle.await_durable().now_or_never().is_none() {
        db.flush_log().await?;
    }
    handle.await_durable().await?;
    Ok(())
}

/// [`write_durably`] for one key.
pub(crate) async fn put_durably(
    db: &Engine,
    key: impl AsRef<[u8]>,
    value: impl AsRef<[u8]>,
) -> Result<(), StoreError> {
    let mut batch = slatedb::WriteBatch::new();
    batch.put(key, value);
    write_durably(db, batch).await
}
