//! Publish rates per pattern (a tenant's `pattern_rates`): messages and bytes per
//! second on the publishes to a pattern's subjects, beside the tenant's own rates.
//! A rule's buckets are shared by all of the tenant's publishers, or (`per_client`)
//! each client's own: kept in its [`ClientRates`], which its connection's publisher
//! and the will it leaves share. Every rule whose pattern matches a subject applies.
//! Must never: keep buckets for more rules than [`MAX_PATTERN_RATES`] per client, or
//! spend a refused publish's units (what earlier buckets took is given back).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use canopy_subjects::{Pattern, Trie};
use parking_lot::Mutex;

use super::rate::Rate;
use crate::store::PatternRate;

/// A publish over one of its tenant's `pattern_rates`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "publish rate exceeded: tenant {tenant} allows {limit} {unit}/s on {pattern}{}",
    if *per_client { " per client" } else { "" }
)]
pub struct PatternRateExceeded {
    pub tenant: Arc<str>,
    pub pattern: String,
    pub limit: u64,
    pub unit: &'static str,
    pub per_client: bool,
    pub wait: Duration,
}

/// Rules one tenant may have.
pub const MAX_PATTERN_RATES: usize = 64;

/// One rule and, unless it is per client, its shared buckets.
struct Rule {
    spec: PatternRate,
    messages: Rate,
    bytes: Rate,
}

/// A tenant's rules as they are now: swapped whole when its limits change.
#[derive(Default)]
pub(super) struct PatternRates {
    rules: Vec<Rule>,
    trie: Trie<usize>,
    /// Tells a client's buckets of an earlier set of rules from this one's.
    generation: u64,
}

impl std::fmt::Debug for PatternRates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PatternRates")
            .field("rules", &self.rules.len())
            .field("generation", &self.generation)
            .finish()
    }
}

