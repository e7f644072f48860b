//! A tenant's bindings as the publish path reads them, and the validation errors it
//! saw last.
//!
//! A tenant's [`TenantSchemas`] is held by its tenant object, so a publish finds it
//! without a lookup; a tenant without bindings pays one relaxed load. Changes swap the whole
//! [`Bindings`] under a short write lock, after the store has them. Must never touch
//! the store itself: the API writes there first, then here.

use std::collections::VecDeque;
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
