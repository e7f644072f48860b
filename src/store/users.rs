//! User records: one key per user of a tenant (`'u' tenant 0x00 name`), JSON with the
//! user's password hash, token hashes and permissions. They live under the tenant's
//! prefix, so deleting a tenant purges its users with its data. This module stores
//! what it is given: it never sees a password or a token's secret.

use serde::{Deserialize, Serialize};

use super::{Store, StoreError, keys, put_durably, write_durably};

/// Allow and deny patterns for one kind of action (`{user}` and `{client_id}` are
/// substituted when they are checked). Empty `allow` allows everything not denied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

/// What a user may publish to and subscribe to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Permissions {
    #[serde(default)]
    pub publish: Rules,
    #[serde(default)]
    pub subscribe: Rules,
}

/// A bearer token as kept: its id and the hash of its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub id: String,
    pub hash: String,
    pub created_ms: u64,
}

/// A user as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    pub name: String,
    pub created_ms: u64,
    /// An argon2id PHC string; `None`: tokens only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<TokenRecord>,
    #[serde(default)]
    pub permissions: Permissions,
}

impl Store {
    /// Writes a user's record, durably.
    pub async fn put_user(&self, tenant: &str, user: &UserRecord) -> Result<(), StoreError> {
        let value = serde_json::to_vec(user)
            .map_err(|e| StoreError::Refused(format!("user record: {e}")))?;
        put_durably(self.db(), keys::user(tenant, &user.name), value).await
    }

    /// One user of a tenant.
    pub async fn user(&self, tenant: &str, name: &str) -> Result<Option<UserRecord>, StoreError> {
        Ok(self
            .db()
            .get(keys::user(tenant, name))
            .await?
            .and_then(|value| serde_json::from_slice(&value).ok()))
    }

    /// Every user of a tenant, in name order.
    pub async fn users(&self, tenant: &str) -> Result<Vec<UserRecord>, StoreError> {
        let mut records = self
            .db()
            .scan(keys::tenant_kind_range(keys::USER, tenant))
            .await?;
        let mut all = Vec::new();
        while let Some(kv) = records.next().await? {
            if let Ok(user) = serde_json::from_slice(&kv.value) {
                all.push(user);
            }
        }
        Ok(all)
    }

    /// Deletes a user's record, durably.
    pub async fn delete_user(&self, tenant: &str, name: &str) -> Result<(), StoreError> {
        let mut batch = slatedb::WriteBatch::new();
        batch.delete(keys::user(tenant, name));
        write_durably(self.db(), batch).await
    }
}

/// A user name: 1 to 64 of `A-Z`, `a-z`, `0-9`, `-` and `_` (a token names its user,
/// and `.` separates a token's parts).
pub fn check_user_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a user name: use 1 to 64 of A-Z, a-z, 0-9, '-' and '_'"
        ))
    }
}
