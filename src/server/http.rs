//! The HTTP port: health, readiness, Prometheus metrics and MQTT over WebSocket
//! (`/mqtt`, subprotocol `mqtt`); the browser API and the console are built on it
//! next (issue 6).
//!
//! Handlers only read counters and states that other parts keep; they must never
//! block on a connection, route a message or write to the store. With logins
//! required, every route but health, readiness, `/api/login` and the static files
//! wants one (`/mqtt` in MQTT's CONNECT), and `/metrics` shows a user of a tenant
//! other than `default` only that tenant's lines.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, Path, State};

use super::tls::Peer;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::mqtt::MqttContext;
use crate::api::{ApiError, tenants};
use crate::broker::Broker;
use crate::broker::metrics::Protocol;
use crate::store::stats::{BUCKETS, Latency};
use crate::tenancy::{Action, DEFAULT_TENANT, Principal};

/// What the handlers read.
#[derive(Clone)]
pub struct HttpState {
    pub broker: Arc<Broker>,
    pub mqtt: Option<Arc<MqttContext>>,
    pub websocket: Arc<super::websocket::WsContext>,
    pub shutdown: CancellationToken,
    /// WebSocket connections open now, and how many may be.
    pub websockets: Arc<std::sync::atomic::AtomicUsize>,
    pub max_websockets: usize,
    /// Every caller logs in with a bearer token (`authz.require_login`).
    pub require_login: bool,
}

/// A WebSocket connection counted against the cap while it lives.
struct Admitted(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl HttpState {
    /// Counts one more WebSocket, or `None` when the cap is reached.
    fn admit(&self) -> Option<Admitted> {
        let open = self
            .websockets
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let admitted = Admitted(Arc::clone(&self.websockets));
        (open < self.max_websockets).then_some(admitted)
    }
}

/// A WebSocket connection's read buffer. axum's default (128 KiB) is zeroed before
/// every read, which costs more than the small requests and packets it holds.
const WS_READ_BUFFER: usize = 8 * 1024;

fn too_many() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "too many WebSocket connections\n",
    )
        .into_response()
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/mqtt", get(mqtt_over_websocket))
        .route("/ws", get(json_websocket))
        .route("/canopy.js", get(client_module))
        .route("/api/login", get(login_rules))
        .route("/api/tenants", get(list_tenants).post(create_tenant))
        .route(
            "/api/tenants/{name}",
            get(describe_tenant)
                .put(update_tenant)
                .delete(delete_tenant),
        )
        .route("/", get(|| console_file(CONSOLE_PAGE)))
        .route("/console/console.js", get(|| console_file(CONSOLE_SCRIPT)))
        .route("/console/console.css", get(|| console_file(CONSOLE_STYLE)))
        .with_state(state)
}

/// The clear-text listener, giving the same [`Peer`] as the TLS one (no certificate).
struct PlainListener(TcpListener);

impl axum::serve::Listener for PlainListener {
    type Io = tokio::net::TcpStream;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.0.accept().await {
                Ok((stream, addr)) => {
                    // Deliveries are small and latency matters, as on the native listener.
                    let _ = stream.set_nodelay(true);
                    return (
                        stream,
                        Peer {
                            addr,
                            certified: None,
                        },
                    );
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, protocol = "http", "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(Peer {
            addr: self.0.local_addr()?,
            certified: None,
        })
    }
}

/// Serves until `shutdown` fires.
pub async fn serve(listener: TcpListener, state: HttpState, tls: Option<super::tls::Tls>) {
    let shutdown = state.shutdown.clone();
    let app = router(state);
    let app = app.into_make_service_with_connect_info::<Peer>();
    let served = match tls {
        Some(tls) => match super::tls::TlsListener::new(listener, tls, shutdown.clone()) {
            Ok(listener) => {
                // Tapped for axum's connect info, which it gives tapped listeners of
                // any address type; the TCP options were set before the handshake.
                let listener = listener.tap_io(|_| {});
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move { shutdown.cancelled().await })
                    .await
            }
            Err(error) => Err(error),
        },
        None => {
            let listener = PlainListener(listener).tap_io(|_| {});
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await
        }
    };
    if let Err(error) = served {
        tracing::error!(%error, "the HTTP listener failed");
    }
}

