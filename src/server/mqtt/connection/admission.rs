//! Letting an MQTT client in: its login, the checks on its CONNECT (will topic,
//! client id, quota slot), taking over a session and answering CONNACK. Never
//! reads a packet after CONNECT.

use super::*;

impl Connection {
    /// Checks the CONNECT, takes the client id over, restores or clears the session
    /// and answers CONNACK. `None` when the connection was refused (and told).
    pub(super) async fn accept(
        connect: Box<Connect>,
        peer: SocketAddr,
        context: &Arc<MqttContext>,
        certified: Option<String>,
        mut decoder: Decoder,
        writer: &mut (impl AsyncWrite + Unpin),
    ) -> Option<Connection> {
        let config = &context.config.mqtt;
        let level = connect.level;
        decoder.set_level(level);
        let refuse = |code_v5: u8, code_v3: u8, why: &str| {
            let mut out = BytesMut::new();
            let mut properties = Properties::default();
            if level == Level::V5 {
                properties.reason_string = Some(why.to_owned());
            }
            let code = if level == Level::V5 { code_v5 } else { code_v3 };
            let _ = encode(
                &Packet::ConnAck(ConnAck {
                    session_present: false,
                    code,
                    properties,
                }),
                level,
                &mut out,
            );
            out
        };
        let broker = Arc::clone(&context.broker);
        let id = broker.next_id();
        let props = &connect.properties;
        if props.authentication_method.is_some() {
            let out = refuse(
                reason::BAD_AUTHENTICATION_METHOD,
                reason::V3_NOT_AUTHORIZED,
                "enhanced authentication is not supported",
            );
            let _ = writer.write_all(&out).await;
            return None;
        }
        let (client_id, assigned) = if connect.client_id.is_empty() {
            // MQTT 3.1 requires a client id; 3.1.1 allows none with a clean session.
            if level == Level::V31 || (!connect.clean_start && level != Level::V5) {
                let out = refuse(
                    reason::CLIENT_IDENTIFIER_NOT_VALID,
                    reason::V3_IDENTIFIER_REJECTED,
                    "an empty client id needs a clean session",
                );
                let _ = writer.write_all(&out).await;
                return None;
            }
            (format!("canopy-{id}-{:08x}", fastrand::u32(..)), true)
        } else {
            (connect.client_id.clone(), false)
        };
        let principal = if context.config.authz.require_login {
            match log_in(&broker, &connect, &client_id, certified).await {
                Some(principal) => principal,
                None => {
                    tokio::time::sleep(crate::tenancy::login::FAILED_LOGIN_DELAY).await;
                    let out = refuse(
                        reason::BAD_USER_NAME_OR_PASSWORD,
                        reason::V3_BAD_USER_NAME_OR_PASSWORD,
                        "bad user name or password",
                    );
                    let _ = writer.write_all(&out).await;
                    return None;
                }
            }
        } else {
            Principal::anonymous(client_id.as_str())
        };
        if let Some(will) = &connect.will {
            let publisher = Publisher::new(
                Arc::clone(&broker),
                broker.tenant(&principal.tenant),
                principal.clone(),
                Arc::clone(&context.session_limits),
                id,
            );
            let checked = Subject::parse_mqtt_with(&will.topic, &context.subject_limits)
                .map_err(|e| Refusal::InvalidSubject(e.to_string()))
                .and_then(|s| publisher.check_target(s.as_str()));
            if let Err(refused) = checked {
                let out = refuse(
                    mqtt_code(&refused),
                    reason::V3_NOT_AUTHORIZED,
                    &format!("the will topic cannot be used: {refused}"),
                );
                let _ = writer.write_all(&out).await;
                return None;
            }
        }

        let mut keep_alive = connect.keep_alive;
        let mut server_keep_alive = None;
        if config.max_keep_alive_secs > 0
            && (keep_alive == 0 || keep_alive > config.max_keep_alive_secs)
            && level == Level::V5
        {
            keep_alive = config.max_keep_alive_secs;
            server_keep_alive = Some(keep_alive);
        }
        let session_expiry = match level {
            Level::V5 => props
                .session_expiry_interval
                .unwrap_or(0)
                .min(config.max_session_expiry_secs),
            _ if connect.clean_start => 0,
            _ => config.v3_session_expiry_secs,
        };

        let key: SessionKey = (Arc::clone(&principal.tenant), client_id.clone());
        let claim = context.sessions.claim(&key, id);
        let taking_over = claim.previous.is_some();
        if let Some(previous) = claim.previous.clone() {
            // The previous holder saves its session before letting go.
            let _ = tokio::time::timeout(Duration::from_secs(10), previous.released()).await;
        }
        // The slot comes after a takeover, so a device reconnecting over its own dead
        // connection is not refused for the place that connection still holds.
        let quota = Arc::clone(&broker.tenant(&principal.tenant).quota);
        let mut slot = quota.connect();
        for _ in 0..100 {
            if slot.is_ok() || !taking_over {
                break;
            }
            // The previous holder gives its place back as its task ends.
            tokio::time::sleep(Duration::from_millis(10)).await;
            slot = quota.connect();
        }
        let slot = match slot {
            Ok(slot) => slot,
            Err(exceeded) => {
                tracing::info!(%peer, %exceeded, "mqtt connection refused");
                let out = refuse(
                    reason::QUOTA_EXCEEDED,
                    reason::V3_SERVER_UNAVAILABLE,
                    &exceeded.to_string(),
                );
                let _ = writer.write_all(&out).await;
                context.sessions.release(&key, id, false);
                claim.handoff.release();
                return None;
            }
        };
        let store = broker.store().cloned();
        let saved = match (&store, connect.clean_start) {
            (Some(store), true) => {
                // A lookup first (bloom filters answer it for the many clients that
                // never had a session): a delete is a durable write.
                let exists = store
                    .session(&key.0, &key.1)
                    .await
                    .map_or(true, |s| s.is_some());
                if exists && let Err(error) = store.save_session(&key.0, &key.1, None).await {
                    tracing::warn!(%error, client = %client_id, "cannot clear the saved mqtt session");
                }
                None
            }
            (Some(store), false) => match store.session(&key.0, &key.1).await {
                Ok(Some(bytes)) => match SessionRecord::decode(&bytes) {
                    Some(record) if !record.expired(broker.clock().now_ms()) => Some(record),
                    Some(_) => None,
                    None => {
                        tracing::warn!(client = %client_id, "a saved mqtt session cannot be read; starting afresh");
                        None
                    }
                },
                Ok(None) => None,
                Err(error) => {
                    tracing::warn!(%error, client = %client_id, "cannot read the saved mqtt session");
                    let out = refuse(
                        reason::SERVER_UNAVAILABLE,
                        reason::V3_SERVER_UNAVAILABLE,
                        "the session store cannot be read",
                    );
                    let _ = writer.write_all(&out).await;
                    context.sessions.release(&key, id, false);
                    claim.handoff.release();
                    return None;
                }
            },
            (None, _) => None,
        };

        let outbox = Arc::new(Outbox::new(
            id,
            config.max_pending_bytes,
            Arc::clone(broker.metrics()),
        ));
        let acks = Arc::new(AckInbox::new(Arc::clone(&outbox)));
        broker.mqtt_acks().register(id, Arc::clone(&acks));
        let window = usize::from(
            props
                .receive_maximum
                .unwrap_or(config.max_inflight)
                .min(config.max_inflight.max(1)),
        );
        let routes = broker.tenant(&principal.tenant);
        let mut session = Session::new(
            Arc::clone(&broker),
            routes,
            principal,
            outbox,
            Arc::clone(&context.session_limits),
        );
        session.hold_slot(slot);
        let mut connection = Connection {
            id,
            peer,
            context: Arc::clone(context),
            broker,
            store,
            session,
            level,
            key,
            claim,
            decoder,
            acks,
            keep_alive: KeepAlive::new(keep_alive, Instant::now()),
            problem_info: props.request_problem_information != Some(0),
            session_expiry,
            will: connect.will.clone().map(Box::new),
            flow_in: InboundFlow::new(config.receive_maximum, config.topic_alias_maximum),
            flow_out: OutboundFlow::new(
                window,
                props
                    .topic_alias_maximum
                    .unwrap_or(0)
                    .min(config.topic_alias_maximum),
            ),
            client_max_packet: props
                .maximum_packet_size
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(usize::MAX),
            queue: VecDeque::new(),
            queued_bytes: 0,
            retained_jobs: VecDeque::new(),
            backlog: None,
            high_offset: 0,
            backlog_high: 0,
            subs: HashMap::new(),
            session_dirty: false,
            saved_at: Instant::now(),
            saved_high: 0,
            saved_record: false,
            control: BytesMut::new(),
            store_acks: Vec::new(),
            properties: None,
            topic: String::new(),
            reply_inbox: None,
            requests: VecDeque::new(),
            next_request: 1,
        };

        let session_present = saved.is_some();
        let mut connack = ConnAck {
            session_present,
            code: reason::SUCCESS,
            properties: Properties::default(),
        };
        if level == Level::V5 {
            let p = &mut connack.properties;
            p.receive_maximum = Some(config.receive_maximum);
            p.maximum_packet_size = u32::try_from(config.max_packet_size).ok();
            p.topic_alias_maximum = Some(config.topic_alias_maximum);
            p.retain_available = Some(1);
            p.wildcard_subscription_available = Some(1);
            p.subscription_identifiers_available = Some(1);
            p.shared_subscription_available = Some(1);
            if assigned {
                p.assigned_client_identifier = Some(client_id.clone());
            }
            if props.session_expiry_interval.unwrap_or(0) != session_expiry {
                p.session_expiry_interval = Some(session_expiry);
            }
            p.server_keep_alive = server_keep_alive;
        }
        connection.put_control(&Packet::ConnAck(connack));
        tracing::debug!(conn = id, %peer, client = %client_id, ?level, session_present, "mqtt connected");

        match saved {
            Some(record) => {
                connection.saved_record = true;
                connection.resume(record).await;
            }
            None if connection.persistent() => {
                connection.high_offset = connection.next_offset().await.saturating_sub(1);
            }
            None => {}
        }
        Some(connection)
    }

    /// The tenant's next offset: where a new session's cursor starts.
    pub(super) async fn next_offset(&self) -> u64 {
        match &self.store {
            Some(store) => store
                .next_offset(&self.session.routes().name)
                .await
                .unwrap_or(1),
            None => 1,
        }
    }
}

/// Logs an MQTT client in with its CONNECT's user name (`name@tenant`, or `name`) and
/// password; a password that is a token (`cnp.…`) logs in with the token, whatever the
/// user name. `None` when refused.
pub(super) async fn log_in(
    broker: &Broker,
    connect: &Connect,
    client_id: &str,
    certified: Option<String>,
) -> Option<Principal> {
    let password = connect
        .password
        .as_ref()
        .and_then(|p| std::str::from_utf8(p).ok())
        .map(str::to_owned);
    let token = password.clone().filter(|p| p.starts_with("cnp."));
    let presented = crate::tenancy::login::Presented {
        user: connect.username.clone(),
        password: if token.is_some() { None } else { password },
        token,
        certified,
        client: client_id.to_owned(),
    };
    let store = broker.store()?;
    crate::tenancy::login::login(store, broker.tenant_records(), broker.metrics(), &presented)
        .await
        .ok()
}
