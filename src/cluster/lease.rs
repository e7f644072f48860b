//! The node's lease: granted, its record put under it, renewed a few times per
//! lifetime, and when it is lost, a new one taken.
//!
//! The lease counts as lost as soon as a renewal says it is gone, or when no renewal
//! has been confirmed for a whole lifetime since the last confirmed one was sent: by
//! then etcd may have expired it and another node may own the shards. A node stalled
//! past that point learns it on waking, at the next tick.
//!
//! Must never: report a lease live that has not been confirmed within its lifetime.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::etcd::{Created, Etcd};

/// The lease the node holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lease {
    /// 0: none.
    pub id: i64,
    /// Past this instant the lease may have expired in etcd.
    pub valid_until: Option<Instant>,
}

impl Lease {
    pub const NONE: Lease = Lease {
        id: 0,
        valid_until: None,
    };

    pub fn is_live(&self) -> bool {
        self.id != 0 && self.valid_until.is_some_and(|t| Instant::now() < t)
    }
}

pub(super) struct LeaseKeeper {
    pub etcd: Etcd,
    /// The node's record's key, and the record.
    pub key: String,
    pub record: Vec<u8>,
    pub ttl: Duration,
    pub current: watch::Sender<Lease>,
    pub stop: CancellationToken,
}

impl LeaseKeeper {
    pub async fn run(self) {
        let mut lease = Lease::NONE;
        loop {
            if lease.id == 0 {
                match self.take().await {
                    Some(taken) => {
                        lease = taken;
                        self.current.send_replace(lease);
                    }
                    None if self.stop.is_cancelled() => return,
                    None => {}
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.ttl / 3) => {}
                () = self.stop.cancelled() => {
                    // The ownership task has handed every shard over by now (the
                    // node's leaving waits for it): the record can go.
                    if lease.id != 0 && let Err(e) = self.etcd.revoke(lease.id).await {
                        tracing::warn!(error = %e, "could not end this node's lease; it expires by itself");
                    }
                    self.current.send_replace(Lease::NONE);
                    return;
                }
            }
            if lease.id == 0 {
                continue;
            }
            let sent = Instant::now();
            match self.etcd.keep_alive(lease.id).await {
                Ok(Some(_)) => {
                    lease.valid_until = Some(sent + self.ttl);
                    self.current.send_replace(lease);
                }
                Ok(None) => {
                    tracing::error!(
                        lease = lease.id,
                        "this node's lease expired: its shards are dropped"
                    );
                    lease = Lease::NONE;
                    self.current.send_replace(lease);
                }
                Err(e) if !lease.is_live() => {
                    tracing::error!(error = %e, "this node's lease could not be renewed within its lifetime: its shards are dropped");
                    lease = Lease::NONE;
                    self.current.send_replace(lease);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "renewing this node's lease failed; trying again")
                }
            }
        }
    }

    /// A new lease with the node's record under it; `None` after a failure, to be
    /// tried again a tick later.
    async fn take(&self) -> Option<Lease> {
        let sent = Instant::now();
        let id = match self.etcd.grant(self.ttl.as_secs()).await {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(error = %e, "could not get a lease from etcd; trying again");
                return None;
            }
        };
        match self.etcd.create(&self.key, &self.record, id).await {
            Ok(Created::Yes { .. }) => Some(Lease {
                id,
                valid_until: Some(sent + self.ttl),
            }),
            Ok(Created::Taken(_)) => {
                // A node of this id is alive, or this node's previous life's lease has
                // not expired yet: its shards are still its until then.
                tracing::warn!(key = %self.key, "a node with this id holds a live lease; waiting for it to end");
                let _ = self.etcd.revoke(id).await;
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not record this node in etcd; trying again");
                let _ = self.etcd.revoke(id).await;
                None
            }
        }
    }
}
