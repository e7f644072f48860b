//! Opening the engine: where the store lives, the one-process lock on a local
//! folder, and the format record.
//!
//! SlateDB fences an older writer when a newer one opens the same path; on a local
//! folder that would let a second `canopy serve` silently take over a running one.
//! So a local store is guarded by an OS file lock taken before the engine opens, and
//! a second process refuses to start with a message instead.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use slatedb::Db;
use slatedb::config::{CompressionCodec, Settings};

use super::{Engine, FORMAT_VERSION, StoreError, StoreSettings, keys};

/// Where the store lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A local folder (`file://PATH`, relative paths allowed).
    File(PathBuf),
    /// Memory only, gone when the process ends (`memory://`): for tests and trials.
    Memory,
    /// An S3 bucket and a key prefix (`s3://bucket/prefix`).
    S3 { bucket: String, prefix: String },
}

/// How to reach S3 or an S3-compatible server. Empty fields fall back to the usual
/// AWS environment variables (`AWS_ACCESS_KEY_ID`, `AWS_REGION`, `AWS_ENDPOINT_URL`...).
/// Also the `[store.s3]` section of the configuration, as is.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Settings {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Plain http, for S3-compatible servers on a private network or loopback.
    pub allow_http: bool,
    /// Path-style requests (`endpoint/bucket/key`), which most S3-compatible servers need.
    pub path_style: bool,
}

impl std::str::FromStr for StoreUrl {
    type Err = StoreError;

    fn from_str(url: &str) -> Result<Self, StoreError> {
        if let Some(path) = url.strip_prefix("file://") {
            if path.is_empty() {
                return Err(StoreError::Url(url.to_owned()));
            }
            Ok(StoreUrl::File(PathBuf::from(path)))
        } else if url == "memory://" || url == "memory:" {
            Ok(StoreUrl::Memory)
        } else if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(StoreError::Url(url.to_owned()));
            }
            Ok(StoreUrl::S3 {
                bucket: bucket.to_owned(),
                prefix: prefix.trim_matches('/').to_owned(),
            })
        } else {
            Err(StoreError::Url(url.to_owned()))
        }
    }
}

