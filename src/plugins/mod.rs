//! WebAssembly plugins bound to subject patterns (issue 31): what a plugin is, which
//! ones a subject falls under and in what order, and running them on a publish.
//!
//! A tenant binds a module to a pattern (one per pattern), with the hook it serves,
//! what happens when it fails (`on_error`: reject the message, or pass it on as it
//! was), its deadline and its memory. On a publish, every plugin whose pattern
//! matches the subject runs, the most specific first ([`crate::schemas::specificity`];
//! patterns equally specific in pattern order), each on what the one before gave: it
//! passes, drops, rejects with a reason, or replaces the message by up to
//! [`runtime::MAX_EMITTED`] others (a transform, a fan-out; a new subject is held to
//! the publisher's rights by the publish decision after it). A plugin that faults
//! (traps, passes its deadline, runs out of memory, breaks the ABI) is answered per
//! its `on_error`; after [`MAX_FAULTS`] faults in a row it is disabled (answered the
//! same way without running) until it is put again. The registry ([`TenantPlugins`])
//! holds each tenant's set; the store keeps the records (`store/plugins.rs`).
//!
//! Must never: run a plugin on a subject its pattern does not match or on another
//! tenant's messages, let one message become more than [`runtime::MAX_EMITTED`], or
//! compile a module on the publish path.

pub mod runtime;

use std::cmp::Ordering;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering as Atomic};
use std::time::Duration;

use bytes::Bytes;
use canopy_subjects::{Pattern, Trie};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

pub use runtime::{MAX_EMITTED, Runtime};

/// Plugins one tenant may bind.
pub const MAX_PLUGINS: usize = 100;
/// The largest module taken, in bytes.
pub const MAX_MODULE_BYTES: usize = 4 << 20;
/// Faults in a row after which a plugin is disabled, and for how long: then it runs
/// again, and one more fault disables it again (so what a client sends cannot turn a
/// plugin off for good).
pub const MAX_FAULTS: u32 = 5;
pub const DISABLED_FOR: Duration = Duration::from_secs(30);
/// What all the publish plugins of one publish may take together, and the deliver
/// plugins of one routed message for all of its readers: past it, what is left is
/// answered per each plugin's `on_error` without running it (a reader past it of a
/// plugin that rejects on error does not get the message).
pub const PUBLISH_BUDGET: Duration = Duration::from_millis(100);
pub const ROUTE_BUDGET: Duration = Duration::from_millis(50);
/// Memory all of one tenant's plugins may have, instances counted at their limit.
pub const TENANT_MEMORY_MIB: u64 = 2048;
/// A call's deadline when none is given, and the longest one taken.
pub const DEFAULT_DEADLINE_MS: u64 = 10;
pub const MAX_DEADLINE_MS: u64 = 1_000;
/// An instance's memory when none is given, and the most taken.
pub const DEFAULT_MEMORY_MIB: u32 = 16;
pub const MAX_MEMORY_MIB: u32 = 256;

/// Where a plugin runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hook {
    /// On each publish to a subject its pattern matches, before it is routed or stored.
    Publish,
    /// On each delivery to a reader of a subject its pattern matches.
    Deliver,
}

/// What happens to a message when its plugin fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Refused, with why, in the publisher's protocol.
    #[default]
    Reject,
    /// Passed on as it was.
    Pass,
}

/// How a plugin is bound, as it is put and listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginSpec {
    pub pattern: String,
    pub hooks: Vec<Hook>,
    #[serde(default)]
    pub on_error: OnError,
    pub deadline_ms: u64,
    pub memory_mib: u32,
}

/// A plugin as stored: its spec, its module and when it was put.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredPlugin {
    pub spec: PluginSpec,
    /// The module, base64.
    pub module: String,
    /// How many times the pattern was given a plugin (1 for the first).
    pub version: u64,
    pub time_ms: u64,
    /// SHA-256 of the module, hex.
    pub sha256: String,
}

