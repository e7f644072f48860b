//! Logging in: from what a client presented (a user and password, or a token) to the
//! [`Principal`] its connection acts as.
//!
//! Every failure looks the same to the client ("Authorization Violation") and costs
//! the same: an unknown tenant or user is still verified against the dummy hash, and
//! the caller delays its answer. At most [`HASHING_AT_ONCE`] password checks run at
//! once, on blocking threads, so a flood of logins cannot starve the server's cores;
//! each has its 19 MiB to itself and gives them back when it ends (`credentials`),
//! so neither can it grow the server's memory.
//! This module must never log a password or a token.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::acl::Acl;
use super::{DEFAULT_TENANT, Principal, Tenants, Users, credentials};
use crate::metrics::Metrics;

/// Password checks running at once.
pub const HASHING_AT_ONCE: usize = 2;

/// How long a failed login waits for its answer: guessing stays slow.
pub const FAILED_LOGIN_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

static HASHING: Semaphore = Semaphore::const_new(HASHING_AT_ONCE);

/// What a client presented.
#[derive(Debug, Default, Clone)]
pub struct Presented {
    /// `name@tenant`, or `name` for the default tenant.
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    /// The user a verified TLS client certificate names (`name@tenant` or `name`):
    /// used when neither a password nor a token was presented.
    pub certified: Option<String>,
    /// The client's own name or id, for the principal.
    pub client: String,
}

/// The one answer a failed login gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Authorization Violation")]
pub struct LoginRefused;

/// Checks what a client presented; the principal of the user it proves to be.
pub async fn login(
    store: Users<'_>,
    tenants: &Tenants,
    metrics: &Metrics,
    presented: &Presented,
) -> Result<Principal, LoginRefused> {
    if let Some(token) = &presented.token {
        return login_with_token(store, tenants, token, &presented.client).await;
    }
    if presented.password.is_none()
        && let Some(certified) = &presented.certified
    {
        return login_with_certificate(store, tenants, certified, &presented.client).await;
    }
    if presented.password.is_none() {
        return login_anonymously(tenants, presented);
    }
    let (Some(user), Some(password)) = (&presented.user, &presented.password) else {
        return Err(LoginRefused);
    };
    let (name, tenant) = user.split_once('@').unwrap_or((user, DEFAULT_TENANT));
    let record = match tenants.get(tenant) {
        Some(_) => store.get(tenant, name).await.map_err(|_| LoginRefused)?,
        None => None,
    };
    let stored = record.as_ref().and_then(|r| r.password.clone());
    let password = password.clone();
    let _permit = HASHING.acquire().await.map_err(|_| LoginRefused)?;
    metrics.count_password_check();
    let verified = tokio::task::spawn_blocking(move || {
        credentials::verify_password(stored.as_deref(), &password)
    })
    .await
    .unwrap_or(false);
    if !verified {
        return Err(LoginRefused);
    }
    let permissions = record.map(|r| r.permissions).unwrap_or_default();
    Ok(Principal {
        tenant: Arc::from(tenant),
        user: Some(Arc::from(name)),
        client: Arc::from(presented.client.as_str()),
        acl: Some(Arc::new(Acl::compile(
            &permissions,
            name,
            &presented.client,
        ))),
    })
}

/// No credentials: the tenant's anonymous rules, if it has any. The tenant is the
/// default, or the one a user name of `@tenant` names; another user name without a
/// password is a failed login.
fn login_anonymously(tenants: &Tenants, presented: &Presented) -> Result<Principal, LoginRefused> {
    let tenant = match presented.user.as_deref() {
        None | Some("") => DEFAULT_TENANT,
        Some(user) => user.strip_prefix('@').ok_or(LoginRefused)?,
    };
    let record = tenants.get(tenant).ok_or(LoginRefused)?;
    let rules = record.anonymous.as_ref().ok_or(LoginRefused)?;
    Ok(Principal {
        tenant: Arc::from(tenant),
        user: None,
        client: Arc::from(presented.client.as_str()),
        // No user: rules with `{user}` fall away (allows) or deny all (denies).
        acl: Some(Arc::new(Acl::compile(rules, "", &presented.client))),
    })
}

/// The TLS handshake proved the certificate; the user must exist in a usable tenant.
async fn login_with_certificate(
    store: Users<'_>,
    tenants: &Tenants,
    certified: &str,
    client: &str,
) -> Result<Principal, LoginRefused> {
    let (name, tenant) = certified
        .split_once('@')
        .unwrap_or((certified, DEFAULT_TENANT));
    tenants.get(tenant).ok_or(LoginRefused)?;
    let user = store
        .get(tenant, name)
        .await
        .map_err(|_| LoginRefused)?
        .ok_or(LoginRefused)?;
    Ok(Principal {
        tenant: Arc::from(tenant),
        user: Some(Arc::from(name)),
        client: Arc::from(client),
        acl: Some(Arc::new(Acl::compile(&user.permissions, name, client))),
    })
}

async fn login_with_token(
    store: Users<'_>,
    tenants: &Tenants,
    token: &str,
    client: &str,
) -> Result<Principal, LoginRefused> {
    let parts = credentials::parse_token(token).ok_or(LoginRefused)?;
    tenants.get(parts.tenant).ok_or(LoginRefused)?;
    let user = store
        .get(parts.tenant, parts.user)
        .await
        .map_err(|_| LoginRefused)?
        .ok_or(LoginRefused)?;
    let known = user
        .tokens
        .iter()
        .find(|t| t.id == parts.id)
        .ok_or(LoginRefused)?;
    if !credentials::token_matches(&known.hash, parts.secret) {
        return Err(LoginRefused);
    }
    Ok(Principal {
        tenant: Arc::from(parts.tenant),
        user: Some(Arc::from(parts.user)),
        client: Arc::from(client),
        acl: Some(Arc::new(Acl::compile(
            &user.permissions,
            parts.user,
            client,
        ))),
    })
}

/// The principal of a caller another node let in, made again here from what every
/// node sees: the user's record, or the tenant's anonymous rules for a guest. A
/// caller with neither (no logins required) is the anonymous principal.
pub fn of_forwarded(
    users: &super::UserBook,
    tenants: &Tenants,
    tenant: &str,
    user: Option<&str>,
    guest: bool,
    client: &str,
) -> Result<Principal, LoginRefused> {
    let (name, rules) = match user {
        Some(name) => {
            tenants.get(tenant).ok_or(LoginRefused)?;
            let user = users.get(tenant, name).ok_or(LoginRefused)?;
            (name, user.permissions.clone())
        }
        None if guest => {
            let record = tenants.get(tenant).ok_or(LoginRefused)?;
            ("", record.anonymous.clone().ok_or(LoginRefused)?)
        }
        // No logins required: the tenant's record is not needed.
        None => {
            return Ok(Principal {
                tenant: Arc::from(tenant),
                ..Principal::anonymous(client)
            });
        }
    };
    Ok(Principal {
        tenant: Arc::from(tenant),
        user: user.map(Arc::from),
        client: Arc::from(client),
        acl: Some(Arc::new(Acl::compile(&rules, name, client))),
    })
}