/// MQTT 3.1.1 and 5 over WebSocket: the same sessions and rules as the TCP listener.
/// The `mqtt` subprotocol is echoed, without which browsers drop the connection.
async fn mqtt_over_websocket(
    upgrade: WebSocketUpgrade,
    ConnectInfo(peer): ConnectInfo<Peer>,
    State(state): State<HttpState>,
) -> Response {
    let Some(context) = state.mqtt.clone() else {
        return (StatusCode::NOT_FOUND, "MQTT is turned off on this server\n").into_response();
    };
    let Some(admitted) = state.admit() else {
        return too_many();
    };
    let shutdown = state.shutdown.clone();
    upgrade
        .protocols(["mqtt"])
        .read_buffer_size(WS_READ_BUFFER)
        .on_upgrade(move |socket| async move {
            let (inbound, outbound) = super::mqtt::transport::websocket(socket);
            let certified = peer.certified.as_deref().map(str::to_owned);
            super::mqtt::serve_on(inbound, outbound, peer.addr, context, certified, shutdown).await;
            drop(admitted);
        })
}

/// Who is calling: anonymous unless logins are required; then the user of the bearer
/// token in `Authorization: Bearer …` or, for browsers' WebSockets, which cannot set
/// headers, in a `bearer.<token>` subprotocol. A refusal (401) comes after the failed
/// login delay.
async fn caller(
    state: &HttpState,
    headers: &HeaderMap,
    client_id: &str,
    certified: Option<&str>,
) -> Result<Principal, Response> {
    if !state.require_login {
        return Ok(Principal::anonymous("http"));
    }
    let from_header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let from_protocol = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find_map(|p| p.strip_prefix("bearer."));
    let presented = crate::tenancy::login::Presented {
        token: from_header.or(from_protocol).map(str::to_owned),
        certified: certified.map(str::to_owned),
        client: client_id.to_owned(),
        ..Default::default()
    };
    let refused = || {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "a bearer token is required\n",
        )
            .into_response()
    };
    let Some(store) = state.broker.store() else {
        return Err(refused());
    };
    let tenants = state.broker.tenant_records();
    match crate::tenancy::login::login(store, tenants, state.broker.metrics(), &presented).await {
        Ok(principal) => Ok(principal),
        Err(_) => {
            tokio::time::sleep(crate::tenancy::login::FAILED_LOGIN_DELAY).await;
            Err(refused())
        }
    }
}

/// Whether callers must log in: how the console knows to ask for a token before it
/// tries (a refused WebSocket cannot say why).
async fn login_rules(State(state): State<HttpState>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "required": state.require_login }).to_string(),
    )
        .into_response()
}

/// The caller of a request, logged in as [`caller`] says.
struct Caller(Principal);

impl axum::extract::FromRequestParts<HttpState> for Caller {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &HttpState,
    ) -> Result<Self, Response> {
        // `?client_id=NAME` names a WebSocket client for `{client_id}` rules; without
        // it, such rules allow nothing (an empty name is never filled in).
        let client_id = parts
            .uri
            .query()
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|pair| pair.strip_prefix("client_id="))
            .unwrap_or_default();
        let certified = parts
            .extensions
            .get::<ConnectInfo<Peer>>()
            .and_then(|info| info.0.certified.as_deref());
        caller(state, &parts.headers, client_id, certified)
            .await
            .map(Caller)
    }
}

/// The JSON WebSocket API (docs/websocket.md).
async fn json_websocket(
    upgrade: WebSocketUpgrade,
    State(state): State<HttpState>,
    Caller(principal): Caller,
) -> Response {
    let Some(admitted) = state.admit() else {
        return too_many();
    };
    let context = Arc::clone(&state.websocket);
    let shutdown = state.shutdown.clone();
    // A client that sent its token as a subprotocol offers `canopy` too, which is
    // echoed (a browser drops a connection whose offered protocols none were).
    upgrade
        .protocols(["canopy"])
        .max_message_size(context.max_message_bytes)
        .max_frame_size(context.max_message_bytes)
        .read_buffer_size(WS_READ_BUFFER)
        .on_upgrade(move |socket| async move {
            super::websocket::serve(socket, context, principal, shutdown).await;
            drop(admitted);
        })
}