/// One message a plugin emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    pub subject: String,
    /// A NATS header block, or empty.
    pub headers: Bytes,
    pub payload: Bytes,
}

/// What a plugin answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Drop,
    Reject(String),
    Replace(Vec<Emitted>),
}

/// Why a plugin failed (or a module was refused).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    #[error("its deadline passed")]
    Deadline,
    #[error("it trapped: {0}")]
    Trap(String),
    #[error("it broke the plugin ABI: {0}")]
    Abi(String),
    #[error("{0}")]
    Module(String),
    /// All of its instances are running (calls overlap past [`runtime::MAX_INSTANCES`]).
    #[error("it is busy")]
    Busy,
}

/// What the plugins made of one publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing changed it: it goes on as it was.
    Unchanged,
    /// It goes nowhere.
    Dropped,
    /// Refused, with why.
    Rejected(String),
    /// These messages go on in its place.
    Replaced(Vec<Emitted>),
}

/// A bound plugin: its spec, its compiled module and how it has fared.
pub struct Plugin {
    pub spec: PluginSpec,
    pub parsed: Pattern,
    pub version: u64,
    pub time_ms: u64,
    pub sha256: String,
    runtime: Runtime,
    faults_in_a_row: AtomicU32,
    /// When it was last disabled, while it is.
    disabled_at: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Calls made, and faults among them.
    pub calls: AtomicU64,
    pub faults: AtomicU64,
    last_fault: parking_lot::Mutex<Option<String>>,
    /// Its tenant's schema bindings, for the `schema` host function (set when it is
    /// made current in a tenant's set).
    schemas: std::sync::OnceLock<Arc<crate::schemas::TenantSchemas>>,
}

impl Plugin {
    /// Compiles a stored plugin. `max_message`: bytes of headers and payload an
    /// emitted message may have (the server's largest publish).
    pub fn new(stored: &StoredPlugin, module: &[u8], max_message: usize) -> Result<Plugin, Fault> {
        let parsed = Pattern::parse_native(&stored.spec.pattern)
            .map_err(|e| Fault::Module(format!("pattern {}: {e}", stored.spec.pattern)))?;
        let spec = &stored.spec;
        let runtime = Runtime::new(
            &spec.pattern,
            module,
            spec.memory_mib as usize * 1024 * 1024,
            Duration::from_millis(spec.deadline_ms),
            max_message,
        )?;
        let mut spec = spec.clone();
        if spec.hooks.is_empty() {
            // Unsaid: every hook the module exports.
            spec.hooks = [Hook::Publish, Hook::Deliver]
                .into_iter()
                .filter(|hook| runtime.exports(*hook))
                .collect();
        }
        for hook in &spec.hooks {
            if !runtime.exports(*hook) {
                return Err(Fault::Module(format!(
                    "it is bound to {hook:?} but does not export on_{}",
                    match hook {
                        Hook::Publish => "publish",
                        Hook::Deliver => "deliver",
                    }
                )));
            }
        }
        Ok(Plugin {
            spec,
            parsed,
            version: stored.version,
            time_ms: stored.time_ms,
            sha256: stored.sha256.clone(),
            runtime,
            faults_in_a_row: AtomicU32::new(0),
            disabled_at: parking_lot::Mutex::new(None),
            calls: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            last_fault: parking_lot::Mutex::new(None),
            schemas: std::sync::OnceLock::new(),
        })
    }

    pub fn serves(&self, hook: Hook) -> bool {
        self.spec.hooks.contains(&hook)
    }

    /// Whether it is disabled now (for [`DISABLED_FOR`] after its faults).
    pub fn is_disabled(&self) -> bool {
        if self.faults_in_a_row.load(Atomic::Relaxed) < MAX_FAULTS {
            return false;
        }
        let mut at = self.disabled_at.lock();
        match *at {
            Some(when) if when.elapsed() < DISABLED_FOR => true,
            Some(_) => {
                // Its time is up: it runs again, on probation.
                *at = None;
                self.faults_in_a_row.store(MAX_FAULTS - 1, Atomic::Relaxed);
                false
            }
            None => false,
        }
    }