impl PatternRates {
    /// The rules of `specs` (patterns that do not parse are left out: the API
    /// refuses them before they are stored).
    pub(super) fn new(specs: &[PatternRate], generation: u64) -> Self {
        let mut rules = Vec::new();
        let mut trie = Trie::new();
        for spec in specs.iter().take(MAX_PATTERN_RATES) {
            let Ok(pattern) = Pattern::parse_native(&spec.pattern) else {
                continue;
            };
            let rule = Rule {
                spec: spec.clone(),
                messages: Rate::new(),
                bytes: Rate::new(),
            };
            rule.messages.set(spec.msgs_per_sec);
            rule.bytes.set(spec.bytes_per_sec);
            trie.insert(&pattern, None, rules.len());
            rules.push(rule);
        }
        Self {
            rules,
            trie,
            generation,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules as given (those whose pattern parsed).
    pub(super) fn specs(&self) -> Vec<PatternRate> {
        self.rules.iter().map(|rule| rule.spec.clone()).collect()
    }

    /// Takes `count` messages of `bytes` from every rule `subject` falls under, at
    /// `now` (the quota's clock). Refused (unless `force`): what was taken is given
    /// back, and the rule and how long to wait are said. With `force` (a publish that
    /// cannot be refused) everything is taken, and the longest wait is returned.
    pub(super) fn take(
        &self,
        tenant: &Arc<str>,
        subject: &str,
        client: &ClientRates,
        (count, bytes): (u64, u64),
        (now, force): (u64, bool),
    ) -> Result<Option<Duration>, Box<PatternRateExceeded>> {
        let mut matched: Vec<usize> = Vec::new();
        self.trie.for_each_match(subject, &mut |found, _| {
            matched.extend(found.iter().copied());
        });
        if matched.is_empty() {
            return Ok(None);
        }
        matched.sort_unstable();
        matched.dedup();
        let mut own = client.buckets.lock();
        own.retain(|(generation, _), _| *generation == self.generation);
        for &i in &matched {
            let spec = &self.rules[i].spec;
            if spec.per_client {
                own.entry((self.generation, i)).or_insert_with(|| {
                    let pair = (Rate::new(), Rate::new());
                    pair.0.set(spec.msgs_per_sec);
                    pair.1.set(spec.bytes_per_sec);
                    pair
                });
            }
        }
        let own = &*own;
        let mut taken: Vec<(&Rate, u64)> = Vec::new();
        let mut longest: Option<Duration> = None;
        for i in matched {
            let rule = &self.rules[i];
            let (messages, bytes_rate) = match own.get(&(self.generation, i)) {
                Some((m, b)) if rule.spec.per_client => (m, b),
                _ => (&rule.messages, &rule.bytes),
            };
            for (rate, units, unit, limit) in [
                (messages, count, "messages", rule.spec.msgs_per_sec),
                (bytes_rate, bytes, "bytes", rule.spec.bytes_per_sec),
            ] {
                match rate.take(units, now, force) {
                    Ok(()) => taken.push((rate, units)),
                    Err(wait) if force => {
                        longest = Some(longest.map_or(wait, |l| l.max(wait)));
                    }
                    Err(wait) => {
                        for (rate, units) in taken {
                            rate.refund(units);
                        }
                        return Err(Box::new(PatternRateExceeded {
                            tenant: Arc::clone(tenant),
                            pattern: rule.spec.pattern.clone(),
                            limit: limit.unwrap_or_default(),
                            unit,
                            per_client: rule.spec.per_client,
                            wait,
                        }));
                    }
                }
            }
        }
        Ok(longest)
    }
}

/// One client's buckets of its tenant's `per_client` rules, by rule set and rule.
#[derive(Default)]
pub struct ClientRates {
    buckets: Mutex<HashMap<(u64, usize), (Rate, Rate)>>,
}

impl ClientRates {
    /// Whether every bucket is full at `now`: dropping them loses nothing.
    pub(super) fn rested(&self, now: u64) -> bool {
        self.buckets
            .lock()
            .values()
            .all(|(messages, bytes)| messages.rested(now) && bytes.rested(now))
    }
}

impl std::fmt::Debug for ClientRates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientRates")
            .field("buckets", &self.buckets.lock().len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(pattern: &str, msgs: u64, per_client: bool) -> PatternRate {
        PatternRate {
            pattern: pattern.into(),
            msgs_per_sec: Some(msgs),
            bytes_per_sec: None,
            per_client,
        }
    }

    /// Takes one message at `now`, refusable.
    fn take(rates: &PatternRates, subject: &str, client: &ClientRates) -> bool {
        let tenant: Arc<str> = Arc::from("t");
        rates
            .take(&tenant, subject, client, (1, 10), (0, false))
            .is_ok()
    }

    #[test]
    fn shared_rules_are_one_bucket_and_per_client_rules_one_each() {
        let rates = PatternRates::new(&[rule("a.>", 2, false), rule("b.>", 2, true)], 1);
        let (one, two) = (ClientRates::default(), ClientRates::default());
        // A second's burst: 2 messages at a time of 0, shared across clients on a.>.
        assert!(take(&rates, "a.x", &one) && take(&rates, "a.y", &two));
        assert!(!take(&rates, "a.x", &one), "the shared bucket is spent");
        assert!(take(&rates, "b.x", &one) && take(&rates, "b.x", &one));
        assert!(
            !take(&rates, "b.x", &one),
            "the first client's own is spent"
        );
        assert!(take(&rates, "b.x", &two), "the second client has its own");
        assert!(take(&rates, "c.x", &one), "no rule: no limit");
    }

    #[test]
    fn a_refusal_gives_back_what_earlier_rules_took() {
        // b.x falls under both rules, b.y under the first only.
        let rates = PatternRates::new(&[rule("b.*", 3, false), rule("b.x", 1, false)], 1);
        let client = ClientRates::default();
        assert!(take(&rates, "b.x", &client), "each rule takes one");
        for _ in 0..5 {
            assert!(!take(&rates, "b.x", &client), "b.x's own rule is spent");
        }
        // Had the refused ones kept what b.* gave them, b.* would be spent too.
        assert!(take(&rates, "b.y", &client) && take(&rates, "b.y", &client));
        assert!(!take(&rates, "b.y", &client), "now b.* is spent");
    }
}
