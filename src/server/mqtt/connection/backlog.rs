//! What a session owes beyond the live stream: resuming a saved session, reading
//! the stored backlog and retained messages, and saving the session record.
//! Store reads happen here, boxed away from the idle loop.

use super::*;

impl Connection {
    /// Restores a saved session: its subscriptions go live, its deliveries in flight
    /// are sent again with DUP, and its backlog is read from the cursor.
    pub(super) async fn resume(&mut self, record: SessionRecord) {
        for saved in record.subscriptions {
            // Checked again as new: the rules or limits may have changed, and the
            // client id may now be another user's. One that fails is dropped.
            let _ = self.add_subscription(saved, true);
        }
        for pid in record.inbound_qos2 {
            self.flow_in.received(pid);
        }
        for saved in record.inflight {
            if self
                .broker
                .authorizer()
                .authorize(self.session.principal(), Action::Subscribe, &saved.subject)
                .is_err()
            {
                // Not this user's to receive: the delivery is forgotten.
                continue;
            }
            let delivery = Delivery {
                owed: 0,
                qos: saved.qos,
                retain: saved.retain,
                subscription_ids: saved.subscription_ids,
                version: saved.version,
                offset: saved.offset,
                time_ms: saved.time_ms,
                subject: Bytes::from(saved.subject),
                reply: saved.reply,
                headers: saved.headers,
                payload: saved.payload,
            };
            match saved.stage {
                Stage::Published => self.write_publish(&delivery, saved.packet_id, true),
                Stage::Released => self.put_control(&Packet::PubRel(Ack::new(saved.packet_id))),
            }
            self.flow_out
                .restore(saved.packet_id, saved.stage, saved.qos, delivery);
        }
        self.high_offset = record.cursor.saturating_sub(1);
        let has_filters = self.subs.values().any(|s| !s.shared);
        if let Some(store) = self.store.clone()
            && has_filters
        {
            // Every message routed before the subscriptions went live is durable
            // after this, so the backlog read below misses none of them.
            let _ = store.durable_barrier().await;
            let config = &self.context.config.mqtt;
            let min_time = self
                .broker
                .clock()
                .now_ms()
                .saturating_sub(config.backlog_max_age_secs.saturating_mul(1000));
            let matcher = self.matcher();
            let matches = |subject: &str| matcher.matches(subject);
            match store
                .backlog_start(
                    &self.session.routes().name,
                    &matches,
                    record.cursor.max(1),
                    min_time,
                    config.backlog_max_messages,
                    config.backlog_max_bytes,
                )
                .await
            {
                Ok((start, skipped)) => {
                    if skipped > 0 {
                        tracing::info!(
                            client = %self.key.1,
                            skipped,
                            "mqtt session backlog over its bounds: the oldest messages are skipped"
                        );
                    }
                    let follower = crate::follow::Follower::new(
                        Arc::clone(&store),
                        Arc::clone(&self.session.routes().name),
                        crate::follow::Target::Filters,
                        ReplayFrom::Offset(start),
                    )
                    .pages_of(STORE_PAGE, STORE_PAGE_BYTES);
                    self.backlog = Some(Box::new(Backlog {
                        follower,
                        done: false,
                    }));
                }
                Err(error) => {
                    tracing::warn!(%error, client = %self.key.1, "cannot read the session backlog");
                }
            }
        }
    }

    /// The session's non-shared filters, for reading its backlog.
    pub(super) fn matcher(&self) -> SessionMatcher {
        let mut trie = Trie::new();
        for entry in self.subs.values().filter(|e| !e.shared) {
            trie.insert(&entry.pattern, None, entry.saved.clone());
        }
        SessionMatcher { trie }
    }

    /// Whether [`Connection::catch_up`] has anything to do.
    pub(super) fn has_store_work(&self) -> bool {
        !self.session.appends.is_empty()
            || self.session_dirty
            || self.session_stale()
            || (self.queued_bytes < self.context.config.mqtt.max_queued_bytes
                && (!self.retained_jobs.is_empty()
                    || self.backlog.as_ref().is_some_and(|b| !b.done)))
    }

    /// A persistent session's cursor or acks moved since it was last saved, long
    /// enough ago: saving it now and then bounds what a crash re-delivers, without a
    /// durable write per message.
    pub(super) fn session_stale(&self) -> bool {
        self.persistent()
            && self.saved_at.elapsed() >= SESSION_SAVE_EVERY
            && self.high_offset != self.saved_high
    }

