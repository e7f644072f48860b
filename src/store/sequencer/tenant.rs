//! What the sequencer keeps per tenant (next offset, usage, subject heads, recent msg
//! ids) and how each is read back from the store when memory does not hold it.
//!
//! Must never: write to the store; only the sequencer's round changes what these hold.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use slatedb::IterationOrder;
use slatedb::config::ScanOptions;

use crate::store::Engine;
use crate::store::record::{self, MsgIdEntry};
use crate::store::runs::{self, Seen};
use crate::store::{StoreError, StoredUsage, keys};

use super::MSG_ID_CACHE;

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Head {
    pub(super) version: u64,
    /// Offset of the subject's last message (0 = none).
    pub(super) offset: u64,
    /// The last round that put its messages on a run a later round may extend while
    /// neither is in the engine (`store/unflushed.rs`); 0 when none did since the
    /// head was read. A version limit's drop reads the subject's runs only once
    /// that round is applied, so it decides on the runs as they will be.
    pub(super) run_round: u64,
}

#[derive(Default)]
pub(super) struct TenantState {
    /// The next offset to give; `None` until read from the store.
    pub(super) next_offset: Option<u64>,
    /// How many subjects and message bytes the tenant has; read with `next_offset`.
    pub(super) usage: StoredUsage,
    /// The usage changed this round: its key is written with the round.
    pub(super) usage_changed: bool,
    pub(super) heads: super::SeededMap<Box<str>, Head>,
    pub(super) msg_ids: MsgIds,
}

/// Recently stored msg ids, expiring by age and bounded by count.
#[derive(Default)]
pub(super) struct MsgIds {
    pub(super) entries: HashMap<Box<str>, MsgIdEntry>,
    pub(super) order: VecDeque<Box<str>>,
}

impl MsgIds {
    pub(super) fn expire(&mut self, now: u64, window_ms: u64) {
        while let Some(oldest) = self.order.front() {
            let stale = self
                .entries
                .get(oldest)
                .is_none_or(|e| e.time_ms.saturating_add(window_ms) < now);
            if !stale && self.order.len() <= MSG_ID_CACHE {
                break;
            }
            if let Some(id) = self.order.pop_front() {
                self.entries.remove(&id);
            }
        }
    }

    pub(super) fn insert(&mut self, id: Box<str>, entry: MsgIdEntry) {
        if self.entries.insert(id.clone(), entry).is_none() {
            self.order.push_back(id);
        }
    }
}

/// The offset after the last one the tenant's newest batch used (1 for a new tenant),
/// or the floor retention left when it deleted the newest batches.
pub(in crate::store) async fn load_next_offset(
    db: &Engine,
    tenant: &str,
) -> Result<u64, StoreError> {
    let options = ScanOptions::default().with_order(IterationOrder::Descending);
    let mut newest = db
        .scan_with_options(keys::batch_range(tenant, 0), &options)
        .await?;
    let from_batches = match newest.next().await? {
        Some(kv) => {
            let first = keys::batch_offset(&kv.key).unwrap_or(0);
            let count = record::decode_batch(kv.value).map_or(0, |b| b.messages.len() as u64);
            first + count
        }
        None => 1,
    };
    let floor = db
        .get(keys::offset_floor(tenant))
        .await?
        .and_then(|v| <[u8; 8]>::try_from(&v[..]).ok())
        .map_or(0, u64::from_be_bytes);
    Ok(from_batches.max(floor).max(1))
}

/// The usage key's value: subjects, then bytes, big-endian.
pub(super) fn encode_usage(usage: StoredUsage) -> Bytes {
    let mut value = [0u8; 16];
    value[..8].copy_from_slice(&usage.subjects.to_be_bytes());
    value[8..].copy_from_slice(&usage.bytes.to_be_bytes());
    Bytes::copy_from_slice(&value)
}

/// What the tenant keeps: its usage key, or what is missing from it in a store
/// written before it (the subjects by counting markers, the bytes by summing the
/// batch index), found once.
pub(in crate::store) async fn load_usage(
    db: &Engine,
    tenant: &str,
) -> Result<StoredUsage, StoreError> {
    let value = db.get(keys::tenant_usage(tenant)).await?;
    let word = |at: usize| {
        value
            .as_ref()
            .and_then(|v| v.get(at..at + 8))
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map(u64::from_be_bytes)
    };
    let subjects = match word(0) {
        Some(subjects) => subjects,
        None => {
            let mut markers = db
                .scan(keys::subject_marker_range(tenant, "", None))
                .await?;
            let mut count = 0;
            while markers.next().await?.is_some() {
                count += 1;
            }
            count
        }
    };
    let bytes = match word(8) {
        Some(bytes) => bytes,
        None => {
            let mut batches = db.scan(keys::batch_range(tenant, 0)).await?;
            let mut bytes = 0;
            while let Some(kv) = batches.next().await? {
                if let Some(batch) = record::decode_batch(kv.value) {
                    bytes += super::retention::live_bytes(&batch);
                }
            }
            bytes
        }
    };
    Ok(StoredUsage { subjects, bytes })
}

/// A subject's head. A subject that never existed has no marker: one point lookup,
/// which the engine's bloom filters answer without reading data, so publishing to
/// new subjects stays cheap however much is stored. An existing subject's head is one
/// reverse seek of its message range; when the range is empty (purged or expired) the
/// marker says how far versions went.
pub(super) async fn load_head(
    db: &Engine,
    tenant: &str,
    subject: &str,
) -> Result<Head, StoreError> {
    let Some(marker) = db.get(keys::subject_marker(tenant, subject)).await? else {
        return Ok(Head::default());
    };
    if let Some((version, newest)) = runs::newest(db, tenant, subject, Seen::Written).await? {
        return Ok(Head {
            version,
            offset: newest.offset,
            run_round: 0,
        });
    }
    let (version, offset) = record::decode_marker(marker).unwrap_or((0, 0));
    Ok(Head {
        version,
        offset,
        run_round: 0,
    })
}
