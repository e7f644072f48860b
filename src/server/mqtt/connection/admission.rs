//! Letting an MQTT client in: its login, the checks on its CONNECT (will topic,
//! client id, quota slot), taking over a session and answering CONNACK. Never
//! reads a packet after CONNECT.

use super::*;

use crate::config::MqttConfig;
use crate::tenancy::quota::ConnectionSlot;

/// A refused CONNECT: the CONNACK reason code for MQTT 5 and for 3, and why, which
/// only MQTT 5 can carry.
pub(super) struct Refused {
    code_v5: u8,
    code_v3: u8,
    why: String,
}

impl Refused {
    pub(super) fn new(code_v5: u8, code_v3: u8, why: impl Into<String>) -> Refused {
        Refused {
            code_v5,
            code_v3,
            why: why.into(),
        }
    }

    /// Answers a client at `level` with its refusal and closes the connection.
    pub(super) async fn tell(&self, level: Level, writer: &mut (impl AsyncWrite + Unpin)) {
        let _ = writer.write_all(&self.connack(level)).await;
        let _ = writer.shutdown().await;
    }

    /// The CONNACK that tells a client at `level` it was refused.
    pub(super) fn connack(&self, level: Level) -> BytesMut {
        let mut out = BytesMut::new();
        let mut properties = Properties::default();
        if level == Level::V5 {
            properties.reason_string = Some(self.why.clone());
        }
        let code = if level == Level::V5 {
            self.code_v5
        } else {
            self.code_v3
        };
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
    }
}

/// The client a CONNECT lets in.
struct Admitted {
    principal: Principal,
    client_id: String,
    /// The server chose the client id, so CONNACK must name it.
    assigned: bool,
}

/// The keep-alive and session expiry a connection runs with: the client's, within
/// the server's bounds.
#[derive(Clone, Copy)]
struct Terms {
    keep_alive: u16,
    /// The keep-alive the server imposed instead of the client's, for CONNACK.
    server_keep_alive: Option<u16>,
    session_expiry: u32,
}

impl Terms {
    fn of(connect: &Connect, config: &MqttConfig) -> Terms {
        let mut keep_alive = connect.keep_alive;
        let mut server_keep_alive = None;
        if config.max_keep_alive_secs > 0
            && (keep_alive == 0 || keep_alive > config.max_keep_alive_secs)
            && connect.level == Level::V5
        {
            keep_alive = config.max_keep_alive_secs;
            server_keep_alive = Some(keep_alive);
        }
        let session_expiry = match connect.level {
            Level::V5 => connect
                .properties
                .session_expiry_interval
                .unwrap_or(0)
                .min(config.max_session_expiry_secs),
            _ if connect.clean_start => 0,
            _ => config.v3_session_expiry_secs,
        };
        Terms {
            keep_alive,
            server_keep_alive,
            session_expiry,
        }
    }
}

/// What a connection opens with once its client id is claimed.
struct Opening {
    id: u64,
    principal: Principal,
    key: SessionKey,
    claim: Claim,
    slot: ConnectionSlot,
    store: Option<Arc<Store>>,
    terms: Terms,
}