/// A file of the console: its content type and its text, embedded in the binary so
/// the console works with no internet access and no files beside the server.
type ConsoleFile = (&'static str, &'static str);

const CONSOLE_PAGE: ConsoleFile = (
    "text/html; charset=utf-8",
    include_str!("../../web/console/index.html"),
);
const CONSOLE_SCRIPT: ConsoleFile = (
    "text/javascript; charset=utf-8",
    include_str!("../../web/console/console.js"),
);
const CONSOLE_STYLE: ConsoleFile = (
    "text/css; charset=utf-8",
    include_str!("../../web/console/console.css"),
);

async fn console_file((content_type, body): ConsoleFile) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, content_type)], body)
}

/// An admin call's answer: JSON, or `{"error": {code, description}}` with its status.
fn api_answer(result: Result<serde_json::Value, ApiError>) -> Response {
    let (status, body) = match result {
        Ok(body) => (StatusCode::OK, body),
        Err(error) => (
            StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            serde_json::json!({"error": {"code": error.code, "description": error.description}}),
        ),
    };
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The store and the caller's right to `$CANOPY.tenant.<op>`, as on the native API:
/// the default tenant's users only.
fn tenant_admin(
    state: &HttpState,
    principal: &Principal,
    op: &str,
) -> Result<Arc<crate::store::Store>, ApiError> {
    if &*principal.tenant != DEFAULT_TENANT || principal.is_guest() {
        return Err(ApiError {
            code: 403,
            description: "tenants are managed from the default tenant".into(),
        });
    }
    state
        .broker
        .authorizer()
        .authorize(principal, Action::Publish, &format!("$CANOPY.tenant.{op}"))
        .map_err(|denied| ApiError {
            code: 403,
            description: denied.to_string(),
        })?;
    state.broker.store().cloned().ok_or(ApiError {
        code: 503,
        description: "the store is not open".into(),
    })
}

fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError {
        code: 400,
        description: format!("the request is not the JSON expected: {e}"),
    })
}

async fn list_tenants(State(state): State<HttpState>, Caller(principal): Caller) -> Response {
    api_answer(tenant_admin(&state, &principal, "list").map(|_| tenants::list(&state.broker)))
}

async fn create_tenant(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    body: Bytes,
) -> Response {
    let result = async {
        let store = tenant_admin(&state, &principal, "create")?;
        tenants::create(&state.broker, &store, json_body(&body)?).await
    };
    api_answer(result.await)
}

async fn describe_tenant(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Path(name): Path<String>,
) -> Response {
    let result = async {
        let store = tenant_admin(&state, &principal, "describe")?;
        tenants::describe(&state.broker, &store, &name).await
    };
    api_answer(result.await)
}

/// The body of a PUT: the tenant's new limits, and anonymous rules when they change
/// (the name is in the path).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewLimits {
    #[serde(default)]
    limits: crate::store::TenantLimits,
    #[serde(default)]
    anonymous: Option<tenants::Anonymous>,
}

async fn update_tenant(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let result = async {
        let store = tenant_admin(&state, &principal, "update")?;
        let NewLimits { limits, anonymous } = json_body(&body)?;
        let request = tenants::WithLimits {
            name,
            limits,
            anonymous,
        };
        tenants::update(&state.broker, &store, request).await
    };
    api_answer(result.await)
}

async fn delete_tenant(
    State(state): State<HttpState>,
    Caller(principal): Caller,
    Path(name): Path<String>,
) -> Response {
    let result = async {
        let store = tenant_admin(&state, &principal, "delete")?;
        tenants::delete(&state.broker, &store, &name).await
    };
    api_answer(result.await)
}

/// The browser client, an ES module embedded in the binary.
async fn client_module() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../../web/canopy.js"),
    )
}

/// The process is up and answering.
async fn healthz() -> &'static str {
    "ok\n"
}

