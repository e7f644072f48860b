//! A tenant's live quotas: connections, subscriptions, and publish rates in messages
//! and bytes per second. One [`Quota`] per tenant, shared by every connection of the
//! tenant through its routes; its limits follow the tenant's record.
//!
//! The rates are GCRA token buckets in one atomic each (a burst of one second's
//! worth, then the rate), so the check on the publish path is a couple of atomic
//! operations and takes no lock; a tenant without limits pays one relaxed load per
//! check. A refused publish tells the connection how long to wait: front ends stop
//! reading that long, so a tenant far over its rate burns its own client's time,
//! not the server's (and never another tenant's). Stored quotas (bytes, subjects)
//! are the store's, enforced where appends are sequenced.
//!
//! Must never: block, allocate on the publish path, or let one tenant's count touch
//! another's.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::pattern_rates::{ClientRates, PatternRateExceeded, PatternRates};
use crate::store::TenantLimits;

use super::rate::{Rate, UNLIMITED};

/// Which quota an action went over.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Exceeded {
    #[error("maximum connections exceeded: tenant {tenant} allows {limit}")]
    Connections { tenant: Arc<str>, limit: u64 },
    #[error("maximum subscriptions exceeded: tenant {tenant} allows {limit}")]
    Subscriptions { tenant: Arc<str>, limit: u64 },
    #[error("publish rate exceeded: tenant {tenant} allows {limit} messages/s")]
    MessageRate {
        tenant: Arc<str>,
        limit: u64,
        wait: Duration,
    },
    #[error("publish rate exceeded: tenant {tenant} allows {limit} bytes/s")]
    ByteRate {
        tenant: Arc<str>,
        limit: u64,
        wait: Duration,
    },
    #[error(transparent)]
    PatternRate(Box<PatternRateExceeded>),
    #[error("stored bytes exceeded: tenant {tenant} is at its limit")]
    StoredBytes { tenant: Arc<str> },
    #[error(
        "too many API calls at once: tenant {tenant} allows {limit} (a follow or a wait \
         counts until it ends); retry"
    )]
    ApiCalls { tenant: Arc<str>, limit: u64 },
}

/// The limits a tenant has when its record names none: the server's `[limits]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantDefaults {
    pub api_calls: u64,
    pub groups: u64,
}

impl Default for TenantDefaults {
    fn default() -> Self {
        let config = crate::config::LimitsConfig::default();
        Self::from(&config)
    }
}

impl From<&crate::config::LimitsConfig> for TenantDefaults {
    fn from(config: &crate::config::LimitsConfig) -> Self {
        Self {
            api_calls: config.tenant_api_calls,
            groups: config.tenant_groups,
        }
    }
}

impl Exceeded {
    /// How long the publisher should pause before its next message is admitted.
    pub fn wait(&self) -> Option<Duration> {
        match self {
            Exceeded::MessageRate { wait, .. } | Exceeded::ByteRate { wait, .. } => Some(*wait),
            Exceeded::PatternRate(over) => Some(over.wait),
            _ => None,
        }
    }
}

/// One tenant's live quotas and counts.
#[derive(Debug)]
pub struct Quota {
    tenant: Arc<str>,
    epoch: Instant,
    max_connections: AtomicU64,
    max_subscriptions: AtomicU64,
    max_api_calls: AtomicU64,
    max_groups: AtomicU64,
    defaults: TenantDefaults,
    /// API calls running now.
    api_calls: AtomicU64,
    messages: Rate,
    bytes: Rate,
    /// The rates of its patterns, and how many times they were set.
    pattern_rates: parking_lot::RwLock<Arc<PatternRates>>,
    pattern_generation: AtomicU64,
    connections: AtomicU64,
    published_msgs: AtomicU64,
    published_bytes: AtomicU64,
    refused: AtomicU64,
    /// Publishes admitted late: their connection paused for the rate.
    throttled: AtomicU64,
    /// The counts at the last rate reading, for `rates`.
    last_reading: parking_lot::Mutex<Reading>,
    /// Per-client pattern buckets of clients with a stable identity (an MQTT client
    /// id), so that reconnecting does not start them full; and the size past which
    /// the ones nobody holds and that are full again are dropped.
    clients: parking_lot::Mutex<(ClientBook, usize)>,
}

