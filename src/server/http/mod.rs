//! The HTTP port: health, readiness, Prometheus metrics and MQTT over WebSocket
//! (`/mqtt`, subprotocol `mqtt`); the browser API and the console are built on it
//! next (issue 6).
//!
//! Handlers only read counters and states that other parts keep; they must never
//! block on a connection, route a message or write to the store. With logins
//! required, every route but health, readiness, `/api/login` and the static files
//! wants one (`/mqtt` in MQTT's CONNECT), and `/metrics` shows a user of a tenant
//! other than `default` only that tenant's lines.

use std::sync::Arc;

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{ConnectInfo, Path, State};

use super::tls::Peer;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::mqtt::MqttContext;
use crate::broker::Broker;

mod caller;
mod cluster_api;
mod console;
mod forward;
mod metrics;
mod plugin_api;
mod schema_api;
mod tenant_api;

pub use metrics::{MetricsScope, render};

use caller::{Caller, login_rules};
use console::{CONSOLE_PAGE, CONSOLE_SCRIPT, CONSOLE_STYLE, client_module, console_file};
use metrics::metrics;
use plugin_api::Kind;
use schema_api::{
    asyncapi_document, delete_schema, get_schema, list_schemas, put_schema, schema_errors,
    schema_history,
};
use tenant_api::{create_tenant, delete_tenant, describe_tenant, list_tenants, update_tenant};

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
    /// The listener speaks TLS (and so, the other nodes' too).
    pub tls: bool,
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
        .route("/api/tenants", get(list_tenants).post(create_tenant))
        .route("/api/schemas", get(list_schemas))
        .route(
            "/api/schemas/{pattern}",
            get(get_schema).put(put_schema).delete(delete_schema),
        )
        .route("/api/schemas/{pattern}/history", get(schema_history))
        .route("/api/schema-errors", get(schema_errors))
        .route("/api/asyncapi", get(asyncapi_document))
        .route(
            "/api/plugins",
            get(|State(s): State<HttpState>, Caller(c): Caller| {
                plugin_api::list(s, c, Kind::Plugin)
            }),
        )
        .route(
            "/api/plugins/{pattern}",
            get(
                |State(s): State<HttpState>, Caller(c): Caller, Path(p): Path<String>| {
                    plugin_api::on_pattern(s, c, p, (Kind::Plugin, "get"))
                },
            )
            .put(plugin_api::put_plugin)
            .delete(
                |State(s): State<HttpState>, Caller(c): Caller, Path(p): Path<String>| {
                    plugin_api::on_pattern(s, c, p, (Kind::Plugin, "delete"))
                },
            )
            // A module's bytes: past its bound axum answers 413 itself.
            .layer(axum::extract::DefaultBodyLimit::max(
                crate::plugins::MAX_MODULE_BYTES,
            )),
        )
        .route(
            "/api/encryption",
            get(|State(s): State<HttpState>, Caller(c): Caller| {
                plugin_api::list(s, c, Kind::Encryption)
            }),
        )
        .route(
            "/api/encryption/{pattern}",
            axum::routing::put(
                |State(s): State<HttpState>, Caller(c): Caller, Path(p): Path<String>| {
                    plugin_api::on_pattern(s, c, p, (Kind::Encryption, "seal"))
                },
            )
            .delete(
                |State(s): State<HttpState>, Caller(c): Caller, Path(p): Path<String>| {
                    plugin_api::on_pattern(s, c, p, (Kind::Encryption, "shred"))
                },
            ),
        )
        .route(
            "/api/encryption/{pattern}/stop",
            axum::routing::post(
                |State(s): State<HttpState>, Caller(c): Caller, Path(p): Path<String>| {
                    plugin_api::on_pattern(s, c, p, (Kind::Encryption, "stop"))
                },
            ),
        )
        .route(
            "/api/tenants/{name}",
            get(describe_tenant)
                .put(update_tenant)
                .delete(delete_tenant),
        )
        // In a cluster, the admin calls above on a tenant another node owns go there.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            forward::to_owner,
        ))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/mqtt", get(mqtt_over_websocket))
        .route("/ws", get(json_websocket))
        .route("/canopy.js", get(client_module))
        .route("/api/login", get(login_rules))
        .route("/api/cluster", get(cluster_api::cluster_status))
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
            let entry = super::mqtt::Entry::Client { certified };
            super::mqtt::serve_on(inbound, outbound, peer.addr, context, entry, shutdown).await;
            drop(admitted);
        })
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
    // In a cluster, a client whose tenant another node owns is relayed there.
    let route = super::websocket::relay::route(&context, &principal).await;
    if let super::websocket::relay::Route::Moving = route {
        let why = "the tenant's shard is moving to another node; try again\n";
        return (StatusCode::SERVICE_UNAVAILABLE, why).into_response();
    }
    // A client that sent its token as a subprotocol offers `canopy` too, which is
    // echoed (a browser drops a connection whose offered protocols none were).
    upgrade
        .protocols(["canopy"])
        .max_message_size(context.max_message_bytes)
        .max_frame_size(context.max_message_bytes)
        .read_buffer_size(WS_READ_BUFFER)
        .on_upgrade(move |socket| async move {
            match route {
                super::websocket::relay::Route::Owner(node) => {
                    super::websocket::relay::relay(socket, node, principal, context, shutdown)
                        .await;
                }
                _ => super::websocket::serve(socket, context, principal, shutdown).await,
            }
            drop(admitted);
        })
}

/// The process is up and answering.
async fn healthz() -> &'static str {
    "ok\n"
}

/// The server takes traffic: its store is open and it is not shutting down.
async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    if state.shutdown.is_cancelled() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
    } else if !state.broker.stores_messages() {
        (StatusCode::SERVICE_UNAVAILABLE, "store not open\n")
    } else {
        (StatusCode::OK, "ready\n")
    }
}