    /// The memory its instances may have at most, in MiB.
    pub fn memory_budget_mib(&self) -> u64 {
        u64::from(self.spec.memory_mib) * runtime::MAX_INSTANCES as u64
    }

    pub fn last_fault(&self) -> Option<String> {
        self.last_fault.lock().clone()
    }

    /// Runs the plugin on one message (for `reader`, on deliver); a fault is answered
    /// per its `on_error`.
    fn verdict(
        &self,
        hook: Hook,
        (subject, headers, payload): (&str, &[u8], &[u8]),
        reader: &str,
    ) -> Verdict {
        if self.is_disabled() {
            return self.on_fault(&format!(
                "plugin {} is disabled after {MAX_FAULTS} faults in a row (for {} s, or until \
                 it is put again)",
                self.spec.pattern,
                DISABLED_FOR.as_secs()
            ));
        }
        self.calls.fetch_add(1, Atomic::Relaxed);
        let schema = self.schemas.get().and_then(|s| s.for_subject(subject));
        match self
            .runtime
            .call(hook, (subject, headers, payload), reader, schema)
        {
            Ok(verdict) => {
                self.faults_in_a_row.store(0, Atomic::Relaxed);
                verdict
            }
            // Not its fault: calls overlapped past its instances.
            Err(Fault::Busy) => {
                self.on_fault(&format!("plugin {} is busy; retry", self.spec.pattern))
            }
            Err(fault) => {
                self.faults.fetch_add(1, Atomic::Relaxed);
                let why = format!("plugin {} failed: {fault}", self.spec.pattern);
                tracing::warn!(plugin = %self.spec.pattern, "{why}");
                *self.last_fault.lock() = Some(why.clone());
                if self.faults_in_a_row.fetch_add(1, Atomic::Relaxed) + 1 == MAX_FAULTS {
                    *self.disabled_at.lock() = Some(std::time::Instant::now());
                    tracing::warn!(plugin = %self.spec.pattern, "plugin disabled after {MAX_FAULTS} faults in a row");
                }
                self.on_fault(&why)
            }
        }
    }

    fn on_fault(&self, why: &str) -> Verdict {
        match self.spec.on_error {
            OnError::Reject => Verdict::Reject(why.to_owned()),
            OnError::Pass => Verdict::Pass,
        }
    }
}

/// One tenant's plugins as they are now: immutable, swapped whole on a change.
#[derive(Default)]
pub struct Plugins {
    all: Vec<Arc<Plugin>>,
    trie: Trie<usize>,
}

impl Plugins {
    pub fn new(mut all: Vec<Arc<Plugin>>) -> Self {
        all.sort_by(|a, b| a.spec.pattern.cmp(&b.spec.pattern));
        let mut trie = Trie::new();
        for (i, plugin) in all.iter().enumerate() {
            trie.insert(&plugin.parsed, None, i);
        }
        Self { all, trie }
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    pub fn len(&self) -> usize {
        self.all.len()
    }

    /// Every plugin, in pattern order.
    pub fn all(&self) -> &[Arc<Plugin>] {
        &self.all
    }

    pub fn get(&self, pattern: &str) -> Option<&Arc<Plugin>> {
        self.all.iter().find(|p| p.spec.pattern == pattern)
    }

    /// The plugins serving `hook` whose pattern matches `subject`, most specific first.
    pub fn for_subject(&self, hook: Hook, subject: &str) -> Vec<Arc<Plugin>> {
        let mut found: Vec<usize> = Vec::new();
        self.trie.for_each_match(subject, &mut |matched, _| {
            found.extend(matched.iter().copied());
        });
        found.sort_unstable();
        found.dedup();
        let mut chain: Vec<Arc<Plugin>> = found
            .into_iter()
            .map(|i| Arc::clone(&self.all[i]))
            .filter(|p| p.serves(hook))
            .collect();
        chain.sort_by(
            |a, b| match crate::schemas::specificity(&b.parsed, &a.parsed) {
                Ordering::Equal => a.spec.pattern.cmp(&b.spec.pattern),
                order => order,
            },
        );
        chain
    }

    /// These plugins with `plugin` in place of any of its pattern.
    pub fn with(&self, plugin: Arc<Plugin>) -> Self {
        let mut all: Vec<_> = self
            .all
            .iter()
            .filter(|p| p.spec.pattern != plugin.spec.pattern)
            .cloned()
            .collect();
        all.push(plugin);
        Self::new(all)
    }

    /// These plugins without the one of `pattern`.
    pub fn without(&self, pattern: &str) -> Self {
        Self::new(
            self.all
                .iter()
                .filter(|p| p.spec.pattern != pattern)
                .cloned()
                .collect(),
        )
    }
}

/// What the deliver plugins made of one message for one reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// It is delivered as it is.
    Unchanged,
    /// This reader does not get it.
    Withheld,
    /// This reader gets these headers and payload instead (same subject).
    Replaced { headers: Bytes, payload: Bytes },
}