/// Clients' per-client pattern buckets, by client id.
type ClientBook = HashMap<Box<str>, Arc<ClientRates>>;

/// Clients' buckets kept before the first pruning.
const CLIENTS_BEFORE_PRUNING: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Reading {
    at: Instant,
    msgs: u64,
    bytes: u64,
    msgs_per_sec: f64,
    bytes_per_sec: f64,
}

/// What a tenant uses now, for `tenant describe`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LiveUsage {
    pub connections: u64,
    pub published_msgs: u64,
    pub published_bytes: u64,
    pub refused: u64,
    pub throttled: u64,
    pub msgs_per_sec: f64,
    pub bytes_per_sec: f64,
}

impl Quota {
    pub fn new(tenant: &str, limits: Option<&TenantLimits>, defaults: TenantDefaults) -> Self {
        let now = Instant::now();
        let quota = Self {
            tenant: Arc::from(tenant),
            epoch: now,
            max_connections: AtomicU64::new(UNLIMITED),
            max_subscriptions: AtomicU64::new(UNLIMITED),
            max_api_calls: AtomicU64::new(defaults.api_calls),
            max_groups: AtomicU64::new(defaults.groups),
            defaults,
            api_calls: AtomicU64::new(0),
            messages: Rate::new(),
            bytes: Rate::new(),
            pattern_rates: parking_lot::RwLock::default(),
            pattern_generation: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            published_msgs: AtomicU64::new(0),
            published_bytes: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            last_reading: parking_lot::Mutex::new(Reading {
                at: now,
                msgs: 0,
                bytes: 0,
                msgs_per_sec: 0.0,
                bytes_per_sec: 0.0,
            }),
            clients: parking_lot::Mutex::new((HashMap::new(), CLIENTS_BEFORE_PRUNING)),
        };
        if let Some(limits) = limits {
            quota.set_limits(limits);
        }
        quota
    }

    /// Applies a tenant record's limits; takes effect at the next check.
    pub fn set_limits(&self, limits: &TenantLimits) {
        let store = |at: &AtomicU64, limit: Option<u64>| {
            at.store(limit.unwrap_or(UNLIMITED), Ordering::Relaxed);
        };
        store(&self.max_connections, limits.max_connections);
        store(&self.max_subscriptions, limits.max_subscriptions);
        store(
            &self.max_api_calls,
            Some(limits.max_api_calls.unwrap_or(self.defaults.api_calls)),
        );
        store(
            &self.max_groups,
            Some(limits.max_groups.unwrap_or(self.defaults.groups)),
        );
        self.messages.set(limits.max_publish_msgs_per_sec);
        self.bytes.set(limits.max_publish_bytes_per_sec);
        let mut rates = self.pattern_rates.write();
        if rates.specs() != limits.pattern_rates {
            // New rules start with full buckets, as a new tenant rate does.
            let generation = self.pattern_generation.fetch_add(1, Ordering::Relaxed) + 1;
            *rates = Arc::new(PatternRates::new(&limits.pattern_rates, generation));
        }
    }

    /// [`Quota::admit_publishes`] to `subject`, under the rates of its patterns too
    /// (`client`'s own buckets for rules per client).
    pub fn admit_publishes_to(
        &self,
        subject: &str,
        client: &ClientRates,
        count: usize,
        bytes: usize,
    ) -> Result<(), Exceeded> {
        self.admit_publishes(count, bytes)?;
        let rates = Arc::clone(&self.pattern_rates.read());
        if rates.is_empty() {
            return Ok(());
        }
        let units = (count as u64, bytes as u64);
        match rates.take(&self.tenant, subject, client, units, (self.nanos(), false)) {
            Ok(_) => Ok(()),
            Err(exceeded) => {
                // Refused, so it spends nothing of the tenant's rates either.
                self.messages.refund(units.0);
                self.bytes.refund(units.1);
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(Exceeded::PatternRate(exceeded))
            }
        }
    }

