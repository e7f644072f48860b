//! A cluster node's side of the definitions every node sees (`cluster::definitions`):
//! as the owner of a tenant's shard, what it mirrors into etcd after a change (read
//! whole from the store, the definitions' first home); as any node, what it makes
//! of what etcd shows (the tenants' records, the user book logins read, the schema
//! bindings of tenants it does not own).
//!
//! Must never: write a definition to the store (the API does, on the owner), or let
//! what etcd shows replace the bindings of a tenant this node owns (those come from
//! its store).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::Broker;
use crate::cluster::{DefKey, Definition, DefinitionChange, DefinitionsHost};
use crate::store::{Store, StoreError, TenantRecord, UserRecord};
use crate::tenancy::{UserBook, Users};

/// Mirrorings of one shard's tenants run one at a time (each reads the store afresh,
/// so the last to run leaves the newest state); shards share a few locks.
static MIRRORING: [tokio::sync::Mutex<()>; 16] = [const { tokio::sync::Mutex::const_new(()) }; 16];

/// A tenant's newest binding versions by pattern: (version, stored record).
type SeenBindings = BTreeMap<String, (u64, Bytes)>;

/// What this node has seen of the definitions.
#[derive(Default)]
pub struct Seen {
    users: UserBook,
    /// Each tenant's newest binding versions by pattern: (version, stored record).
    schemas: Mutex<HashMap<String, SeenBindings>>,
}

/// One tenant's definitions, read.
#[derive(Default)]
struct TenantDefinitions {
    record: Option<TenantRecord>,
    users: Vec<UserRecord>,
    schemas: SeenBindings,
}

impl TenantDefinitions {
    /// Reads a tenant's definitions from etcd's values; what cannot be read is
    /// logged and left out.
    fn add(&mut self, key: &DefKey, value: &[u8]) {
        match key {
            DefKey::Tenant(_) => self.record = read_json(key, value),
            DefKey::User { .. } => self.users.extend(read_json(key, value)),
            DefKey::Schema { pattern, .. } => {
                if let Some(version) = read_schema(key, value) {
                    self.schemas.insert(pattern.clone(), version);
                }
            }
        }
    }
}

fn read_json<T: serde::de::DeserializeOwned>(key: &DefKey, value: &[u8]) -> Option<T> {
    serde_json::from_slice(value)
        .inspect_err(|error| tracing::warn!(?key, %error, "an unreadable definition is skipped"))
        .ok()
}

/// A binding's value: its version, a space, and its stored record.
fn read_schema(key: &DefKey, value: &[u8]) -> Option<(u64, Bytes)> {
    let space = value.iter().position(|b| *b == b' ');
    let version = space
        .and_then(|at| std::str::from_utf8(&value[..at]).ok())
        .and_then(|text| text.parse().ok());
    match (space, version) {
        (Some(at), Some(version)) => Some((version, Bytes::copy_from_slice(&value[at + 1..]))),
        _ => {
            tracing::warn!(?key, "an unreadable schema binding is skipped");
            None
        }
    }
}

fn schema_value(version: u64, record: &[u8]) -> Bytes {
    let mut value = format!("{version} ").into_bytes();
    value.extend_from_slice(record);
    Bytes::from(value)
}

/// What etcd should hold for `tenant`, as its shard's store has it: nothing for a
/// tenant without a usable record; its record, users and bindings in force otherwise.
async fn stored_definitions(
    store: &Store,
    tenant: &str,
) -> Result<BTreeMap<DefKey, Bytes>, StoreError> {
    let mut desired = BTreeMap::new();
    let Some(record) = store.tenant(tenant).await?.filter(|r| !r.deleting) else {
        return Ok(desired);
    };
    desired.insert(DefKey::Tenant(tenant.to_owned()), json_bytes(&record));
    for user in store.users(tenant).await? {
        let key = DefKey::User {
            tenant: tenant.to_owned(),
            name: user.name.clone(),
        };
        desired.insert(key, json_bytes(&user));
    }
    for version in store.newest_schemas(tenant).await? {
        let in_force = serde_json::from_slice::<crate::schemas::StoredVersion>(&version.record)
            .is_ok_and(|stored| stored.schema.is_some());
        if in_force {
            let key = DefKey::Schema {
                tenant: tenant.to_owned(),
                pattern: version.pattern,
            };
            desired.insert(key, schema_value(version.version, &version.record));
        }
    }
    Ok(desired)
}

/// A record's JSON (records always serialise).
fn json_bytes(record: &impl serde::Serialize) -> Bytes {
    serde_json::to_vec(record).unwrap_or_default().into()
}

