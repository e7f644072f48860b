//! The `[limits]` and `[authz]` sections: what a subject may be and who may publish or
//! subscribe where, each with its defaults.
//!
//! Must never: decide access itself (the broker's authz does), or check one section
//! against another (that is `Config::validate`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    pub max_subject_len: usize,
    pub max_subject_tokens: usize,
    /// A tenant's API calls running at once, unless its record says otherwise.
    pub tenant_api_calls: u64,
    /// A tenant's consumer groups, unless its record says otherwise.
    pub tenant_groups: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthzConfig {
    pub deny_publish: Vec<String>,
    pub deny_subscribe: Vec<String>,
    /// Every client logs in (a tenant's user and password, or a token); listeners may
    /// then bind beyond loopback.
    pub require_login: bool,
    /// When set and the default tenant has no user `admin`, one is created at start
    /// with this password and no rules: the first login of a new deployment.
    pub bootstrap_admin_password: Option<String>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_subject_len: 1024,
            max_subject_tokens: 64,
            tenant_api_calls: 64,
            tenant_groups: 1000,
        }
    }
}