/// One tenant's plugins.
#[derive(Default)]
pub struct TenantPlugins {
    any: AtomicBool,
    /// Some plugin serves deliveries: routing looks no further when not.
    any_deliver: AtomicBool,
    current: RwLock<Arc<Plugins>>,
    /// The tenant's schema bindings, which its plugins may read.
    schemas: Option<Arc<crate::schemas::TenantSchemas>>,
}

impl TenantPlugins {
    /// Whether the tenant has any plugin: the publish path looks no further when not.
    #[inline]
    pub fn any(&self) -> bool {
        self.any.load(Atomic::Relaxed)
    }

    pub fn current(&self) -> Arc<Plugins> {
        Arc::clone(&self.current.read())
    }

    /// A tenant's (empty) set whose plugins read the schemas of `schemas`.
    pub fn reading(schemas: Arc<crate::schemas::TenantSchemas>) -> TenantPlugins {
        TenantPlugins {
            schemas: Some(schemas),
            ..TenantPlugins::default()
        }
    }

    /// Makes `plugins` current.
    pub fn set(&self, plugins: Plugins) {
        if let Some(schemas) = &self.schemas {
            for plugin in &plugins.all {
                // A plugin belongs to one tenant: set once, never to another's.
                let _ = plugin.schemas.set(Arc::clone(schemas));
            }
        }
        let any = !plugins.is_empty();
        let deliver = plugins.all.iter().any(|p| p.serves(Hook::Deliver));
        *self.current.write() = Arc::new(plugins);
        self.any.store(any, Atomic::Relaxed);
        self.any_deliver.store(deliver, Atomic::Relaxed);
    }

    /// The deliver plugins of `subject` (the subject readers see), most specific
    /// first; empty (and no lock taken) when the tenant has none.
    #[inline]
    pub fn deliver_chain(&self, subject: &str) -> Vec<Arc<Plugin>> {
        // Replies and the server's own subjects (acks, API answers, statuses) are
        // not messages a plugin filters.
        if !self.any_deliver.load(Atomic::Relaxed)
            || subject.starts_with('$')
            || subject.starts_with("_INBOX.")
        {
            return Vec::new();
        }
        self.current().for_subject(Hook::Deliver, subject)
    }