impl Broker {
    /// Where a login reads users: the store on a server alone, the user book on a
    /// node of a cluster; `None` with neither.
    pub fn users(&self) -> Option<Users<'_>> {
        if self.mesh().is_some() {
            return Some(Users::Book(&self.seen.users));
        }
        self.store().map(|store| Users::Store(store))
    }

    /// Every tenant's users as this node saw them last (in a cluster).
    pub fn user_book(&self) -> &UserBook {
        &self.seen.users
    }

    /// After a change of `tenant`'s definitions in its store (or opening its shard):
    /// makes them what this node and, through etcd, every node sees. Does nothing on
    /// a server alone or where the tenant's shard is not open.
    pub async fn mirror_definitions(&self, tenant: &str) {
        let Some(mesh) = self.mesh() else {
            return;
        };
        let shard = mesh.shard_of(tenant);
        let Some((store, claim)) = mesh.open_store(shard) else {
            return;
        };
        let _turn = MIRRORING[shard as usize % MIRRORING.len()].lock().await;
        let desired = match stored_definitions(&store, tenant).await {
            Ok(desired) => desired,
            Err(error) => {
                tracing::warn!(tenant, %error, "could not read the tenant's definitions to mirror them");
                return;
            }
        };
        let mut read = TenantDefinitions::default();
        for (key, value) in &desired {
            read.add(key, value);
        }
        self.apply_tenant(tenant, read);
        let Some(definitions) = mesh.definitions() else {
            return;
        };
        match definitions.mirror(shard, claim, tenant, desired).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    tenant,
                    shard,
                    "the shard's claim is gone; its next owner mirrors the tenant"
                )
            }
            Err(error) => {
                tracing::warn!(tenant, %error, "could not mirror the tenant's definitions to etcd; its shard's next opening does")
            }
        }
    }

    /// Makes one tenant's definitions as read what this node sees.
    fn apply_tenant(&self, tenant: &str, read: TenantDefinitions) {
        let Some(record) = read.record else {
            self.seen_gone(tenant);
            return;
        };
        self.seen_record(record);
        self.seen.users.set_tenant(tenant, read.users);
        self.seen
            .schemas
            .lock()
            .insert(tenant.to_owned(), read.schemas);
        self.rebind(tenant);
    }

    fn seen_record(&self, record: TenantRecord) {
        if let Some(tenant) = self.tenants.read().get(record.name.as_str()) {
            tenant.quota.set_limits(&record.limits);
        }
        self.tenant_records.set(record);
    }

    /// A tenant no longer usable: forgotten, its connections here closed.
    fn seen_gone(&self, tenant: &str) {
        self.seen.users.set_tenant(tenant, Vec::new());
        self.seen.schemas.lock().remove(tenant);
        if self.tenant_records.get(tenant).is_some() {
            self.tenant_records.remove(tenant);
            self.close_tenant(tenant);
        }
    }

    fn owns(&self, tenant: &str) -> bool {
        self.mesh()
            .is_some_and(|mesh| matches!(mesh.home(tenant), super::mesh::Home::Here(_)))
    }

    /// Makes the bindings etcd shows current for a tenant this node does not own,
    /// reusing those whose version did not change.
    pub(super) fn rebind(&self, tenant: &str) {
        if self.owns(tenant) || self.tenant_records.get(tenant).is_none() {
            return;
        }
        let seen = self
            .seen
            .schemas
            .lock()
            .get(tenant)
            .cloned()
            .unwrap_or_default();
        let routes = self.tenant(tenant);
        let current = routes.schemas.current();
        let mut all = Vec::with_capacity(seen.len());
        for (pattern, (version, record)) in &seen {
            let same = current
                .get(pattern)
                .filter(|b| u64::from(b.version) == *version);
            if let Some(binding) = same {
                all.push(Arc::clone(binding));
                continue;
            }
            let compiled = serde_json::from_slice::<crate::schemas::StoredVersion>(record)
                .map_err(|e| e.to_string())
                .and_then(|stored| {
                    let version = u32::try_from(*version).map_err(|e| e.to_string())?;
                    crate::schemas::Binding::new(pattern, version, stored)
                        .map_err(|e| e.to_string())
                });
            match compiled {
                Ok(binding) => all.push(Arc::new(binding)),
                Err(error) => {
                    tracing::warn!(tenant, pattern, %error, "a schema binding another node holds cannot be used here")
                }
            }
        }
        routes.schemas.set(crate::schemas::Bindings::new(all));
    }
}

/// The broker as the host of the definitions a node sees.
pub struct SeenByBroker(pub Arc<Broker>);

impl DefinitionsHost for SeenByBroker {
    fn listed(&self, all: Vec<Definition>) {
        let broker = &self.0;
        let mut by_tenant: BTreeMap<String, TenantDefinitions> = BTreeMap::new();
        for definition in &all {
            by_tenant
                .entry(definition.key.tenant().to_owned())
                .or_default()
                .add(&definition.key, &definition.value);
        }
        // A tenant this node owns is the store's to say gone, not a listing's that
        // may predate its creation.
        for record in broker.tenant_records.list() {
            if !by_tenant.contains_key(&record.name) && !broker.owns(&record.name) {
                broker.seen_gone(&record.name);
            }
        }
        for (tenant, read) in by_tenant {
            broker.apply_tenant(&tenant, read);
        }
    }

    fn changed(&self, change: DefinitionChange) {
        let broker = &self.0;
        match change {
            DefinitionChange::Put(Definition { key, value }) => match &key {
                DefKey::Tenant(_) => {
                    if let Some(record) = read_json::<TenantRecord>(&key, &value) {
                        let name = record.name.clone();
                        broker.seen_record(record);
                        broker.rebind(&name);
                    }
                }
                DefKey::User { tenant, .. } => {
                    if let Some(user) = read_json::<UserRecord>(&key, &value) {
                        broker.seen.users.set(tenant, user);
                    }
                }
                DefKey::Schema { tenant, pattern } => {
                    if let Some(version) = read_schema(&key, &value) {
                        let mut schemas = broker.seen.schemas.lock();
                        let of_tenant = schemas.entry(tenant.clone()).or_default();
                        of_tenant.insert(pattern.clone(), version);
                    }
                    broker.rebind(tenant);
                }
            },
            DefinitionChange::Deleted(key) => match &key {
                DefKey::Tenant(tenant) if !broker.owns(tenant) => broker.seen_gone(tenant),
                DefKey::Tenant(_) => {}
                DefKey::User { tenant, name } => broker.seen.users.remove(tenant, name),
                DefKey::Schema { tenant, pattern } => {
                    if let Some(of_tenant) = broker.seen.schemas.lock().get_mut(tenant) {
                        of_tenant.remove(pattern);
                    }
                    broker.rebind(tenant);
                }
            },
        }
    }
}