    /// [`Quota::throttle_publish`] to `subject`, under the rates of its patterns too.
    pub fn throttle_publish_to(
        &self,
        subject: &str,
        client: &ClientRates,
        bytes: usize,
    ) -> Option<Duration> {
        let tenant = self.throttle_publish(bytes);
        let rates = Arc::clone(&self.pattern_rates.read());
        if rates.is_empty() {
            return tenant;
        }
        let units = (1, bytes as u64);
        let pattern = rates
            .take(&self.tenant, subject, client, units, (self.nanos(), true))
            .ok()
            .flatten();
        if pattern.is_some() && tenant.is_none() {
            self.throttled.fetch_add(1, Ordering::Relaxed);
        }
        tenant.max(pattern)
    }

    /// The per-client pattern buckets of `client` (a stable identity: an MQTT client
    /// id), shared by its connections now and later: one that went over its rate and
    /// reconnects finds its buckets as it left them. Buckets no connection holds are
    /// dropped once they are full again (then the same as new ones), when the map
    /// has doubled since the last pruning, so it holds about the clients connected.
    pub fn client_rates_of(&self, client: &str) -> Arc<ClientRates> {
        let now = self.nanos();
        let mut clients = self.clients.lock();
        let (map, prune_at) = &mut *clients;
        if map.len() >= *prune_at {
            map.retain(|_, rates| Arc::strong_count(rates) > 1 || !rates.rested(now));
            *prune_at = (map.len() * 2).max(CLIENTS_BEFORE_PRUNING);
        }
        Arc::clone(map.entry(Box::from(client)).or_default())
    }

    fn nanos(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Admits one publish of `bytes` (headers and payload), or says which rate it
    /// went over and how long to wait. Admitted publishes are counted by the caller,
    /// a batch at a time ([`Quota::count_admitted`]).
    pub fn admit_publish(&self, bytes: usize) -> Result<(), Exceeded> {
        self.admit_publishes(1, bytes)
    }

    /// Admits `count` publishes of `bytes` in all, all or none: an append's messages,
    /// refused together so a refused append spends nothing.
    pub fn admit_publishes(&self, count: usize, bytes: usize) -> Result<(), Exceeded> {
        let bytes = bytes as u64;
        let count = count as u64;
        let limited = self.messages.limit().is_some() || self.bytes.limit().is_some();
        if limited {
            let now = self.nanos();
            let refused = match self.messages.take(count, now, false) {
                Err(wait) => Some(Exceeded::MessageRate {
                    tenant: Arc::clone(&self.tenant),
                    limit: self.messages.limit().unwrap_or_default(),
                    wait,
                }),
                Ok(()) => self.bytes.take(bytes, now, false).err().map(|wait| {
                    // Refused, so it spends nothing of the message rate either.
                    self.messages.refund(count);
                    Exceeded::ByteRate {
                        tenant: Arc::clone(&self.tenant),
                        limit: self.bytes.limit().unwrap_or_default(),
                        wait,
                    }
                }),
            };
            if let Some(exceeded) = refused {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(exceeded);
            }
        }
        Ok(())
    }

    /// Whether one publish of `bytes` would be admitted by the tenant's rates now,
    /// taking nothing: a publish its plugins would run on is refused before they
    /// run, so a client over the rate costs no plugin time. (Taken and given back;
    /// the publish's own decision takes it for real.)
    pub fn would_admit(&self, bytes: usize) -> Result<(), Exceeded> {
        if self.messages.limit().is_none() && self.bytes.limit().is_none() {
            return Ok(());
        }
        self.admit_publishes(1, bytes)?;
        self.messages.refund(1);
        self.bytes.refund(bytes as u64);
        Ok(())
    }

    /// Adds admitted publishes to the tenant's counts: once per batch a connection
    /// read, not per message, so connections of one tenant do not contend per message.
    pub fn count_admitted(&self, msgs: u64, bytes: u64) {
        if msgs > 0 {
            self.published_msgs.fetch_add(msgs, Ordering::Relaxed);
            self.published_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Counts one publish of `bytes` and admits it whatever the rates; when it went
    /// over one, how long the publisher must now pause: throttling, for protocols
    /// that cannot refuse a publish without losing or lying about it.
    pub fn throttle_publish(&self, bytes: usize) -> Option<Duration> {
        let bytes = bytes as u64;
        if self.messages.limit().is_none() && self.bytes.limit().is_none() {
            return None;
        }
        let now = self.nanos();
        let waits = [
            self.messages.take(1, now, true).err(),
            self.bytes.take(bytes, now, true).err(),
        ];
        let wait = waits.into_iter().flatten().max();
        if wait.is_some() {
            self.throttled.fetch_add(1, Ordering::Relaxed);
        }
        wait
    }

    /// Takes a connection slot, given back when the slot drops.
    pub fn connect(self: &Arc<Self>) -> Result<ConnectionSlot, Exceeded> {
        let limit = self.max_connections.load(Ordering::Relaxed);
        let taken = self
            .connections
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            });
        match taken {
            Ok(_) => Ok(ConnectionSlot {
                quota: Arc::clone(self),
            }),
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(Exceeded::Connections {
                    tenant: Arc::clone(&self.tenant),
                    limit,
                })
            }
        }
    }