    /// Runs a deliver chain on one message for `reader` (a user name, empty for an
    /// anonymous one): each plugin on what the one before gave; a drop or a
    /// rejection withholds it from this reader, a replacement gives the first
    /// emitted message's headers and payload (its subject stays).
    pub fn on_deliver(
        chain: &[Arc<Plugin>],
        subject: &str,
        (headers, payload): (&[u8], &[u8]),
        (reader, over_budget): (&str, bool),
    ) -> Delivered {
        if over_budget {
            // Each as its `on_error` says, without running it.
            let rejects = chain.iter().any(|p| p.spec.on_error == OnError::Reject);
            return if rejects {
                Delivered::Withheld
            } else {
                Delivered::Unchanged
            };
        }
        let mut now: Option<(Bytes, Bytes)> = None;
        for plugin in chain {
            let (h, p) = now
                .as_ref()
                .map_or((headers, payload), |(h, p)| (&h[..], &p[..]));
            match plugin.verdict(Hook::Deliver, (subject, h, p), reader) {
                Verdict::Pass => {}
                Verdict::Drop | Verdict::Reject(_) => return Delivered::Withheld,
                Verdict::Replace(emitted) => match emitted.into_iter().next() {
                    Some(first) => now = Some((first.headers, first.payload)),
                    None => return Delivered::Withheld,
                },
            }
        }
        match now {
            None => Delivered::Unchanged,
            Some((headers, payload)) => Delivered::Replaced { headers, payload },
        }
    }

    /// Runs the publish plugins of `subject` on one message, most specific first,
    /// each on what the one before gave.
    pub fn on_publish(&self, subject: &str, headers: &Bytes, payload: &Bytes) -> Outcome {
        if !self.any() {
            return Outcome::Unchanged;
        }
        let chain = self.current().for_subject(Hook::Publish, subject);
        if chain.is_empty() {
            return Outcome::Unchanged;
        }
        let mut messages = vec![Emitted {
            subject: subject.to_owned(),
            headers: headers.clone(),
            payload: payload.clone(),
        }];
        let mut changed = false;
        let started = std::time::Instant::now();
        for plugin in chain {
            let mut next = Vec::with_capacity(messages.len());
            for message in messages {
                if started.elapsed() > PUBLISH_BUDGET {
                    return Outcome::Rejected(format!(
                        "the plugins of {subject} took more than the {} ms a publish may \
                         spend in them",
                        PUBLISH_BUDGET.as_millis()
                    ));
                }
                let input = (
                    &message.subject[..],
                    &message.headers[..],
                    &message.payload[..],
                );
                match plugin.verdict(Hook::Publish, input, "") {
                    Verdict::Pass => next.push(message),
                    Verdict::Drop => changed = true,
                    Verdict::Reject(why) => return Outcome::Rejected(why),
                    Verdict::Replace(emitted) => {
                        changed = true;
                        next.extend(emitted);
                    }
                }
            }
            if next.len() > MAX_EMITTED {
                return Outcome::Rejected(format!(
                    "plugins made more than {MAX_EMITTED} messages of one"
                ));
            }
            messages = next;
        }
        match (changed, messages.is_empty()) {
            (false, _) => Outcome::Unchanged,
            (true, true) => Outcome::Dropped,
            (true, false) => Outcome::Replaced(messages),
        }
    }
}

/// The module of a stored plugin, from its base64.
pub fn module_of(stored: &StoredPlugin) -> Result<Vec<u8>, Fault> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(&stored.module)
        .map_err(|e| Fault::Module(format!("its stored module is not base64: {e}")))
}

/// SHA-256 of a module, hex.
pub fn sha256_of(module: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(module);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A tenant's stored plugins, compiled (slow: run off the async runtime). A record
/// that cannot be used is left out, with `warn` told why: its subjects then go
/// without it until it is put again.
pub fn load(records: &[Bytes], max_message: usize, mut warn: impl FnMut(&str, &str)) -> Plugins {
    let mut all = Vec::new();
    for record in records {
        let stored: StoredPlugin = match serde_json::from_slice(record) {
            Ok(stored) => stored,
            Err(e) => {
                warn("?", &format!("unreadable record: {e}"));
                continue;
            }
        };
        let made = module_of(&stored).and_then(|module| Plugin::new(&stored, &module, max_message));
        match made {
            Ok(plugin) => all.push(Arc::new(plugin)),
            Err(fault) => warn(&stored.spec.pattern, &fault.to_string()),
        }
    }
    Plugins::new(all)
}
