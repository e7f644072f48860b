//! Definitions every node sees: tenant records, users and schema bindings, mirrored
//! into etcd (`/<cluster>/defs/<tenant>/…`) by the owner of the tenant's shard and
//! watched by every node.
//!
//! The store stays where a definition is kept and first written (so a lost etcd
//! loses nothing: the next opening of a shard writes its tenants' definitions
//! again); etcd carries a copy to every node within a watch's delay, which is what a
//! login, a tenant's limits or a schema check on a node that does not own the tenant
//! reads. Every write is guarded by the writer's claim on the shard, so a node whose
//! claim is gone writes nothing, and a tenant's copy is always made whole from what
//! the store holds (never patched by one change), so two mirrorings in either order
//! leave the newer state.
//!
//! Must never: hold a password or a token's secret (user records hold hashes only),
//! or decide what a definition means (its bytes are the store's, read by the layers
//! above).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::etcd::{Etcd, Event, KeyValue};
use super::{ClusterError, Keys};
use crate::config::ClusterConfig;

/// Which definition a key holds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DefKey {
    /// The tenant's record (its limits and anonymous rules).
    Tenant(String),
    User {
        tenant: String,
        name: String,
    },
    /// The newest version of a binding: its value is the version, a space, and the
    /// stored record.
    Schema {
        tenant: String,
        pattern: String,
    },
}

impl DefKey {
    pub fn tenant(&self) -> &str {
        match self {
            DefKey::Tenant(tenant)
            | DefKey::User { tenant, .. }
            | DefKey::Schema { tenant, .. } => tenant,
        }
    }

    /// The key's place under the definitions' root.
    fn path(&self) -> String {
        match self {
            DefKey::Tenant(tenant) => format!("{tenant}/tenant"),
            DefKey::User { tenant, name } => format!("{tenant}/users/{name}"),
            DefKey::Schema { tenant, pattern } => format!("{tenant}/schemas/{pattern}"),
        }
    }

    /// The key a path under the definitions' root names; `None` for none of ours.
    fn parse(path: &str) -> Option<Self> {
        let (tenant, rest) = path.split_once('/')?;
        let tenant = tenant.to_owned();
        if rest == "tenant" {
            return Some(DefKey::Tenant(tenant));
        }
        if let Some(name) = rest.strip_prefix("users/") {
            return Some(DefKey::User {
                tenant,
                name: name.to_owned(),
            });
        }
        let pattern = rest.strip_prefix("schemas/")?;
        Some(DefKey::Schema {
            tenant,
            pattern: pattern.to_owned(),
        })
    }
}

/// One definition as etcd holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    pub key: DefKey,
    pub value: Bytes,
}

/// A change the watch saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefinitionChange {
    Put(Definition),
    Deleted(DefKey),
}

/// What a node does with the definitions it sees.
pub trait DefinitionsHost: Send + Sync + 'static {
    /// Everything etcd holds now: what the node had and this does not name is gone.
    fn listed(&self, all: Vec<Definition>);
    /// One change, in etcd's order.
    fn changed(&self, change: DefinitionChange);
}

/// The cluster's definitions in etcd: mirrored by owners, watched by every node.
#[derive(Clone)]
pub struct Definitions {
    etcd: Etcd,
    keys: Keys,
}

impl Definitions {
    pub fn new(config: &ClusterConfig) -> Result<Self, ClusterError> {
        Ok(Self {
            etcd: Etcd::new(&config.etcd, super::request_timeout(config.lease_secs))?,
            keys: Keys::new(&config.name),
        })
    }

    fn root(&self) -> String {
        format!("{}defs/", self.keys.root())
    }

    /// Makes etcd hold exactly `desired` for `tenant`, written as the owner of `shard`
    /// by its claim at revision `claim`. False when the claim is gone (nothing more
    /// is written; the next owner mirrors the tenant again).
    pub async fn mirror(
        &self,
        shard: u32,
        claim: i64,
        tenant: &str,
        desired: BTreeMap<DefKey, Bytes>,
    ) -> Result<bool, ClusterError> {
        let root = self.root();
        let guard = self.keys.owner(shard);
        let (held, _) = self.etcd.list(&format!("{root}{tenant}/")).await?;
        let mut held: BTreeMap<DefKey, Bytes> = held
            .into_iter()
            .filter_map(|kv| {
                let key = DefKey::parse(kv.key.strip_prefix(&root)?)?;
                Some((key, Bytes::from(kv.value)))
            })
            .collect();
        for (key, value) in &desired {
            if held.remove(key).as_ref() == Some(value) {
                continue;
            }
            let path = format!("{root}{}", key.path());
            if !self.etcd.put_guarded(&path, value, &guard, claim).await? {
                return Ok(false);
            }
        }
        for key in held.keys() {
            let path = format!("{root}{}", key.path());
            if !self.etcd.delete_guarded(&path, &guard, claim).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Keeps `host` told of every definition until `stop`: a listing, then a watch
    /// from its revision, listed again whenever the watch breaks.
    pub fn watch(
        &self,
        host: Arc<dyn DefinitionsHost>,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let definitions = self.clone();
        tokio::spawn(async move { definitions.keep(host, stop).await })
    }

    async fn keep(&self, host: Arc<dyn DefinitionsHost>, stop: CancellationToken) {
        let root = self.root();
        let listed = |kvs: Vec<KeyValue>, _| {
            host.listed(kvs.iter().filter_map(|kv| definition(&root, kv)).collect());
            true
        };
        let changed = |events: &[Event]| {
            for event in events {
                let change = match event {
                    Event::Put(kv) => definition(&root, kv).map(DefinitionChange::Put),
                    Event::Delete { key, .. } => key
                        .strip_prefix(&root)
                        .and_then(DefKey::parse)
                        .map(DefinitionChange::Deleted),
                };
                if let Some(change) = change {
                    host.changed(change);
                }
            }
        };
        self.etcd.follow(&root, &stop, listed, changed).await;
    }
}

fn definition(root: &str, kv: &KeyValue) -> Option<Definition> {
    let key = DefKey::parse(kv.key.strip_prefix(root)?)?;
    Some(Definition {
        key,
        value: Bytes::copy_from_slice(&kv.value),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_reads_back_as_it_was_written() {
        let keys = [
            DefKey::Tenant("acme".into()),
            DefKey::User {
                tenant: "acme".into(),
                name: "ana".into(),
            },
            DefKey::Schema {
                tenant: "acme".into(),
                pattern: "orders.*.eu/west".into(),
            },
        ];
        for key in keys {
            assert_eq!(DefKey::parse(&key.path()), Some(key));
        }
    }

    #[test]
    fn paths_of_nothing_of_ours_are_not_keys() {
        assert_eq!(DefKey::parse("acme"), None);
        assert_eq!(DefKey::parse("acme/other"), None);
        assert_eq!(DefKey::parse("acme/groups/g"), None);
    }
}
