//! The `[store]` section: where the store lives, its write and ack policy, and
//! retention, each with its defaults.
//!
//! Must never: open the store or check one section against another (that is
//! `Config::validate`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `file://PATH` or `memory://`.
    pub url: String,
    /// The engine's write-ahead log flush interval: the floor of durable ack latency
    /// without a journal (on S3); behind a journal, at least 100 ms and off the
    /// acks' path.
    pub flush_interval_ms: u64,
    /// On a `file://` folder, acks wait for the store's own journal (one preallocated
    /// file, one `fdatasync` per group of rounds) instead of the engine's log.
    pub journal: bool,
    /// MiB of each of the journal's two files; a round takes about an eighth at most.
    pub journal_mb: u64,
    /// How long msg ids are remembered for dedupe.
    pub dedupe_window_secs: u64,
    /// Compress the store's files with LZ4 (`lz4`, the default) or not (`none`).
    pub compression: Compression,
    /// On a `file://` folder: how often the engine's garbage collector removes old
    /// manifests and write-ahead log files, and how old they must be.
    pub local_gc_secs: u64,
    /// Most publishes per group commit.
    pub max_batch: usize,
    /// Publishes queued for the sequencer before publishers wait.
    pub queue_depth: usize,
    /// MiB of memory for cached data blocks of the store.
    pub block_cache_mb: u64,
    /// MiB of memory for cached indexes and filters of the store.
    pub meta_cache_mb: u64,
    /// First match decides whether and how a subject is stored.
    pub policies: Vec<StorePolicy>,
    pub retention: RetentionConfig,
    /// How to reach S3 for `s3://` URLs; unset fields come from the AWS environment.
    pub s3: crate::store::S3Settings,
    /// Where the key-encryption keys of sealed patterns are: `file:PATH` or
    /// `env:NAME` (`crate::sealing::provider`). Unset: sealing is refused.
    pub keys: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorePolicy {
    /// NATS-syntax pattern.
    pub pattern: String,
    /// False: matching subjects are live only.
    pub store: bool,
    pub durability: crate::store::Durability,
    pub ack: AckMode,
    /// Seconds a message is kept (0 = forever).
    pub max_age_secs: u64,
    /// Versions kept per subject (0 = all).
    pub max_versions: u64,
    /// Fold each subject into a snapshot every this many versions (0 = never).
    pub snapshot_every: u64,
    /// How events fold into a snapshot.
    pub reducer: crate::store::reduce::ReducerKind,
    /// Keep the events a server snapshot covers (true) or drop them.
    pub keep_history: bool,
}

impl StorePolicy {
    /// The server-side snapshots this policy asks for.
    pub fn compaction(&self) -> Option<crate::store::Compaction> {
        (self.snapshot_every > 0).then_some(crate::store::Compaction {
            every: self.snapshot_every,
            reducer: self.reducer,
            keep_history: self.keep_history,
        })
    }
}

/// When the store acknowledges a publish that has a reply subject.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckMode {
    /// Only when the publish asks with a Canopy-* or Nats-* header.
    #[default]
    OnRequest,
    /// Every publish with a reply subject (JetStream's behaviour).
    Always,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Bytes kept per tenant, oldest dropped first (0 = no limit).
    pub max_bytes_per_tenant: u64,
    /// Seconds between retention passes.
    pub interval_secs: u64,
}

impl Default for StorePolicy {
    fn default() -> Self {
        Self {
            pattern: ">".into(),
            store: true,
            durability: crate::store::Durability::Durable,
            ack: AckMode::OnRequest,
            max_age_secs: 7 * 24 * 3600,
            max_versions: 0,
            snapshot_every: 0,
            reducer: crate::store::reduce::ReducerKind::Last,
            keep_history: true,
        }
    }
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            max_bytes_per_tenant: 10 * 1024 * 1024 * 1024,
            interval_secs: 60,
        }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: "file://./canopy-data".into(),
            flush_interval_ms: 2,
            journal: true,
            journal_mb: 64,
            dedupe_window_secs: 120,
            local_gc_secs: 10,
            compression: Compression::Lz4,
            max_batch: 1024,
            queue_depth: 8192,
            block_cache_mb: 32,
            meta_cache_mb: 32,
            policies: vec![
                StorePolicy {
                    pattern: "_INBOX.>".into(),
                    store: false,
                    ..StorePolicy::default()
                },
                StorePolicy::default(),
            ],
            retention: RetentionConfig::default(),
            s3: crate::store::S3Settings::default(),
            keys: None,
        }
    }
}

/// How the store's files are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Every SST (write-ahead log, L0, compacted) in LZ4 blocks.
    #[default]
    Lz4,
    /// Stored as written.
    None,
}
