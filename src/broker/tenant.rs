//! A tenant as one object: everything that is one tenant's and lives in memory (its
//! route trie, live quotas, inbox claims, schema bindings, declared streams, the
//! followers of its log, its running consumer groups and the locks over its
//! definition changes), opened from the store, served, and closed as a whole. This is
//! the unit a node owns, and will fence and hand over when several nodes share one
//! object store. What is a tenant's in the store (messages, retained messages, saved
//! MQTT sessions, records) stays under its key prefix there.
//!
//! Must never: route a message, or keep a closed tenant reachable (a tenant made again
//! under the same name starts with a new object).

use std::sync::Arc;

use canopy_subjects::SharedTrie;

use super::{Broker, InboxClaims, Subscription};
use crate::store::StoreError;

/// One tenant's live state on this node.
pub struct Tenant {
    pub name: Arc<str>,
    pub(super) trie: SharedTrie<Arc<Subscription>>,
    /// The tenant's live quotas, shared by its connections.
    pub quota: Arc<crate::tenancy::quota::Quota>,
    /// Cancelled when the tenant is closed: its connections close.
    pub deleted: tokio_util::sync::CancellationToken,
    /// Which connection holds each reply inbox.
    pub inboxes: InboxClaims,
    /// The tenant's schema bindings, which its publishes are checked against.
    pub schemas: Arc<crate::schemas::TenantSchemas>,
    /// The tenant's plugins, which its publishes go through.
    pub plugins: Arc<crate::plugins::TenantPlugins>,
    /// The tenant's declared JetStream streams, which name its subjects in PubAcks.
    pub streams: Arc<crate::streams::TenantStreams>,
    /// The followers of the tenant's log (groups, tables, follows), offered each
    /// stored message as the sequencer routes it.
    pub taps: Arc<crate::follow::Taps>,
    /// The tenant's running consumer groups.
    pub groups: super::groups::TenantGroups,
    /// The tenant's running JetStream push consumers: ordered ones (KV watches), and
    /// the pumps of those with acks.
    pub pushes: super::push::TenantPushes,
    /// Serialises the tenant's group creates and deletes (JetStream's too).
    pub group_changes: tokio::sync::Mutex<()>,
    /// Serialises the tenant's schema puts and deletes.
    pub schema_changes: tokio::sync::Mutex<()>,
    /// Serialises the tenant's plugin puts and deletes.
    pub plugin_changes: tokio::sync::Mutex<()>,
    /// Serialises the tenant's stream creates, updates and deletes.
    pub stream_changes: tokio::sync::Mutex<()>,
    /// In a cluster: the other nodes' interest, each node the value of its patterns.
    pub remote: SharedTrie<super::mesh::RemoteNode>,
    /// In a cluster: how many subscriptions here make each interest (pattern as
    /// [`super::mesh::interest_text`], queue), so the others hear of its first and last.
    pub(super) interest: parking_lot::Mutex<std::collections::HashMap<super::mesh::Interest, u32>>,
}

impl Tenant {
    pub fn subscription_count(&self) -> usize {
        self.trie.len()
    }

    /// Whether `subject` is under an inbox connection `conn` holds.
    pub fn holds_inbox_of(&self, subject: &str, conn: u64) -> bool {
        super::inbox_owner(subject).is_some_and(|token| self.inboxes.holds(token, conn))
    }

    /// The stream `subject` is in: the declared stream holding it, or the tenant's own.
    pub fn stream_of(&self, subject: &str) -> Arc<str> {
        self.streams
            .for_subject(subject)
            .map_or_else(|| Arc::clone(&self.name), |stream| Arc::clone(&stream.name))
    }
}

pub(super) fn stored_limits(limits: &crate::store::TenantLimits) -> crate::store::StoredLimits {
    crate::store::StoredLimits {
        max_subjects: limits.max_subjects,
        max_bytes: limits.max_stored_bytes,
        max_age_ms: limits.max_age_secs.map(|s| s.saturating_mul(1000)),
    }
}

