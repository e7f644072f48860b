//! Claiming, keeping and handing over shards: one task per node, driven by its view
//! of the cluster (a listing of etcd, then a watch) and by its lease.
//!
//! After every change the task reconciles: shards whose claim is no longer its own
//! are closed as lost; below its fair share it claims free shards it prefers; above
//! it, once no shard is free (so a node below its share is waiting), it hands the
//! least preferred over. A shard left free for a whole lease lifetime is claimed by
//! whoever sees it, share or not, so a node that cannot open shards never strands one.
//!
//! Must never: hold a shard without a live lease, or give a claim back before its
//! shard is closed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::etcd::{Created, Etcd, Event};
use super::lease::Lease;
use super::share::{by_preference, fair_share};
use super::{Closing, Keys, Owner, OwnerRecord, ShardHost, View};

pub(super) struct Ownership {
    pub etcd: Etcd,
    pub keys: Keys,
    pub me: String,
    pub shards: u32,
    /// How long a shard may stay free before anyone claims it.
    pub free_grace: Duration,
    pub host: Arc<dyn ShardHost>,
    pub lease: watch::Receiver<Lease>,
    pub view: Arc<watch::Sender<View>>,
    /// The shards this node serves, by the revision of its claim.
    pub held: BTreeMap<u32, i64>,
    /// Since when each free shard has been seen free.
    pub free_since: BTreeMap<u32, Instant>,
    pub stop: CancellationToken,
}

impl Ownership {
    pub async fn run(mut self) {
        let watcher = tokio::spawn(keep_view(
            self.etcd.clone(),
            self.keys.clone(),
            Arc::clone(&self.view),
            self.stop.clone(),
        ));
        let mut changes = self.view.subscribe();
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            self.reconcile().await;
            tokio::select! {
                biased;
                () = self.stop.cancelled() => break,
                changed = self.lease.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                _ = changes.changed() => {}
                _ = tick.tick() => {}
            }
        }
        self.hand_over_all().await;
        watcher.abort();
    }

    async fn reconcile(&mut self) {
        let lease = *self.lease.borrow();
        if !lease.is_live() {
            self.drop_all(Closing::Lost).await;
            return;
        }
        let mut view = self.view.borrow().clone();
        // A claim that is no longer this node's: its lease ended, or someone took
        // the shard after it expired.
        let lost: Vec<u32> = self
            .held
            .iter()
            .filter(|&(shard, claim)| match view.owners.get(shard) {
                Some(owner) => owner.node != self.me || owner.claim != *claim,
                // A view listed before the claim was made does not show it yet.
                None => view.revision >= *claim,
            })
            .map(|(&shard, _)| shard)
            .collect();
        for shard in lost {
            tracing::error!(node = %self.me, shard, claim = self.held.get(&shard).copied().unwrap_or(0), now = ?view.owners.get(&shard), "this node's claim on the shard is gone: dropping it");
            self.held.remove(&shard);
            self.host.close(shard, Closing::Lost).await;
        }
        // A claim of this node's that it does not serve (it could not tell its
        // claim had gone through, or dropped it on a view that was behind): give it
        // back, so the shard is free for whoever should have it.
        let orphans: Vec<(u32, i64)> = view
            .owners
            .iter()
            .filter(|&(shard, o)| o.node == self.me && !self.held.contains_key(shard))
            .map(|(&shard, o)| (shard, o.claim))
            .collect();
        for (shard, claim) in orphans {
            self.give_back(shard, claim).await;
        }
        view = self.view.borrow().clone();
        if !view.nodes.contains_key(&self.me) {
            return;
        }
        let now = Instant::now();
        self.free_since
            .retain(|shard, _| !view.owners.contains_key(shard));
        for shard in view.free() {
            self.free_since.entry(shard).or_insert(now);
        }
        let share = fair_share(self.shards, view.nodes.keys().map(String::as_str), &self.me);
        let held = self.held.len() as u32;
        // Every claim first, then the openings: the shards have an owner at once
        // (what a starting node waits for before letting clients in, and what the
        // other nodes forward to), and what comes for them meanwhile waits for their
        // stores rather than finding no owner.
        let mut claimed = Vec::new();
        if held < share {
            let wanted = by_preference(&self.me, view.free());
            for shard in wanted.into_iter().take((share - held) as usize) {
                claimed.extend(self.claim(shard, lease.id).await);
            }
        } else if held > share && view.free().next().is_none() {
            let mut least_wanted = by_preference(&self.me, self.held.keys().copied());
            least_wanted.reverse();
            for shard in least_wanted.into_iter().take((held - share) as usize) {
                self.hand_over(shard).await;
            }
        }
        let stranded: Vec<u32> = self
            .free_since
            .iter()
            .filter(|&(_, since)| now.duration_since(*since) >= self.free_grace)
            .map(|(&shard, _)| shard)
            .collect();
        for shard in stranded {
            self.free_since.remove(&shard);
            claimed.extend(self.claim(shard, lease.id).await);
        }
        let first = self.host.first();
        claimed.sort_by_key(|(shard, _)| Some(*shard) != first);
        for (shard, claim) in claimed {
            self.open(shard, claim).await;
        }
    }

    /// Claims `shard` under `lease`: its claim's revision, when this node won it.
    async fn claim(&mut self, shard: u32, lease: i64) -> Option<(u32, i64)> {
        let record = OwnerRecord {
            node: self.me.clone(),
            since_ms: crate::clock::system_ms(),
        };
        let value = serde_json::to_vec(&record).unwrap_or_default();
        let key = self.keys.owner(shard);
        let claim = match self.etcd.create(&key, &value, lease).await {
            Ok(Created::Yes { revision }) => revision,
            Ok(Created::Taken(_)) => return None,
            Err(e) => {
                tracing::warn!(shard, error = %e, "claiming a shard failed");
                return None;
            }
        };
        self.view.send_modify(|view| {
            view.owners.insert(
                shard,
                Owner {
                    node: record.node.clone(),
                    since_ms: record.since_ms,
                    claim,
                    lease,
                },
            );
        });
        self.free_since.remove(&shard);
        Some((shard, claim))
    }

    /// Opens a shard this node claimed; gives the claim back when it cannot.
    async fn open(&mut self, shard: u32, claim: i64) {
        let opening = Instant::now();
        match self.host.open(shard, claim).await {
            Ok(()) => {
                self.held.insert(shard, claim);
                tracing::info!(
                    shard,
                    opened_in_ms = opening.elapsed().as_millis() as u64,
                    "serving shard"
                );
            }
            Err(reason) => {
                tracing::error!(shard, %reason, "could not open a claimed shard: giving it back");
                self.give_back(shard, claim).await;
            }
        }
    }

    /// Closes `shard` with everything flushed, then gives its claim back.
    async fn hand_over(&mut self, shard: u32) {
        let Some(claim) = self.held.remove(&shard) else {
            return;
        };
        self.host.close(shard, Closing::Handover).await;
        self.give_back(shard, claim).await;
        tracing::info!(shard, "handed the shard over");
    }

    async fn give_back(&mut self, shard: u32, claim: i64) {
        if let Err(e) = self
            .etcd
            .delete_if_created_at(&self.keys.owner(shard), claim)
            .await
        {
            // The claim dies with the lease at the latest.
            tracing::warn!(shard, error = %e, "could not give a claim back");
        }
        self.view.send_if_modified(|view| {
            if view.owners.get(&shard).is_some_and(|o| o.claim == claim) {
                view.owners.remove(&shard);
                return true;
            }
            false
        });
    }

    async fn hand_over_all(&mut self) {
        let shards: Vec<u32> = self.held.keys().copied().collect();
        for shard in shards {
            self.hand_over(shard).await;
        }
    }

    async fn drop_all(&mut self, how: Closing) {
        while let Some((shard, _)) = self.held.pop_first() {
            self.host.close(shard, how).await;
        }
    }
}