impl Connection {
    /// Checks the CONNECT, takes the client id over, restores or clears the session
    /// and answers CONNACK. `None` when the connection was refused (and told).
    pub(super) async fn accept(
        connect: Box<Connect>,
        peer: SocketAddr,
        context: &Arc<MqttContext>,
        login: Login,
        mut decoder: Decoder,
        writer: &mut (impl AsyncWrite + Unpin),
    ) -> Option<Connection> {
        let level = connect.level;
        decoder.set_level(level);
        let broker = &context.broker;
        let id = broker.next_id();
        let admitted = match admit(&connect, context, id, login).await {
            Ok(admitted) => admitted,
            Err(refused) => {
                let _ = writer.write_all(&refused.connack(level)).await;
                return None;
            }
        };
        let terms = Terms::of(&connect, &context.config.mqtt);
        let key: SessionKey = (
            Arc::clone(&admitted.principal.tenant),
            admitted.client_id.clone(),
        );
        let claim = context.sessions.claim(&key, id);
        let slot = match take_slot(broker, &key, &claim, peer).await {
            Ok(slot) => slot,
            Err(refused) => {
                let _ = writer.write_all(&refused.connack(level)).await;
                context.sessions.release(&key, id, false);
                claim.handoff.release();
                return None;
            }
        };
        // In a cluster, the tenant's shard's store when this node owns it.
        let store = broker.store_of(&key.0);
        let saved = match saved_session(broker, store.as_deref(), &key, connect.clean_start).await {
            Ok(saved) => saved,
            Err(refused) => {
                let _ = writer.write_all(&refused.connack(level)).await;
                context.sessions.release(&key, id, false);
                claim.handoff.release();
                return None;
            }
        };
        let opening = Opening {
            id,
            principal: admitted.principal,
            key,
            claim,
            slot,
            store,
            terms,
        };
        let mut connection = Connection::open(context, peer, &connect, decoder, opening);
        let session_present = saved.is_some();
        let assigned = admitted.assigned.then_some(admitted.client_id.as_str());
        let connack = connack(
            &connect,
            &context.config.mqtt,
            terms,
            assigned,
            session_present,
        );
        connection.put_control(&Packet::ConnAck(connack));
        tracing::debug!(conn = id, %peer, client = %admitted.client_id, ?level, session_present, "mqtt connected");

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

    /// A new connection's state, its outbox and ack inbox registered with the broker.
    fn open(
        context: &Arc<MqttContext>,
        peer: SocketAddr,
        connect: &Connect,
        decoder: Decoder,
        opening: Opening,
    ) -> Connection {
        let config = &context.config.mqtt;
        let props = &connect.properties;
        let broker = Arc::clone(&context.broker);
        let id = opening.id;
        let outbox = Arc::new(
            Outbox::new(id, config.max_pending_bytes, Arc::clone(broker.metrics()))
                .with_behind_limit(std::time::Duration::from_secs(
                    config.write_deadline_secs.max(1),
                )),
        );
        let acks = Arc::new(AckInbox::new(Arc::clone(&outbox)));
        broker.mqtt_acks().register(id, Arc::clone(&acks));
        let window = usize::from(
            props
                .receive_maximum
                .unwrap_or(config.max_inflight)
                .min(config.max_inflight.max(1)),
        );
        let routes = broker.tenant_for(&opening.principal);
        let mut session = Session::new(
            Arc::clone(&broker),
            routes,
            opening.principal,
            outbox,
            Arc::clone(&context.session_limits),
        );
        session.hold_slot(opening.slot);
        session.share_client_rates(&opening.key.1);
        Connection {
            id,
            peer,
            context: Arc::clone(context),
            broker,
            store: opening.store,
            session,
            level: connect.level,
            key: opening.key,
            claim: opening.claim,
            decoder,
            acks,
            keep_alive: KeepAlive::new(opening.terms.keep_alive, Instant::now()),
            problem_info: props.request_problem_information != Some(0),
            session_expiry: opening.terms.session_expiry,
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
        }
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

/// How a connection's login is decided.
pub enum Login {
    /// Here, from its CONNECT (and the user a verified TLS certificate names).
    Here { certified: Option<String> },
    /// Already: in a cluster, to choose the node that serves the client (or by the
    /// node that relayed it here). `None`: refused.
    Decided(Option<Caller>),
}

/// Who a client logged in as, without its rules (made again where it is served).
#[derive(Debug, Clone)]
pub struct Caller {
    pub tenant: Arc<str>,
    pub user: Option<Arc<str>>,
    /// Let in under the tenant's anonymous rules.
    pub guest: bool,
}

impl Caller {
    pub fn of(principal: &Principal) -> Self {
        Self {
            tenant: Arc::clone(&principal.tenant),
            user: principal.user.clone(),
            guest: principal.is_guest(),
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
    let users = broker.users()?;
    crate::tenancy::login::login(users, broker.tenant_records(), broker.metrics(), &presented)
        .await
        .ok()
}

/// The checks a CONNECT must pass before it may claim a client id: no enhanced
/// authentication, a client id it may go without, a login, a will topic it may
/// publish to.
async fn admit(
    connect: &Connect,
    context: &MqttContext,
    id: u64,
    login: Login,
) -> Result<Admitted, Refused> {
    let broker = &context.broker;
    let level = connect.level;
    if connect.properties.authentication_method.is_some() {
        return Err(Refused::new(
            reason::BAD_AUTHENTICATION_METHOD,
            reason::V3_NOT_AUTHORIZED,
            "enhanced authentication is not supported",
        ));
    }
    let (client_id, assigned) = if connect.client_id.is_empty() {
        // MQTT 3.1 requires a client id; 3.1.1 allows none with a clean session.
        if level == Level::V31 || (!connect.clean_start && level != Level::V5) {
            return Err(Refused::new(
                reason::CLIENT_IDENTIFIER_NOT_VALID,
                reason::V3_IDENTIFIER_REJECTED,
                "an empty client id needs a clean session",
            ));
        }
        (format!("canopy-{id}-{:08x}", fastrand::u32(..)), true)
    } else {
        (connect.client_id.clone(), false)
    };
    let principal = match login {
        Login::Here { certified } if context.config.authz.require_login => {
            log_in(broker, connect, &client_id, certified).await
        }
        Login::Here { .. } => Some(Principal::anonymous(client_id.as_str())),
        // Made again with the client id it ends up with (`{client_id}` rules).
        Login::Decided(caller) => caller.and_then(|caller| {
            crate::tenancy::login::of_forwarded(
                broker.user_book(),
                broker.tenant_records(),
                &caller.tenant,
                caller.user.as_deref(),
                caller.guest,
                &client_id,
            )
            .ok()
        }),
    };
    let Some(principal) = principal else {
        tokio::time::sleep(crate::tenancy::login::FAILED_LOGIN_DELAY).await;
        return Err(Refused::new(
            reason::BAD_USER_NAME_OR_PASSWORD,
            reason::V3_BAD_USER_NAME_OR_PASSWORD,
            "bad user name or password",
        ));
    };
    if let Some(will) = &connect.will {
        let publisher = Publisher::new(
            Arc::clone(broker),
            broker.tenant(&principal.tenant),
            principal.clone(),
            Arc::clone(&context.session_limits),
            id,
        );
        let checked = Subject::parse_mqtt_with(&will.topic, &context.subject_limits)
            .map_err(|e| Refusal::InvalidSubject(e.to_string()))
            .and_then(|s| publisher.check_target(s.as_str()));
        if let Err(refused) = checked {
            return Err(Refused::new(
                mqtt_code(&refused),
                reason::V3_NOT_AUTHORIZED,
                format!("the will topic cannot be used: {refused}"),
            ));
        }
    }
    Ok(Admitted {
        principal,
        client_id,
        assigned,
    })
}

/// Takes a place in the tenant's connection quota, once a previous holder of the
/// client id has saved its session and let go.
async fn take_slot(
    broker: &Broker,
    key: &SessionKey,
    claim: &Claim,
    peer: SocketAddr,
) -> Result<ConnectionSlot, Refused> {
    let taking_over = claim.previous.is_some();
    if let Some(previous) = claim.previous.clone() {
        // The previous holder saves its session before letting go.
        let _ = tokio::time::timeout(Duration::from_secs(10), previous.released()).await;
    }
    // The slot comes after a takeover, so a device reconnecting over its own dead
    // connection is not refused for the place that connection still holds.
    let quota = Arc::clone(&broker.tenant(&key.0).quota);
    let mut slot = quota.connect();
    for _ in 0..100 {
        if slot.is_ok() || !taking_over {
            break;
        }
        // The previous holder gives its place back as its task ends.
        tokio::time::sleep(Duration::from_millis(10)).await;
        slot = quota.connect();
    }
    slot.map_err(|exceeded| {
        tracing::info!(%peer, %exceeded, "mqtt connection refused");
        Refused::new(
            reason::QUOTA_EXCEEDED,
            reason::V3_SERVER_UNAVAILABLE,
            exceeded.to_string(),
        )
    })
}

/// The client's saved session to resume, if it has one and asked to keep it; a clean
/// start deletes it instead.
async fn saved_session(
    broker: &Broker,
    store: Option<&Store>,
    key: &SessionKey,
    clean_start: bool,
) -> Result<Option<SessionRecord>, Refused> {
    let client_id = &key.1;
    match (store, clean_start) {
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
            Ok(None)
        }
        (Some(store), false) => match store.session(&key.0, &key.1).await {
            Ok(Some(bytes)) => match SessionRecord::decode(&bytes) {
                Some(record) if !record.expired(broker.clock().now_ms()) => Ok(Some(record)),
                Some(_) => Ok(None),
                None => {
                    tracing::warn!(client = %client_id, "a saved mqtt session cannot be read; starting afresh");
                    Ok(None)
                }
            },
            Ok(None) => Ok(None),
            Err(error) => {
                tracing::warn!(%error, client = %client_id, "cannot read the saved mqtt session");
                Err(Refused::new(
                    reason::SERVER_UNAVAILABLE,
                    reason::V3_SERVER_UNAVAILABLE,
                    "the session store cannot be read",
                ))
            }
        },
        (None, _) => Ok(None),
    }
}

/// The CONNACK that lets a client in; MQTT 5 hears the server's limits, and the
/// client id, keep-alive and session expiry the server chose for it.
fn connack(
    connect: &Connect,
    config: &MqttConfig,
    terms: Terms,
    assigned: Option<&str>,
    session_present: bool,
) -> ConnAck {
    let mut connack = ConnAck {
        session_present,
        code: reason::SUCCESS,
        properties: Properties::default(),
    };
    if connect.level == Level::V5 {
        let p = &mut connack.properties;
        p.receive_maximum = Some(config.receive_maximum);
        p.maximum_packet_size = u32::try_from(config.max_packet_size).ok();
        p.topic_alias_maximum = Some(config.topic_alias_maximum);
        p.retain_available = Some(1);
        p.wildcard_subscription_available = Some(1);
        p.subscription_identifiers_available = Some(1);
        p.shared_subscription_available = Some(1);
        p.assigned_client_identifier = assigned.map(str::to_owned);
        if connect.properties.session_expiry_interval.unwrap_or(0) != terms.session_expiry {
            p.session_expiry_interval = Some(terms.session_expiry);
        }
        p.server_keep_alive = terms.server_keep_alive;
    }
    connack
}