impl Broker {
    /// The tenant called `tenant`, made (empty) on first use. Connections look this up
    /// once and keep it.
    pub fn tenant(&self, tenant: &str) -> Arc<Tenant> {
        if let Some(found) = self.tenants.read().get(tenant) {
            return Arc::clone(found);
        }
        let record = self.tenant_records.get(tenant);
        let mut tenants = self.tenants.write();
        let found = tenants.entry(Arc::from(tenant)).or_insert_with(|| {
            let schemas: Arc<crate::schemas::TenantSchemas> = Arc::default();
            Arc::new(Tenant {
                name: Arc::from(tenant),
                trie: SharedTrie::new(),
                quota: Arc::new(crate::tenancy::quota::Quota::new(
                    tenant,
                    record.as_deref().map(|r| &r.limits),
                    self.tenant_defaults,
                )),
                deleted: tokio_util::sync::CancellationToken::new(),
                inboxes: InboxClaims::default(),
                plugins: Arc::new(crate::plugins::TenantPlugins::reading(Arc::clone(&schemas))),
                schemas,
                streams: Arc::default(),
                taps: Arc::default(),
                groups: super::groups::TenantGroups::default(),
                pushes: super::push::TenantPushes::default(),
                group_changes: tokio::sync::Mutex::new(()),
                schema_changes: tokio::sync::Mutex::new(()),
                plugin_changes: tokio::sync::Mutex::new(()),
                stream_changes: tokio::sync::Mutex::new(()),
                remote: SharedTrie::new(),
                interest: parking_lot::Mutex::default(),
            })
        });
        Arc::clone(found)
    }

    /// The tenant a connection of `principal` joins. A login that raced its tenant's
    /// deletion (the record checked before it went, the object taken after it was
    /// closed) would hold an object nobody closes: checked again after the object
    /// is taken, such a tenant is closed at once, and the connection with it.
    pub fn tenant_for(&self, principal: &crate::tenancy::Principal) -> Arc<Tenant> {
        let tenant = self.tenant(&principal.tenant);
        if principal.acl.is_some() && self.tenant_records.get(&principal.tenant).is_none() {
            self.close_tenant(&principal.tenant);
            tenant.deleted.cancel();
        }
        tenant
    }

    /// The tenant called `name`, if this node has it open (never made here).
    pub fn open_tenant_named(&self, name: &str) -> Option<Arc<Tenant>> {
        self.tenants.read().get(name).cloned()
    }