    /// Whether one more subscription fits, the tenant having `current` now.
    pub fn admit_subscription(&self, current: usize) -> Result<(), Exceeded> {
        let limit = self.max_subscriptions.load(Ordering::Relaxed);
        if (current as u64) < limit {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(Exceeded::Subscriptions {
            tenant: Arc::clone(&self.tenant),
            limit,
        })
    }

    /// Takes a place among the tenant's API calls running at once, given back when
    /// the place drops.
    pub fn api_call(self: &Arc<Self>) -> Result<ApiCallSlot, Exceeded> {
        let limit = self.max_api_calls.load(Ordering::Relaxed);
        match self
            .api_calls
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            }) {
            Ok(_) => Ok(ApiCallSlot {
                quota: Arc::clone(self),
            }),
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(Exceeded::ApiCalls {
                    tenant: Arc::clone(&self.tenant),
                    limit,
                })
            }
        }
    }

    /// The consumer groups the tenant may keep.
    pub fn max_groups(&self) -> u64 {
        self.max_groups.load(Ordering::Relaxed)
    }

    /// The refusal for a publish to a stored subject while the store is full.
    pub fn stored_bytes_exceeded(&self) -> Exceeded {
        self.refused.fetch_add(1, Ordering::Relaxed);
        Exceeded::StoredBytes {
            tenant: Arc::clone(&self.tenant),
        }
    }

    /// Counts now, with the rates of the last [`Quota::usage`] reading (taking no new
    /// one, so scraping metrics does not shorten `describe`'s rate window).
    pub fn counts(&self) -> LiveUsage {
        let last = *self.last_reading.lock();
        LiveUsage {
            connections: self.connections.load(Ordering::Relaxed),
            published_msgs: self.published_msgs.load(Ordering::Relaxed),
            published_bytes: self.published_bytes.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            throttled: self.throttled.load(Ordering::Relaxed),
            msgs_per_sec: last.msgs_per_sec,
            bytes_per_sec: last.bytes_per_sec,
        }
    }

    /// Counts and rates now. A rate is over the time since the previous reading
    /// when that was at least a second ago, else the previous reading's rate.
    pub fn usage(&self) -> LiveUsage {
        let msgs = self.published_msgs.load(Ordering::Relaxed);
        let bytes = self.published_bytes.load(Ordering::Relaxed);
        let mut last = self.last_reading.lock();
        let elapsed = last.at.elapsed();
        if elapsed >= Duration::from_secs(1) {
            let secs = elapsed.as_secs_f64();
            *last = Reading {
                at: Instant::now(),
                msgs,
                bytes,
                msgs_per_sec: (msgs - last.msgs) as f64 / secs,
                bytes_per_sec: (bytes - last.bytes) as f64 / secs,
            };
        }
        LiveUsage {
            connections: self.connections.load(Ordering::Relaxed),
            published_msgs: msgs,
            published_bytes: bytes,
            refused: self.refused.load(Ordering::Relaxed),
            throttled: self.throttled.load(Ordering::Relaxed),
            msgs_per_sec: last.msgs_per_sec,
            bytes_per_sec: last.bytes_per_sec,
        }
    }
}

