//! In a cluster: the clients other nodes relay to this one, because it owns their
//! tenant's shard (`mqtt::connection::relay`, `websocket::relay`). A relayed
//! connection starts with a `Relay` frame on the cluster port; this is where it is
//! handed to its front end, once that front end runs.
//!
//! Must never: serve a relay from another cluster, or one before its front end runs
//! (it is closed: the client connects again).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use canopy_protocols::link;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::mqtt::MqttContext;
use super::websocket::WsContext;

/// Where relayed clients are served.
pub struct RelayHost {
    cluster: String,
    mqtt: OnceLock<(Arc<MqttContext>, TaskTracker, CancellationToken)>,
    ws: OnceLock<(Arc<WsContext>, TaskTracker, CancellationToken)>,
}

impl RelayHost {
    pub fn new(cluster: &str) -> Self {
        Self {
            cluster: cluster.to_owned(),
            mqtt: OnceLock::new(),
            ws: OnceLock::new(),
        }
    }

    /// Starts serving relayed MQTT clients in `context`, tracked with the other
    /// connections and ended with them; later calls are ignored.
    pub fn serve_mqtt(
        &self,
        context: Arc<MqttContext>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
    ) {
        let _ = self.mqtt.set((context, tracker, shutdown));
    }

    /// Starts serving relayed `/ws` clients in `context`; later calls are ignored.
    pub fn serve_ws(
        &self,
        context: Arc<WsContext>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
    ) {
        let _ = self.ws.set((context, tracker, shutdown));
    }

    /// Serves a client another node relayed: `relay` is the connection's first
    /// frame, `leftover` what came after it.
    pub fn accept(
        &self,
        stream: TcpStream,
        leftover: Vec<u8>,
        relay: &link::Relay<'_>,
        link_peer: SocketAddr,
    ) {
        if relay.cluster != self.cluster {
            tracing::warn!(%link_peer, cluster = relay.cluster, "a relayed client from another cluster");
            return;
        }
        let peer = relay.peer.parse().unwrap_or(link_peer);
        let caller = (
            Arc::<str>::from(relay.tenant),
            relay.user.map(Arc::<str>::from),
            relay.guest,
        );
        match relay.kind {
            link::RELAY_MQTT => {
                let Some((context, tracker, shutdown)) = self.mqtt.get() else {
                    tracing::info!(%link_peer, "a relayed mqtt client, and no mqtt front end here");
                    return;
                };
                tracker.spawn(super::mqtt::serve_relayed(
                    stream,
                    leftover,
                    caller,
                    peer,
                    Arc::clone(context),
                    shutdown.clone(),
                ));
            }
            link::RELAY_WS => {
                let Some((context, tracker, shutdown)) = self.ws.get() else {
                    tracing::info!(%link_peer, "a relayed /ws client, and no http front end here");
                    return;
                };
                tracker.spawn(super::websocket::relay::serve_relayed(
                    stream,
                    leftover,
                    super::websocket::relay::Relayed {
                        caller,
                        client: relay.client.to_owned(),
                        peer,
                    },
                    Arc::clone(context),
                    shutdown.clone(),
                ));
            }
            other => tracing::warn!(%link_peer, kind = other, "a relay of an unknown kind"),
        }
    }

    /// Ends the MQTT connections of the tenants `of` picks, this node no longer
    /// serving them, and waits (up to `wait`) for their sessions to be saved.
    pub async fn move_away(&self, of: impl Fn(&str) -> bool, wait: std::time::Duration) {
        if let Some((context, ..)) = self.mqtt.get() {
            context.move_away(of, wait).await;
        }
    }
}
