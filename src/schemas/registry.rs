//! Every tenant's bindings as the publish path reads them, and the validation errors
//! each tenant saw last.
//!
//! A tenant's [`TenantSchemas`] is shared by its routes, so a publish finds it without
//! a lookup; a tenant without bindings pays one relaxed load. Changes swap the whole
//! [`Bindings`] under a short write lock, after the store has them. Must never touch
//! the store itself: the API writes there first, then here.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use super::{Binding, Bindings, Violation};

/// Validation errors kept per tenant, newest last.
pub const RECENT_ERRORS: usize = 100;

/// A message a schema refused, as the console and `schema.errors` show it.
#[derive(Debug, Clone)]
pub struct RecentError {
    pub subject: String,
    /// `<pattern>@<version>`.
    pub schema: String,
    pub violation: Violation,
    pub time_ms: u64,
    pub dead_lettered: bool,
}

/// One tenant's bindings and what validating against them found.
#[derive(Default)]
pub struct TenantSchemas {
    any: AtomicBool,
    current: RwLock<Arc<Bindings>>,
    recent: Mutex<VecDeque<RecentError>>,
    /// Messages refused and dead-lettered.
    pub refused: AtomicU64,
    pub dead_lettered: AtomicU64,
}

impl TenantSchemas {
    /// The binding `subject` falls under, when the tenant has any.
    #[inline]
    pub fn for_subject(&self, subject: &str) -> Option<Arc<Binding>> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.current.read().for_subject(subject).cloned()
    }

    /// The bindings now.
    pub fn current(&self) -> Arc<Bindings> {
        Arc::clone(&self.current.read())
    }

    /// Makes `bindings` current.
    pub fn set(&self, bindings: Bindings) {
        let any = !bindings.is_empty();
        *self.current.write() = Arc::new(bindings);
        self.any.store(any, Ordering::Relaxed);
    }

    /// Remembers a refused message (the oldest kept goes past [`RECENT_ERRORS`]).
    pub fn record_error(&self, error: RecentError) {
        let counter = if error.dead_lettered {
            &self.dead_lettered
        } else {
            &self.refused
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let mut recent = self.recent.lock();
        if recent.len() == RECENT_ERRORS {
            recent.pop_front();
        }
        recent.push_back(error);
    }

    /// The errors kept, oldest first, optionally only those of subjects `keep` takes.
    pub fn recent_errors(&self, keep: impl Fn(&str) -> bool) -> Vec<RecentError> {
        self.recent
            .lock()
            .iter()
            .filter(|e| keep(&e.subject))
            .cloned()
            .collect()
    }
}

/// Every tenant's [`TenantSchemas`].
#[derive(Default)]
pub struct Registry {
    tenants: RwLock<HashMap<Arc<str>, Arc<TenantSchemas>>>,
}

impl Registry {
    /// The schemas of `tenant`, made empty on first use.
    pub fn tenant(&self, tenant: &str) -> Arc<TenantSchemas> {
        if let Some(found) = self.tenants.read().get(tenant) {
            return Arc::clone(found);
        }
        Arc::clone(self.tenants.write().entry(Arc::from(tenant)).or_default())
    }

    /// Forgets a deleted tenant's bindings (its stored versions go with its data).
    pub fn evict(&self, tenant: &str) {
        if let Some(gone) = self.tenants.write().remove(tenant) {
            gone.set(Bindings::default());
        }
    }

    /// Per tenant known here: messages refused, and kept as dead letters.
    pub fn tallies(&self) -> Vec<(Arc<str>, u64, u64)> {
        self.tenants
            .read()
            .iter()
            .map(|(name, schemas)| {
                (
                    Arc::clone(name),
                    schemas.refused.load(Ordering::Relaxed),
                    schemas.dead_lettered.load(Ordering::Relaxed),
                )
            })
            .collect()
    }
}
