//! SUBSCRIBE and UNSUBSCRIBE: filters checked by the client core, shared
//! subscriptions, overlapping filters marked for one-copy delivery, retained
//! messages queued for reading.

use super::*;

impl Connection {
    pub(super) fn subscribe(&mut self, subscribe: Subscribe) -> Result<(), Close> {
        if subscribe
            .filters
            .iter()
            .any(|f| f.no_local && f.filter.starts_with("$share/"))
        {
            return Err(Close::protocol(
                reason::PROTOCOL_ERROR,
                "no-local cannot be set on a shared subscription",
            ));
        }
        let subscription_id = subscribe
            .properties
            .subscription_identifiers
            .first()
            .copied()
            .unwrap_or(0);
        let mut codes = Vec::with_capacity(subscribe.filters.len());
        let mut refused = Vec::new();
        for filter in subscribe.filters {
            let saved = SavedSubscription {
                filter: filter.filter.clone(),
                qos: filter.qos as u8,
                no_local: filter.no_local,
                retain_as_published: filter.retain_as_published,
                subscription_id,
            };
            let code = match self.add_subscription(saved, true) {
                Ok((pattern, options, is_new, shared)) => {
                    let wants_retained = match filter.retain_handling {
                        0 => true,
                        1 => is_new,
                        _ => false,
                    };
                    if wants_retained && !shared {
                        self.retained_jobs.push_back(RetainedJob {
                            pattern,
                            options,
                            after: None,
                        });
                    }
                    filter.qos as u8
                }
                Err(code) => {
                    refused.push(format!("{}: {}", filter.filter, refusal(code)));
                    if self.level == Level::V5 {
                        code
                    } else {
                        reason::UNSPECIFIED_ERROR
                    }
                }
            };
            codes.push(code);
        }
        self.session_dirty |= self.persistent();
        let why = (!refused.is_empty()).then(|| refused.join("; "));
        let properties = self.ack_properties(why);
        self.put_control(&Packet::SubAck(SubAck {
            packet_id: subscribe.packet_id,
            codes,
            properties,
        }));
        Ok(())
    }

    /// Adds (or replaces) one subscription. Returns its pattern, its options,
    /// whether it is new and whether it is shared; or the v5 reason code refusing it.
    pub(super) fn add_subscription(
        &mut self,
        saved: SavedSubscription,
        check: bool,
    ) -> Result<(Pattern, MqttOptions, bool, bool), u8> {
        let (group, filter) = match saved.filter.strip_prefix("$share/") {
            Some(rest) => match rest.split_once('/') {
                Some((group, filter))
                    if !group.is_empty() && !group.contains(['+', '#']) && !filter.is_empty() =>
                {
                    (Some(group), filter)
                }
                _ => return Err(reason::TOPIC_FILTER_INVALID),
            },
            None => (None, saved.filter.as_str()),
        };
        if group.is_some() && saved.no_local {
            return Err(reason::PROTOCOL_ERROR);
        }
        let pattern = Pattern::parse_mqtt_with(filter, &self.context.subject_limits)
            .map_err(|_| reason::TOPIC_FILTER_INVALID)?;
        let native = pattern.to_string();
        let replacing = self.subs.contains_key(&saved.filter);
        if check
            && let Err(refused) = self
                .session
                .admit_subscription(&native, &pattern, replacing)
        {
            tracing::debug!(conn = self.id, %refused, "mqtt subscription refused");
            return Err(match refused {
                SubscribeRefusal::Denied(_) | SubscribeRefusal::InboxTaken(_) => {
                    reason::NOT_AUTHORIZED
                }
                SubscribeRefusal::OverQuota(_) | SubscribeRefusal::TooMany(_) => {
                    reason::QUOTA_EXCEEDED
                }
            });
        }
        let options = MqttOptions {
            qos: saved.qos.min(2),
            no_local: saved.no_local,
            retain_as_published: saved.retain_as_published,
            subscription_id: saved.subscription_id,
        };
        let previous = self.subs.remove(&saved.filter);
        if let Some(old) = &previous {
            self.session.unsubscribe(&old.sub);
        }
        let sub = self.session.subscribe(
            Bytes::copy_from_slice(saved.filter.as_bytes()),
            pattern.clone(),
            group,
            Some(options),
        );
        let shared = group.is_some();
        if !shared {
            // One copy per message for overlapping filters: routing merges the
            // deliveries of subscriptions marked as overlapping.
            for other in self.subs.values().filter(|o| !o.shared) {
                if crate::tenancy::acl::patterns_overlap(&other.pattern, &pattern) {
                    other.sub.overlapping.store(true, Ordering::Relaxed);
                    sub.overlapping.store(true, Ordering::Relaxed);
                }
            }
        }
        self.subs.insert(
            saved.filter.clone(),
            SubEntry {
                saved,
                sub,
                pattern: pattern.clone(),
                shared,
            },
        );
        Ok((pattern, options, previous.is_none(), shared))
    }

    pub(super) fn unsubscribe(&mut self, unsubscribe: Unsubscribe) {
        let mut codes = Vec::with_capacity(unsubscribe.filters.len());
        for filter in &unsubscribe.filters {
            let code = match self.subs.remove(filter) {
                Some(entry) => {
                    self.session.unsubscribe(&entry.sub);
                    reason::SUCCESS
                }
                None => reason::NO_SUBSCRIPTION_EXISTED,
            };
            codes.push(code);
        }
        self.session_dirty |= self.persistent();
        if self.level != Level::V5 {
            codes.clear();
        }
        self.put_control(&Packet::UnsubAck(UnsubAck {
            packet_id: unsubscribe.packet_id,
            codes,
            properties: Properties::default(),
        }));
    }
}

/// What a SUBACK failure code means, for its reason string.
pub(super) fn refusal(code: u8) -> &'static str {
    match code {
        reason::NOT_AUTHORIZED => "not authorized",
        reason::TOPIC_FILTER_INVALID => "not a valid topic filter",
        reason::QUOTA_EXCEEDED => "too many subscriptions on this connection",
        _ => "refused",
    }
}
