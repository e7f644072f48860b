//! Where a login finds a user's record: the store on a server alone, or on a node of
//! a cluster the copy of every tenant's users that etcd brings it (`cluster`'s
//! definitions), since the user's tenant may live in a shard another node owns.
//!
//! Must never: hold anything but what the store holds (hashes, never secrets), or be
//! written by anything but the definitions a node sees.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::store::{Store, StoreError, UserRecord};

/// One tenant's users by name.
type TenantUsers = HashMap<Arc<str>, Arc<UserRecord>>;

/// Every tenant's users as this node last saw them.
#[derive(Debug, Default)]
pub struct UserBook {
    users: RwLock<HashMap<Arc<str>, TenantUsers>>,
}

impl UserBook {
    pub fn get(&self, tenant: &str, name: &str) -> Option<Arc<UserRecord>> {
        self.users.read().get(tenant)?.get(name).cloned()
    }

    pub fn set(&self, tenant: &str, record: UserRecord) {
        self.users
            .write()
            .entry(Arc::from(tenant))
            .or_default()
            .insert(Arc::from(record.name.as_str()), Arc::new(record));
    }

    pub fn remove(&self, tenant: &str, name: &str) {
        let mut users = self.users.write();
        if let Some(of_tenant) = users.get_mut(tenant) {
            of_tenant.remove(name);
            if of_tenant.is_empty() {
                users.remove(tenant);
            }
        }
    }

    /// Replaces one tenant's users (none: the tenant has none, or is gone).
    pub fn set_tenant(&self, tenant: &str, records: Vec<UserRecord>) {
        let mut users = self.users.write();
        if records.is_empty() {
            users.remove(tenant);
            return;
        }
        let of_tenant = records
            .into_iter()
            .map(|r| (Arc::from(r.name.as_str()), Arc::new(r)))
            .collect();
        users.insert(Arc::from(tenant), of_tenant);
    }

    /// Replaces every tenant's users but those `keep` says to leave as they are.
    pub fn replace_all(&self, records: Vec<(String, UserRecord)>, keep: impl Fn(&str) -> bool) {
        let mut users = self.users.write();
        users.retain(|tenant, _| keep(tenant));
        for (tenant, record) in records {
            if keep(&tenant) {
                continue;
            }
            users
                .entry(Arc::from(tenant.as_str()))
                .or_default()
                .insert(Arc::from(record.name.as_str()), Arc::new(record));
        }
    }
}

/// Where a login reads users from.
#[derive(Clone, Copy)]
pub enum Users<'a> {
    Store(&'a Store),
    Book(&'a UserBook),
}

impl Users<'_> {
    pub async fn get(&self, tenant: &str, name: &str) -> Result<Option<UserRecord>, StoreError> {
        match self {
            Users::Store(store) => store.user(tenant, name).await,
            Users::Book(book) => Ok(book.get(tenant, name).map(|r| (*r).clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserRecord {
        UserRecord {
            name: name.into(),
            created_ms: 1,
            password: None,
            tokens: Vec::new(),
            permissions: Default::default(),
        }
    }

    #[test]
    fn a_replacement_leaves_the_kept_tenants_alone() {
        let book = UserBook::default();
        book.set("mine", user("ana"));
        book.set("theirs", user("bob"));
        book.replace_all(
            vec![("theirs".into(), user("cy")), ("mine".into(), user("dee"))],
            |tenant| tenant == "mine",
        );
        assert!(book.get("mine", "ana").is_some());
        assert!(book.get("mine", "dee").is_none());
        assert!(book.get("theirs", "bob").is_none());
        assert!(book.get("theirs", "cy").is_some());
        book.remove("theirs", "cy");
        book.set_tenant("mine", Vec::new());
        assert!(book.users.read().is_empty());
    }
}