/// An API call's place among its tenant's calls running at once.
#[derive(Debug)]
pub struct ApiCallSlot {
    quota: Arc<Quota>,
}

impl Drop for ApiCallSlot {
    fn drop(&mut self) {
        self.quota.api_calls.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection's place in its tenant's connection count.
#[derive(Debug)]
pub struct ConnectionSlot {
    quota: Arc<Quota>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.quota.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::rate::MAX_WAIT;
    use super::*;

    #[test]
    fn a_clients_buckets_are_shared_while_held_and_dropped_once_full_again() {
        let quota = Quota::new("t", None, TenantDefaults::default());
        let held = quota.client_rates_of("device-1");
        assert!(Arc::ptr_eq(&held, &quota.client_rates_of("device-1")));
        assert!(!Arc::ptr_eq(&held, &quota.client_rates_of("device-2")));
        drop(held);
        // Past the pruning size, released buckets that are full (these took nothing)
        // go; a held one stays.
        let kept = quota.client_rates_of("kept");
        for i in 0..CLIENTS_BEFORE_PRUNING {
            drop(quota.client_rates_of(&format!("c{i}")));
        }
        let clients = quota.clients.lock();
        assert!(
            clients.0.len() < CLIENTS_BEFORE_PRUNING,
            "{}",
            clients.0.len()
        );
        assert!(clients.0.get("kept").is_some_and(|r| Arc::ptr_eq(r, &kept)));
    }

    fn limits(msgs: Option<u64>, bytes: Option<u64>) -> TenantLimits {
        TenantLimits {
            max_publish_msgs_per_sec: msgs,
            max_publish_bytes_per_sec: bytes,
            max_connections: Some(2),
            max_subscriptions: Some(3),
            ..TenantLimits::default()
        }
    }

    #[test]
    fn a_rate_admits_one_second_of_burst_then_refuses_with_a_wait() {
        let rate = Rate::new();
        rate.set(Some(100));
        let now = 5_000_000_000;
        let admitted = (0..1000)
            .filter(|_| rate.take(1, now, false).is_ok())
            .count();
        assert_eq!(admitted, 100);
        let wait = rate.take(1, now, false).expect_err("over the rate");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(10),
            "{wait:?}"
        );
        // 10 ms later, one more unit fits.
        assert!(rate.take(1, now + 10_000_000, false).is_ok());
        assert!(rate.take(1, now + 10_000_000, false).is_err());
        // Idle for long, the bucket is full again, not more.
        let later = now + 60_000_000_000;
        assert_eq!(
            (0..1000)
                .filter(|_| rate.take(1, later, false).is_ok())
                .count(),
            100
        );
    }

    #[test]
    fn a_refund_gives_the_units_back() {
        let rate = Rate::new();
        rate.set(Some(2));
        let now = 3_000_000_000;
        assert!(rate.take(1, now, false).is_ok());
        rate.refund(1);
        assert!(rate.take(1, now, false).is_ok());
        assert!(rate.take(1, now, false).is_ok());
        assert!(rate.take(1, now, false).is_err());
    }

    #[test]
    fn a_message_larger_than_the_burst_passes_only_on_a_full_bucket() {
        let rate = Rate::new();
        rate.set(Some(1000));
        let now = 1_000_000_000;
        assert!(rate.take(5000, now, false).is_ok());
        let wait = rate
            .take(1, now, false)
            .expect_err("the debt is paid first");
        assert_eq!(wait, MAX_WAIT);
    }

    #[test]
    fn throttling_admits_everything_and_makes_the_publisher_wait() {
        let quota = Quota::new(
            "t",
            Some(&limits(Some(10), None)),
            TenantDefaults::default(),
        );
        let waits: Vec<_> = (0..12).map(|_| quota.throttle_publish(1)).collect();
        quota.count_admitted(12, 12);
        assert!(waits[..10].iter().all(Option::is_none));
        let (first, second) = (
            waits[10].expect("11th waits"),
            waits[11].expect("12th waits"),
        );
        assert!(
            second > first,
            "debt accumulates: {first:?} then {second:?}"
        );
        let usage = quota.usage();
        assert_eq!(
            (usage.published_msgs, usage.throttled, usage.refused),
            (12, 2, 0)
        );
    }

    #[test]
    fn without_limits_everything_passes_and_is_counted() {
        let quota = Arc::new(Quota::new("t", None, TenantDefaults::default()));
        for _ in 0..10_000 {
            assert!(quota.admit_publish(100).is_ok());
        }
        quota.count_admitted(10_000, 1_000_000);
        let slots: Vec<_> = (0..100)
            .map(|_| quota.connect().expect("no limit"))
            .collect();
        assert!(quota.admit_subscription(1_000_000).is_ok());
        let usage = quota.usage();
        assert_eq!(usage.published_msgs, 10_000);
        assert_eq!(usage.published_bytes, 1_000_000);
        assert_eq!(usage.connections, 100);
        drop(slots);
        assert_eq!(quota.usage().connections, 0);
    }

    #[test]
    fn connection_and_subscription_limits_hold_and_slots_come_back() {
        let quota = Arc::new(Quota::new(
            "t",
            Some(&limits(None, None)),
            TenantDefaults::default(),
        ));
        let first = quota.connect().expect("1 of 2");
        let _second = quota.connect().expect("2 of 2");
        let refused = quota.connect().expect_err("3 of 2");
        assert_eq!(
            refused.to_string(),
            "maximum connections exceeded: tenant t allows 2"
        );
        drop(first);
        assert!(quota.connect().is_ok());
        assert!(quota.admit_subscription(2).is_ok());
        assert!(matches!(
            quota.admit_subscription(3),
            Err(Exceeded::Subscriptions { limit: 3, .. })
        ));
    }

    #[test]
    fn a_byte_rate_refuses_what_the_message_rate_allows() {
        let quota = Quota::new(
            "t",
            Some(&limits(Some(1_000_000), Some(1000))),
            TenantDefaults::default(),
        );
        assert!(quota.admit_publish(600).is_ok());
        assert!(quota.admit_publish(300).is_ok());
        let refused = quota.admit_publish(300).expect_err("over 1000 bytes");

        assert!(matches!(refused, Exceeded::ByteRate { limit: 1000, .. }));
        assert!(refused.wait().is_some());
        assert_eq!(quota.usage().refused, 1);
        // Raising the limit applies at once.
        quota.set_limits(&limits(None, None));
        assert!(quota.admit_publish(1_000_000).is_ok());
    }

    #[test]
    fn api_calls_and_groups_follow_the_record_else_the_server_defaults() {
        let defaults = TenantDefaults {
            api_calls: 2,
            groups: 7,
        };
        let quota = Arc::new(Quota::new("t", None, defaults));
        assert_eq!(quota.max_groups(), 7);
        let first = quota.api_call().expect("1 of 2");
        let _second = quota.api_call().expect("2 of 2");
        assert!(matches!(
            quota.api_call(),
            Err(Exceeded::ApiCalls { limit: 2, .. })
        ));
        drop(first);
        let _third = quota.api_call().expect("a place came back");
        quota.set_limits(&TenantLimits {
            max_api_calls: Some(3),
            max_groups: Some(1),
            ..TenantLimits::default()
        });
        assert_eq!(quota.max_groups(), 1);
        let _fourth = quota.api_call().expect("3 of 3");
        assert!(quota.api_call().is_err());
        // A record without them falls back to the server's.
        quota.set_limits(&TenantLimits::default());
        assert_eq!(quota.max_groups(), 7);
    }
}