    /// Asynchronous work the last step left: appends for the store, store acks,
    /// retained messages and backlog pages, a session save.
    pub(super) async fn catch_up(&mut self) -> Result<(), Close> {
        if !self.session.appends.is_empty() && !self.session.send_appends().await {
            return Err(Close::protocol(
                reason::SERVER_SHUTTING_DOWN,
                "the store is closing",
            ));
        }
        self.take_store_acks()?;
        let room = self.queued_bytes < self.context.config.mqtt.max_queued_bytes;
        if room && let Some(store) = self.store.clone() {
            if !self.retained_jobs.is_empty() {
                self.retained_page(&store).await;
            } else if self.backlog.as_ref().is_some_and(|b| !b.done) {
                self.backlog_page().await;
            }
        }
        if self.session_dirty || self.session_stale() {
            self.session_dirty = false;
            self.save_session(false).await;
        }
        Ok(())
    }

    /// Queues the next page of the oldest retained-message job.
    async fn retained_page(&mut self, store: &Store) {
        let Some(job) = self.retained_jobs.front_mut() else {
            return;
        };
        let page = store
            .retained(
                &self.session.routes().name,
                &job.pattern,
                job.after.as_deref(),
                STORE_PAGE,
                STORE_PAGE_BYTES,
            )
            .await;
        let options = job.options;
        match page {
            Ok(page) => {
                match page.next {
                    Some(next) => job.after = Some(next),
                    None => {
                        self.retained_jobs.pop_front();
                    }
                }
                let now = self.broker.clock().now_ms();
                for message in page.messages {
                    let age = now.saturating_sub(message.time_ms) / 1000;
                    if translate::expired(&message.headers, age)
                        || !self.broker.authorizer().may_deliver(&message.subject)
                    {
                        continue;
                    }
                    self.enqueue_plugged(Delivery {
                        owed: 0,
                        qos: options.qos.min(qos_cap(message.flags)),
                        retain: true,
                        subscription_ids: ids(options.subscription_id),
                        version: message.version,
                        // Retained messages are outside the cursor's order.
                        offset: 0,
                        time_ms: message.time_ms,
                        subject: Bytes::from(message.subject),
                        reply: Bytes::new(),
                        headers: message.headers,
                        payload: message.payload,
                    });
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read retained messages");
                self.retained_jobs.pop_front();
            }
        }
        self.session.outbox.wake();
    }

    /// Queues a stored or retained message through the tenant's deliver plugins of
    /// its subject, as routing does for live ones: withheld, changed, or as it is.
    fn enqueue_plugged(&mut self, mut delivery: Delivery) {
        let routes = self.session.routes();
        let subject = String::from_utf8_lossy(&delivery.subject).into_owned();
        let chain = routes.plugins.deliver_chain(&subject);
        if !chain.is_empty() {
            let reader = self.session.outbox.reader();
            let input = (&delivery.headers[..], &delivery.payload[..]);
            match crate::plugins::TenantPlugins::on_deliver(
                &chain,
                &subject,
                input,
                (&reader, false),
            ) {
                crate::plugins::Delivered::Unchanged => {}
                crate::plugins::Delivered::Withheld => return,
                crate::plugins::Delivered::Replaced { headers, payload } => {
                    delivery.headers = headers;
                    delivery.payload = payload;
                }
            }
        }
        self.enqueue(delivery);
    }

    /// Queues the next page of the session's stored backlog.
    async fn backlog_page(&mut self) {
        // The filters as they are now: subscriptions may change between pages.
        let matcher = self.matcher();
        let authz = Arc::clone(self.broker.authorizer());
        let matches = |subject: &str| matcher.matches(subject) && authz.may_deliver(subject);
        let page = match self.backlog.as_mut() {
            Some(backlog) => backlog.follower.next_matching(&matches).await,
            None => Ok(crate::follow::Page::default()),
        };
        match page {
            Ok(page) => {
                let now = self.broker.clock().now_ms();
                for message in page.messages {
                    let age = now.saturating_sub(message.time_ms) / 1000;
                    self.high_offset = self.high_offset.max(message.offset);
                    // Deliveries in flight were sent again with DUP already.
                    let resent = self
                        .flow_out
                        .inflight()
                        .iter()
                        .any(|i| i.delivery.offset == message.offset);
                    if resent || translate::expired(&message.headers, age) {
                        continue;
                    }
                    let (qos, subscription_ids) = matcher.delivery(&message.subject, message.flags);
                    let retain = message.flags & envelope::FLAG_RETAIN != 0
                        && matcher.keeps_retain(&message.subject);
                    self.enqueue_plugged(Delivery {
                        owed: 0,
                        qos,
                        retain,
                        subscription_ids,
                        version: message.version,
                        offset: message.offset,
                        time_ms: message.time_ms,
                        subject: Bytes::from(message.subject),
                        reply: Bytes::new(),
                        headers: message.headers,
                        payload: message.payload,
                    });
                }
                self.high_offset = self.high_offset.max(page.next.saturating_sub(1));
                self.backlog_high = self.backlog_high.max(page.next.saturating_sub(1));
                if let Some(backlog) = &mut self.backlog {
                    backlog.done = page.caught_up;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the session backlog; going live");
                if let Some(backlog) = &mut self.backlog {
                    backlog.done = true;
                }
            }
        }
        self.session.outbox.wake();
    }

    /// The session as it should be saved now.
    pub(super) fn record(&self, disconnected: bool) -> SessionRecord {
        // The cursor is the oldest stored message the client has not acknowledged.
        let unacked = self
            .flow_out
            .inflight()
            .iter()
            .map(|i| i.delivery.offset)
            .chain(self.queue.iter().map(|d| d.offset))
            .filter(|o| *o > 0)
            .min();
        let mut cursor = self.high_offset + 1;
        if let Some(oldest) = unacked {
            cursor = cursor.min(oldest);
        }
        if let Some(backlog) = self.backlog.as_ref().filter(|b| !b.done) {
            cursor = cursor.min(backlog.follower.position());
        }
        SessionRecord {
            version: RECORD_VERSION,
            expiry_secs: self.session_expiry,
            disconnected_ms: if disconnected {
                self.broker.clock().now_ms()
            } else {
                0
            },
            cursor,
            subscriptions: self.subs.values().map(|s| s.saved.clone()).collect(),
            inflight: self
                .flow_out
                .inflight()
                .iter()
                .map(|i| SavedInflight {
                    packet_id: i.packet_id,
                    stage: i.stage,
                    qos: i.delivery.qos,
                    retain: i.delivery.retain,
                    offset: i.delivery.offset,
                    version: i.delivery.version,
                    time_ms: i.delivery.time_ms,
                    subscription_ids: i.delivery.subscription_ids.clone(),
                    subject: String::from_utf8_lossy(&i.delivery.subject).into_owned(),
                    reply: i.delivery.reply.clone(),
                    headers: i.delivery.headers.clone(),
                    payload: i.delivery.payload.clone(),
                })
                .collect(),
            inbound_qos2: self.flow_in.awaiting_release().collect(),
        }
    }

    pub(super) async fn save_session(&mut self, disconnected: bool) {
        let Some(store) = self.store.clone() else {
            return;
        };
        let state = if self.persistent() {
            Some(self.record(disconnected).encode())
        } else {
            None
        };
        self.saved_record = state.is_some();
        self.saved_at = Instant::now();
        self.saved_high = self.high_offset;
        if let Err(error) = store
            .save_session(&self.key.0, &self.key.1, state.as_deref())
            .await
        {
            tracing::warn!(%error, client = %self.key.1, "cannot save the mqtt session");
        }
    }
}

/// Which of a session's filters match a subject, for reading its backlog.
pub(super) struct SessionMatcher {
    pub(super) trie: Trie<SavedSubscription>,
}

impl SessionMatcher {
    pub(super) fn matches(&self, subject: &str) -> bool {
        let mut any = false;
        self.trie
            .for_each_match(subject, &mut |plain, _| any |= !plain.is_empty());
        any
    }

    /// One delivery for all matching subscriptions: the highest QoS any grants
    /// (capped by the publish's) and every subscription identifier.
    pub(super) fn delivery(&self, subject: &str, flags: u8) -> (u8, Vec<u32>) {
        let (mut qos, mut ids) = (0u8, Vec::new());
        self.trie.for_each_match(subject, &mut |plain, _| {
            for saved in plain {
                qos = qos.max(saved.qos);
                if saved.subscription_id != 0 && !ids.contains(&saved.subscription_id) {
                    ids.push(saved.subscription_id);
                }
            }
        });
        (qos.min(qos_cap(flags)), ids)
    }

    pub(super) fn keeps_retain(&self, subject: &str) -> bool {
        let mut keep = false;
        self.trie.for_each_match(subject, &mut |plain, _| {
            keep |= plain.iter().any(|s| s.retain_as_published);
        });
        keep
    }
}