/// The server takes traffic: its store is open and it is not shutting down.
async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    if state.shutdown.is_cancelled() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else if state.broker.store().is_none() {
        (StatusCode::SERVICE_UNAVAILABLE, "store not open\n")
    } else {
        (StatusCode::OK, "ready\n")
    }
}

/// What a caller of `/metrics` is shown.
pub enum MetricsScope {
    /// Every line: without required logins, or to a user of the default tenant.
    Everything,
    /// Only the lines of this tenant (`tenant="…"`): no server-wide totals, no
    /// other tenant's name.
    Tenant(Arc<str>),
}

impl MetricsScope {
    /// With logins required, a user of the default tenant sees everything and a
    /// user of another tenant its own lines; a guest (no credentials, let in under
    /// anonymous rules) sees nothing (`None`), like a caller without a token.
    fn of(state: &HttpState, principal: &Principal) -> Option<MetricsScope> {
        if !state.require_login {
            return Some(MetricsScope::Everything);
        }
        if principal.is_guest() {
            return None;
        }
        Some(if &*principal.tenant == DEFAULT_TENANT {
            MetricsScope::Everything
        } else {
            MetricsScope::Tenant(Arc::clone(&principal.tenant))
        })
    }

    /// The tenant whose subjects are counted.
    fn subjects_tenant(&self) -> &str {
        match self {
            MetricsScope::Everything => DEFAULT_TENANT,
            MetricsScope::Tenant(name) => name,
        }
    }
}

async fn metrics(State(state): State<HttpState>, Caller(principal): Caller) -> Response {
    let Some(scope) = MetricsScope::of(&state, &principal) else {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "metrics need a user's login\n",
        )
            .into_response();
    };
    let subjects = match state.broker.store() {
        Some(store) => store.subject_count(scope.subjects_tenant()).await.ok(),
        None => None,
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render(&state, &scope, subjects),
    )
        .into_response()
}

/// The Prometheus text exposition of the counters `scope` shows; `subjects` is the
/// subject count of the scope's tenant (the default tenant for everything) when the
/// store could tell.
pub fn render(state: &HttpState, scope: &MetricsScope, subjects: Option<u64>) -> String {
    let mut out = String::with_capacity(4096);
    let only = match scope {
        MetricsScope::Everything => {
            render_server_wide(&mut out, state);
            None
        }
        MetricsScope::Tenant(name) => Some(&**name),
    };
    render_tenants(&mut out, state, only, subjects);
    if only.is_none() {
        render_mqtt_and_store(&mut out, state);
    }
    out
}

/// Appends one metric: its help, its type and its lines (labels, value).
fn metric(out: &mut String, name: &str, kind: &str, help: &str, lines: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in lines {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

/// Totals of the whole server, every tenant's included.
fn render_server_wide(out: &mut String, state: &HttpState) {
    let metrics = state.broker.metrics();
    let snap = metrics.snapshot();
    let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, f64)]| {
        metric(out, name, kind, help, lines)
    };
    let plain = |v: u64| vec![(String::new(), v as f64)];
    metric(
        "canopy_connections",
        "gauge",
        "Open client connections, by protocol.",
        &Protocol::ALL
            .iter()
            .map(|p| {
                (
                    format!("{{protocol=\"{}\"}}", p.name()),
                    metrics.open_connections(*p) as f64,
                )
            })
            .collect::<Vec<_>>(),
    );
    let counters: [(&str, &str, u64); 9] = [
        (
            "canopy_connections_total",
            "Client connections accepted since start.",
            snap.connections_total,
        ),
        (
            "canopy_messages_in_total",
            "Messages published by clients.",
            snap.msgs_in,
        ),
        (
            "canopy_bytes_in_total",
            "Payload bytes published by clients.",
            snap.bytes_in,
        ),
        (
            "canopy_messages_out_total",
            "Messages delivered to subscribers.",
            snap.msgs_out,
        ),
        (
            "canopy_bytes_out_total",
            "Payload and header bytes delivered to subscribers.",
            snap.bytes_out,
        ),
        (
            "canopy_slow_consumers_total",
            "Clients disconnected because they fell too far behind.",
            snap.slow_consumers,
        ),
        (
            "canopy_stale_connections_total",
            "Clients dropped for not answering pings.",
            snap.stale_connections,
        ),
        (
            "canopy_password_checks_total",
            "Password verifications of logins, an unknown user's included.",
            snap.password_checks,
        ),
        (
            "canopy_dropped_total",
            "Deliveries not sent because they exceeded the client's maximum packet size.",
            snap.dropped,
        ),
    ];
    for (name, help, value) in counters {
        metric(name, "counter", help, &plain(value));
    }
    metric(
        "canopy_subscriptions",
        "gauge",
        "Live subscriptions of every protocol, all tenants.",
        &plain(state.broker.subscription_count() as u64),
    );
}

