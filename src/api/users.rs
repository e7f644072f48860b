//! `$CANOPY.user.*`: create, list and delete a tenant's users, and issue and revoke
//! their bearer tokens.
//!
//! Passwords are hashed on a blocking thread (argon2id is CPU work) and never kept or
//! answered; a token is answered once, when it is issued, and only its hash is kept.
//! Changes to one user's record are serialised so two at once cannot lose one. The
//! calls are authorised as publishes to their own `$CANOPY.user.<op>` subject. This
//! module must never log a password or a token.

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::{Answer, ApiCall, ApiError, PREFIX, parse};
use crate::broker::Broker;
use crate::store::{Permissions, Store, TokenRecord, UserRecord, check_user_name};
use crate::tenancy::credentials;

/// Serialises read-modify-write changes of user records.
static CHANGES: Mutex<()> = Mutex::const_new(());

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewUser {
    tenant: String,
    name: String,
    password: Option<String>,
    #[serde(default)]
    permissions: Permissions,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserRef {
    tenant: String,
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantRef {
    tenant: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRef {
    tenant: String,
    name: String,
    id: String,
}

pub(super) async fn dispatch(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    answer: &mut Answer,
) -> Result<(), ApiError> {
    // The caller's right to the call was checked by the publish decision.
    super::admin_only(&call.principal, &call.operation)?;
    let body = match call.operation.as_str() {
        "user.create" => create(broker, store, parse(&call.body)?).await?,
        "user.list" => {
            let TenantRef { tenant } = parse(&call.body)?;
            existing_tenant(broker, &tenant)?;
            let users: Vec<Value> = store.users(&tenant).await?.iter().map(user_json).collect();
            json!({ "users": users })
        }
        "user.delete" => {
            let UserRef { tenant, name } = parse(&call.body)?;
            let _change = CHANGES.lock().await;
            found(store, &tenant, &name).await?;
            store.delete_user(&tenant, &name).await?;
            broker.mirror_definitions(&tenant).await;
            json!({"tenant": tenant, "name": name, "deleted": true})
        }
        "user.token.create" => {
            let UserRef { tenant, name } = parse(&call.body)?;
            let _change = CHANGES.lock().await;
            let mut user = found(store, &tenant, &name).await?;
            let issued = credentials::issue_token(&tenant, &name)
                .map_err(|e| ApiError::new(503, e.to_string()))?;
            user.tokens.push(TokenRecord {
                id: issued.id.clone(),
                hash: issued.hash,
                created_ms: broker.clock().now_ms(),
            });
            store.put_user(&tenant, &user).await?;
            broker.mirror_definitions(&tenant).await;
            json!({"tenant": tenant, "name": name, "id": issued.id, "token": issued.token})
        }
        "user.token.revoke" => {
            let TokenRef { tenant, name, id } = parse(&call.body)?;
            let _change = CHANGES.lock().await;
            let mut user = found(store, &tenant, &name).await?;
            let before = user.tokens.len();
            user.tokens.retain(|t| t.id != id);
            if user.tokens.len() == before {
                return Err(ApiError::new(404, format!("{name} has no token {id}")));
            }
            store.put_user(&tenant, &user).await?;
            broker.mirror_definitions(&tenant).await;
            json!({"tenant": tenant, "name": name, "id": id, "revoked": true})
        }
        other => {
            return Err(ApiError::new(
                404,
                format!(
                    "no API `{PREFIX}{other}`: use user.create, user.list, user.delete, \
                     user.token.create or user.token.revoke"
                ),
            ));
        }
    };
    answer.json(&body);
    Ok(())
}

/// A user as answered: never its password hash or token hashes.
fn user_json(user: &UserRecord) -> Value {
    let tokens: Vec<&str> = user.tokens.iter().map(|t| t.id.as_str()).collect();
    json!({
        "name": user.name,
        "created_ms": user.created_ms,
        "password": user.password.is_some(),
        "tokens": tokens,
        "permissions": user.permissions,
    })
}

fn existing_tenant(broker: &Broker, tenant: &str) -> Result<(), ApiError> {
    broker
        .tenant_records()
        .get(tenant)
        .map(|_| ())
        .ok_or_else(|| ApiError::new(404, format!("no tenant {tenant}")))
}

async fn found(store: &Store, tenant: &str, name: &str) -> Result<UserRecord, ApiError> {
    store
        .user(tenant, name)
        .await?
        .ok_or_else(|| ApiError::new(404, format!("tenant {tenant} has no user {name}")))
}

async fn create(broker: &Broker, store: &Store, request: NewUser) -> Result<Value, ApiError> {
    existing_tenant(broker, &request.tenant)?;
    check_user_name(&request.name).map_err(|reason| ApiError::new(400, reason))?;
    let password = match request.password {
        Some(password) if password.is_empty() => {
            return Err(ApiError::new(400, "an empty password is not a password"));
        }
        Some(password) => Some(
            tokio::task::spawn_blocking(move || credentials::hash_password(&password))
                .await
                .map_err(|e| ApiError::new(503, format!("hashing stopped: {e}")))?
                .map_err(|e| ApiError::new(503, e.to_string()))?,
        ),
        None => None,
    };
    let _change = CHANGES.lock().await;
    if store.user(&request.tenant, &request.name).await?.is_some() {
        return Err(ApiError::new(
            409,
            format!(
                "tenant {} has a user {} already",
                request.tenant, request.name
            ),
        ));
    }
    let user = UserRecord {
        name: request.name,
        created_ms: broker.clock().now_ms(),
        password,
        tokens: Vec::new(),
        permissions: request.permissions,
    };
    store.put_user(&request.tenant, &user).await?;
    broker.mirror_definitions(&request.tenant).await;
    Ok(user_json(&user))
}