/// Keeps `view` as etcd holds the cluster: a listing, then a watch from its
/// revision, listed again whenever the watch breaks. Runs apart from the ownership
/// task, so the view stays current while shards are being opened.
async fn keep_view(
    etcd: Etcd,
    keys: Keys,
    view: Arc<watch::Sender<View>>,
    stop: CancellationToken,
) {
    let listed = |kvs: Vec<super::etcd::KeyValue>, revision| match keys.view_of(&kvs) {
        Ok(mut listed) => {
            listed.revision = revision;
            view.send_replace(listed);
            true
        }
        Err(e) => {
            tracing::error!(error = %e, "the cluster's keys cannot be read");
            false
        }
    };
    let changed = |events: &[Event]| apply(&keys, &view, events);
    etcd.follow(keys.root(), &stop, listed, changed).await;
}

/// Applies `events` to the view; wakes its watchers only when membership or
/// ownership changed (offsets and definitions come every few seconds and decide
/// nothing here).
fn apply(keys: &Keys, view: &watch::Sender<View>, events: &[Event]) {
    view.send_if_modified(|view| {
        let mut decisive = false;
        for event in events {
            let key = match event {
                Event::Put(kv) => &kv.key,
                Event::Delete { key, .. } => key,
            };
            decisive = decisive || keys.is_decisive(key);
            match event {
                Event::Put(kv) => {
                    view.revision = view.revision.max(kv.mod_revision);
                    if let Err(e) = keys.apply_put(view, kv) {
                        tracing::warn!(error = %e, "ignored an unreadable key");
                    }
                }
                Event::Delete { key, mod_revision } => {
                    view.revision = view.revision.max(*mod_revision);
                    keys.apply_delete(view, key, *mod_revision)
                }
            }
        }
        decisive
    });
}