    /// Every tenant this node has open.
    pub fn tenants(&self) -> Vec<Arc<Tenant>> {
        let mut all: Vec<_> = self.tenants.read().values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Opens a tenant from the store for serving: its stored limits go to the store,
    /// its schema bindings are loaded and its consumer groups started. A stored schema
    /// that no longer compiles, or a group that cannot be read, is skipped with a
    /// warning.
    pub async fn open_tenant(self: &Arc<Self>, name: &str) -> Result<Arc<Tenant>, StoreError> {
        let tenant = self.tenant(name);
        let Some(store) = self.store_of(name) else {
            return Ok(tenant);
        };
        if let Some(record) = self.tenant_records.get(name) {
            let limits = stored_limits(&record.limits);
            if limits != crate::store::StoredLimits::default() {
                store.set_limits(name, limits).await?;
            }
        }
        // Before anything reads or writes its messages: a key that does not unwrap
        // stops the open rather than let its messages read as shredded.
        store.open_data_keys(name).await?;
        let records = store.newest_schemas(name).await?;
        let bindings = crate::schemas::current_bindings(
            records
                .iter()
                .map(|r| (r.pattern.as_str(), r.version, &r.record[..])),
            |pattern, error| {
                tracing::warn!(tenant = name, pattern, %error, "a stored schema cannot be used; its subjects are refused until it is put again");
            },
        );
        if !bindings.is_empty() {
            tenant.schemas.set(bindings);
        }
        let plugins = store.plugins(name).await?;
        if !plugins.is_empty() {
            let (owner, max) = (name.to_owned(), self.max_answer());
            let loaded = tokio::task::spawn_blocking(move || {
                crate::plugins::load(&plugins, max, |pattern, error| {
                    tracing::warn!(tenant = %owner, pattern, %error, "a stored plugin cannot be used; its subjects go without it until it is put again");
                })
            })
            .await;
            match loaded {
                Ok(loaded) => tenant.plugins.set(loaded),
                Err(error) => {
                    tracing::warn!(tenant = name, %error, "the tenant's plugins were not loaded")
                }
            }
        }
        let streams = crate::streams::load(&store.streams(name).await?, |error| {
            tracing::warn!(tenant = name, %error, "a stored stream is unreadable; its subjects are in the tenant's own stream until it is declared again");
        });
        if !streams.is_empty() {
            tenant.streams.set(streams);
        }
        for record in store.groups(name).await? {
            match serde_json::from_slice::<crate::groups::StoredGroup>(&record) {
                Ok(group) => {
                    let push = group.push.clone();
                    let name = group.spec.name.clone();
                    self.groups.start(self, &store, &tenant, group);
                    if let Some(terms) = push {
                        super::push::start_pump(self, &store, &tenant, &name, terms);
                    }
                }
                Err(error) => {
                    tracing::warn!(tenant = name, %error, "a stored group is unreadable; not started");
                }
            }
        }
        Ok(tenant)
    }

    /// Opens every tenant the records name; for the server's start, once the store is
    /// attached and the records loaded.
    pub async fn open_tenants(self: &Arc<Self>) -> Result<(), StoreError> {
        for record in self.tenant_records.list() {
            self.open_tenant(&record.name).await?;
        }
        Ok(())
    }

    /// Opens the tenants a shard's store holds, now that this node owns it: the
    /// default tenant when it lives there (its record written if the store has none),
    /// and every tenant recorded there; purges of deleted ones go on. Their
    /// definitions are then mirrored for every node, as are those of tenants the
    /// cluster showed in this shard and the store does not hold (gone). A tenant that
    /// cannot be opened is logged and skipped.
    pub async fn open_shard_tenants(
        self: &Arc<Self>,
        store: &Arc<crate::store::Store>,
        shard: u32,
    ) {
        let Some(mesh) = self.mesh() else {
            return;
        };
        let mut records = match store.tenants().await {
            Ok(records) => records,
            Err(error) => {
                tracing::warn!(shard, %error, "the shard's tenant records cannot be read");
                Vec::new()
            }
        };
        let default = crate::tenancy::DEFAULT_TENANT;
        if mesh.shard_of(default) == shard && !records.iter().any(|r| r.name == default) {
            let record = crate::store::new_tenant(
                default,
                crate::store::TenantLimits::default(),
                self.clock.now_ms(),
            );
            match store.put_tenant(&record).await {
                Ok(()) => records.push(record),
                Err(error) => tracing::warn!(%error, "could not write the default tenant's record"),
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for record in records {
            names.insert(record.name.clone());
            if record.deleting {
                Arc::clone(store).purge_in_background(record.name);
                continue;
            }
            let name = record.name.clone();
            self.tenant_records.set(record);
            if let Err(error) = self.open_tenant(&name).await {
                tracing::warn!(tenant = name, %error, "could not open a tenant of a shard this node now owns");
            }
        }
        for record in self.tenant_records.list() {
            if mesh.shard_of(&record.name) == shard {
                names.insert(record.name.clone());
            }
        }
        for name in names {
            self.mirror_definitions(&name).await;
        }
    }

    /// Stops what runs for the tenants of a shard this node no longer owns (their
    /// consumer groups); their connections stay, served through the new owner. On a
    /// handover the groups write their cursors first (waited for up to a few
    /// seconds, before the shard's store closes); a lost shard's groups just stop.
    pub async fn release_shard_tenants(&self, shard: u32, handover: bool) {
        let Some(mesh) = self.mesh() else {
            return;
        };
        let mut tasks = Vec::new();
        for tenant in self.tenants() {
            if mesh.shard_of(&tenant.name) != shard {
                continue;
            }
            if handover {
                tasks.extend(tenant.groups.hand_over_all());
            } else {
                tenant.groups.stop_all();
            }
            // Push consumers follow their groups and their tenant's log: not here.
            tenant.pushes.stop_all();
            // Its bindings now come from what the cluster shows, as on any node that
            // does not own it.
            self.rebind(&tenant.name);
        }
        let ended = futures::future::join_all(tasks);
        if tokio::time::timeout(std::time::Duration::from_secs(5), ended)
            .await
            .is_err()
        {
            tracing::warn!(
                shard,
                "groups did not finish writing their cursors before the handover"
            );
        }
    }

    /// Makes a tenant's record current: the registry, the live quotas of its
    /// connections, and the store's limits.
    pub async fn set_tenant(&self, record: crate::store::TenantRecord) -> Result<(), StoreError> {
        if let Some(store) = self.store_of(&record.name) {
            store
                .set_limits(&record.name, stored_limits(&record.limits))
                .await?;
        }
        if let Some(tenant) = self.tenants.read().get(record.name.as_str()) {
            tenant.quota.set_limits(&record.limits);
        }
        self.tenant_records.set(record);
        Ok(())
    }

    /// Closes a tenant: its connections close, its groups stop (their cursors go with
    /// the tenant's data when it is deleted), its followers and bindings are dropped,
    /// and a tenant made again under its name starts with a new object.
    pub fn close_tenant(&self, name: &str) {
        let Some(tenant) = self.tenants.write().remove(name) else {
            return;
        };
        tenant.deleted.cancel();
        tenant.groups.stop_all();
        tenant.pushes.stop_all();
        tenant.schemas.set(crate::schemas::Bindings::default());
        tenant.plugins.set(crate::plugins::Plugins::default());
        tenant.streams.set(crate::streams::Streams::default());
    }

    /// Tells the followers of every tenant's log that a store write failed.
    pub fn log_lost(&self) {
        for tenant in self.tenants.read().values() {
            tenant.taps.lost();
        }
    }

    /// Live subscriptions of every tenant.
    pub fn subscription_count(&self) -> usize {
        self.tenants
            .read()
            .values()
            .map(|t| t.subscription_count())
            .sum()
    }
}