/// The lines by tenant: every tenant's, or `only` that one's.
fn render_tenants(out: &mut String, state: &HttpState, only: Option<&str>, subjects: Option<u64>) {
    let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, f64)]| {
        metric(out, name, kind, help, lines)
    };
    let tenants = state.broker.live_tenants();
    let by_tenant = |value: &dyn Fn(&crate::tenancy::quota::LiveUsage, usize) -> u64| {
        tenants
            .iter()
            .filter(|(name, ..)| only.is_none_or(|only| **name == *only))
            .map(|(name, quota, subs)| {
                (
                    format!("{{tenant=\"{name}\"}}"),
                    value(&quota.counts(), *subs) as f64,
                )
            })
            .collect::<Vec<_>>()
    };
    metric(
        "canopy_tenant_connections",
        "gauge",
        "Open connections, by tenant (tenants that have had one).",
        &by_tenant(&|u, _| u.connections),
    );
    metric(
        "canopy_tenant_subscriptions",
        "gauge",
        "Live subscriptions, by tenant.",
        &by_tenant(&|_, subs| subs as u64),
    );
    metric(
        "canopy_tenant_published_messages_total",
        "counter",
        "Publishes admitted, by tenant.",
        &by_tenant(&|u, _| u.published_msgs),
    );
    metric(
        "canopy_tenant_published_bytes_total",
        "counter",
        "Header and payload bytes of admitted publishes, by tenant.",
        &by_tenant(&|u, _| u.published_bytes),
    );
    metric(
        "canopy_tenant_quota_refusals_total",
        "counter",
        "Connections, subscriptions and publishes refused by a quota, by tenant.",
        &by_tenant(&|u, _| u.refused),
    );
    metric(
        "canopy_tenant_quota_throttled_total",
        "counter",
        "Publishes taken late because the connection was held to the rate, by tenant.",
        &by_tenant(&|u, _| u.throttled),
    );
    if let Some(subjects) = subjects {
        let tenant = only.unwrap_or(DEFAULT_TENANT);
        metric(
            "canopy_subjects",
            "gauge",
            "Stored subjects, by tenant.",
            &[(format!("{{tenant=\"{tenant}\"}}"), subjects as f64)],
        );
    }
}

/// MQTT sessions and the store's latencies: the whole server's.
fn render_mqtt_and_store(out: &mut String, state: &HttpState) {
    if let Some(mqtt) = &state.mqtt {
        metric(
            out,
            "canopy_mqtt_sessions",
            "gauge",
            "MQTT client ids connected or waiting for a delayed will.",
            &[(String::new(), mqtt.live_sessions() as f64)],
        );
    }
    if let Some(store) = state.broker.store() {
        let stats = store.stats();
        histogram(
            out,
            "canopy_store_write_seconds",
            "Time to hand one group commit to the storage engine.",
            &stats.write,
        );
        histogram(
            out,
            "canopy_store_durable_seconds",
            "Time from a group commit's write to its durability (WAL flushed).",
            &stats.durable,
        );
    }
}

fn histogram(out: &mut String, name: &str, help: &str, latency: &Latency) {
    let (buckets, count, sum) = latency.read();
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (bound, cumulative) in BUCKETS.iter().zip(&buckets) {
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum {sum}");
    let _ = writeln!(out, "{name}_count {count}");
}