impl StoreUrl {
    /// Where shard `shard` of a cluster's store lives: its own database under this
    /// one's place (`<prefix>/shards/0007`). `None` for a store in memory, which no
    /// two processes share.
    pub fn shard(&self, shard: u32) -> Option<StoreUrl> {
        let sub = format!("shards/{shard:04}");
        match self {
            StoreUrl::File(path) => Some(StoreUrl::File(path.join(sub))),
            StoreUrl::Memory => None,
            StoreUrl::S3 { bucket, prefix } => Some(StoreUrl::S3 {
                bucket: bucket.clone(),
                prefix: if prefix.is_empty() {
                    sub
                } else {
                    format!("{prefix}/{sub}")
                },
            }),
        }
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreUrl::File(path) => write!(f, "file://{}", path.display()),
            StoreUrl::Memory => f.write_str("memory://"),
            StoreUrl::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

/// An exclusive lock on a local data folder, held while the store is open.
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
}

impl StoreLock {
    fn acquire(folder: &Path) -> Result<StoreLock, StoreError> {
        let folder_error = |source| StoreError::Folder {
            path: folder.display().to_string(),
            source,
        };
        std::fs::create_dir_all(folder).map_err(folder_error)?;
        let path = folder.join("LOCK");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(folder_error)?;
        match file.try_lock() {
            Ok(()) => Ok(StoreLock { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Locked {
                path: folder.display().to_string(),
                lock: path.display().to_string(),
            }),
            Err(std::fs::TryLockError::Error(source)) => Err(folder_error(source)),
        }
    }
}

pub(super) struct Opened {
    pub db: Db,
    pub lock: Option<StoreLock>,
}

pub(super) async fn open_engine(
    settings: &StoreSettings,
    journaled: bool,
) -> Result<Opened, StoreError> {
    let (object_store, lock): (Arc<dyn ObjectStore>, _) =
        match (&settings.object_store, &settings.url) {
            (Some(provided), _) => (Arc::clone(provided), None),
            (None, StoreUrl::File(folder)) => {
                let lock = StoreLock::acquire(folder)?;
                let local = LocalFileSystem::new_with_prefix(folder)
                    .map_err(|e| StoreError::Folder {
                        path: folder.display().to_string(),
                        source: std::io::Error::other(e),
                    })?
                    .with_fsync(true);
                (Arc::new(local), Some(lock))
            }
            (None, StoreUrl::Memory) => (Arc::new(InMemory::new()), None),
            (None, StoreUrl::S3 { bucket, .. }) => (s3_client(bucket, &settings.s3)?, None),
        };
    let path = match &settings.url {
        StoreUrl::S3 { prefix, .. } if !prefix.is_empty() => format!("{prefix}/db"),
        _ => "db".to_owned(),
    };
    let remote = matches!(settings.url, StoreUrl::S3 { .. }) && settings.object_store.is_none();
    let mut engine_settings = engine_settings(settings, remote);
    if journaled {
        // Acks wait for the journal; the engine's log only has to catch up before a
        // journal file starts over, so it is flushed in larger, rarer files.
        let interval = settings.flush_interval.max(JOURNALED_LOG_FLUSH);
        engine_settings.flush_interval = Some(interval);
    }
    if lock.is_some() {
        engine_settings.garbage_collector_options = Some(local_collector(settings.local_gc));
    }
    // Keys of one subject share their prefix and messages are often text: LZ4 takes
    // their stored bytes down several times, and costs CPU mostly where payloads do
    // not compress (BENCHMARKS.md). SSTs name their codec, so stores written before
    // open as they are. The compaction worker must rewrite SSTs with the same codec.
    let codec = settings.compress.then_some(CompressionCodec::Lz4);
    engine_settings.compression_codec = codec;
    if let Some(worker) = engine_settings
        .compactor_options
        .as_mut()
        .and_then(|compactor| compactor.worker.as_mut())
    {
        worker.compression_codec = codec;
    }
    let db = Db::builder(path, object_store)
        .with_settings(engine_settings)
        .with_db_cache(cache(settings), 0)
        .build()
        .await?;
    Ok(Opened { db, lock })
}

/// The engine's log is flushed at most this often behind a journal.
const JOURNALED_LOG_FLUSH: std::time::Duration = std::time::Duration::from_millis(100);

/// L0 files before the engine stops writes until a compaction makes room (SlateDB: 8).
pub(super) const L0_MAX_SSTS: usize = 16;

/// The engine's sizes and timers, chosen for a sustained ingest on a small machine
/// (BENCHMARKS.md, "Sustained load"): every buffer that grows with the write rate is
/// capped, and compaction is found and started within 100 ms of being needed instead
/// of SlateDB's 5 s, which let L0 fill and stopped every write for seconds.
///
/// - Memtables of 8 MiB and at most 64 MiB waiting for upload (SlateDB: 64 MiB and
///   1 GiB): the memtable's keys, values and skiplist nodes were most of the memory.
/// - Room for 16 L0 files before writes wait for compaction (SlateDB: 8).
/// - Compactions write 32 MiB files, two at a time, one subcompaction each (SlateDB:
///   256 MiB, four, four): each running compaction holds its output file and its
///   inputs' read-ahead in memory.
/// - On a local folder a read-ahead of one 256 KiB block per input; object storage
///   keeps SlateDB's four 2 MiB fetches, which hide its latency, and polls the
///   manifest once a second, since every poll is a billed request.
fn engine_settings(settings: &StoreSettings, remote: bool) -> Settings {
    use std::time::Duration;
    let poll = if remote {
        Duration::from_secs(1)
    } else {
        Duration::from_millis(100)
    };
    let mut engine = Settings {
        flush_interval: Some(settings.flush_interval),
        l0_sst_size_bytes: 8 * 1024 * 1024,
        max_unflushed_bytes: 64 * 1024 * 1024,
        l0_max_ssts: L0_MAX_SSTS,
        l0_max_ssts_per_key: L0_MAX_SSTS,
        manifest_poll_interval: poll,
        ..Settings::default()
    };
    if let Some(compactor) = engine.compactor_options.as_mut() {
        compactor.poll_interval = poll;
        compactor.max_concurrent_compactions = 2;
        if let Some(worker) = compactor.worker.as_mut() {
            worker.compactions_poll_interval = poll;
            worker.max_sst_size = 32 * 1024 * 1024;
            worker.max_concurrent_compactions = 2;
            worker.max_subcompactions = 1;
            if !remote {
                worker.max_fetch_tasks = 1;
                worker.bytes_to_fetch = 256 * 1024;
            }
        }
    }
    engine
}

/// The engine's garbage collector on a local folder.
///
/// `LocalFileSystem` has no conditional overwrite, which the collector's boundary
/// files need (it logged `PutMode::Update not yet implemented` and deleted nothing),
/// and SlateDB says to turn them off for such stores. What they guard against, a
/// stalled second writer resuming after the collector's `min_age`, cannot happen
/// here: the folder's lock keeps every other process out for as long as this one
/// runs. So it runs soon and often for manifests and the WAL, whose old files from
/// earlier runs go within seconds instead of piling up at every restart.
fn local_collector(every: std::time::Duration) -> slatedb::config::GarbageCollectorOptions {
    use slatedb::config::{GarbageCollectorDirectoryOptions, GarbageCollectorOptions};
    let directory = Some(GarbageCollectorDirectoryOptions {
        interval: Some(every),
        min_age: every,
        dry_run: false,
    });
    // Compacted files keep the default age: a compaction's output is unreferenced
    // until it commits, and a long compaction must not lose it.
    GarbageCollectorOptions {
        manifest_options: directory,
        wal_options: directory,
        boundary_files_enabled: false,
        ..GarbageCollectorOptions::default()
    }
}

/// SST blocks and indexes kept in memory. Without them every seek (a head recovery,
/// a replay) would read and parse SST indexes from the object store again.
fn cache(settings: &StoreSettings) -> Arc<dyn slatedb::db_cache::DbCache> {
    use slatedb::db_cache::moka::{MokaCache, MokaCacheOptions};
    let moka = |bytes: u64| -> Option<Arc<dyn slatedb::db_cache::DbCache>> {
        Some(Arc::new(MokaCache::new_with_opts(MokaCacheOptions {
            max_capacity: bytes,
            time_to_live: None,
            time_to_idle: None,
        })))
    };
    Arc::new(
        slatedb::db_cache::SplitCache::new()
            .with_block_cache(moka(settings.block_cache_bytes))
            .with_meta_cache(moka(settings.meta_cache_bytes))
            .build(),
    )
}

/// The client of `bucket` (also the tables' on a store on S3).
pub fn s3_client(bucket: &str, s3: &S3Settings) -> Result<Arc<dyn ObjectStore>, StoreError> {
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        // A store must have one writer at a time: SlateDB's fencing needs conditional puts.
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .with_allow_http(s3.allow_http)
        .with_virtual_hosted_style_request(!s3.path_style);
    if let Some(endpoint) = &s3.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(region) = &s3.region {
        builder = builder.with_region(region);
    }
    if let Some(key) = &s3.access_key_id {
        builder = builder.with_access_key_id(key);
    }
    if let Some(secret) = &s3.secret_access_key {
        builder = builder.with_secret_access_key(secret);
    }
    let store = builder
        .build()
        .map_err(|e| StoreError::S3(format!("cannot set up the S3 client: {e}")))?;
    Ok(Arc::new(store))
}

/// Writes the format record into a new store, accepts an older or equal format, and
/// refuses a newer one or a store canopy did not write.
pub(super) async fn check_format(db: &Engine) -> Result<(), StoreError> {
    match db.get(keys::FORMAT_KEY).await? {
        Some(value) => {
            let found = <[u8; 8]>::try_from(&value[..])
                .map(u64::from_be_bytes)
                .map_err(|_| StoreError::Foreign)?;
            if found > FORMAT_VERSION {
                return Err(StoreError::NewerFormat {
                    found,
                    known: FORMAT_VERSION,
                });
            }
            // Format 1 values read as format 2 (each message a run of one): nothing
            // to migrate, but the record moves on, so a binary that cannot read runs
            // refuses the store instead of misreading it.
            if found < FORMAT_VERSION {
                super::put_durably(db, keys::FORMAT_KEY, FORMAT_VERSION.to_be_bytes()).await?;
                tracing::info!(from = found, to = FORMAT_VERSION, "store format upgraded");
            }
            Ok(())
        }
        None => {
            let mut any = db.scan(..).await?;
            if any.next().await?.is_some() {
                return Err(StoreError::Foreign);
            }
            super::put_durably(db, keys::FORMAT_KEY, FORMAT_VERSION.to_be_bytes()).await?;
            Ok(())
        }
    }
}
