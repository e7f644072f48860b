//! In a cluster, an MQTT client is served by the node that owns its tenant's shard:
//! its session's record, its backlog and the retained messages it is sent live in
//! that shard's store, and only there can a new connection take its client id over
//! from an old one. Any other node that the client reaches logs it in (the user book
//! every node sees) and relays its bytes, unread, over a connection of their own to
//! the owner, which serves the client as its own from the CONNECT on (the caller it
//! is given, not a login, decides who the client is there). When the owner stops
//! serving the tenant (its shard moves) or goes, the relay ends and the client
//! connects again, to be relayed to the next owner.
//!
//! Must never: pass a client's password on (the owner does not log it in again), or
//! relay a connection that was relayed here (two views that disagree for a moment
//! would pass it back and forth).

use std::io;

use tokio::io::AsyncReadExt;

use super::admission::{Caller, Login, Refused, log_in};
use super::*;
use crate::broker::mesh::Home;
use crate::tenancy::Principal;

/// How far a relay reads ahead in each direction.
const RELAY_BUFFER: usize = 16 << 10;

/// How a connection came in.
pub enum Entry {
    /// From a client (a verified TLS certificate's user given).
    Client { certified: Option<String> },
    /// Relayed by another node, which logged the client in as this.
    Relayed(Caller),
}

/// Where a connection is served.
pub(super) enum Route {
    Here(Login),
    /// Relayed to the node owning the client's tenant.
    Owner {
        node: Arc<str>,
        caller: Caller,
    },
    /// Nobody serves the tenant this moment.
    Unavailable(Refused),
}

/// Decides where the client of `connect` is served. On a server alone that is here,
/// logged in as it always is; in a cluster it is logged in first, to know its tenant.
pub(super) async fn route(context: &MqttContext, connect: &Connect, entry: Entry) -> Route {
    let broker = &context.broker;
    let Some(mesh) = broker.mesh() else {
        return match entry {
            Entry::Client { certified } => Route::Here(Login::Here { certified }),
            Entry::Relayed(caller) => Route::Here(Login::Decided(Some(caller))),
        };
    };
    let caller = match entry {
        Entry::Relayed(caller) => {
            return match mesh.settled_home(&caller.tenant).await {
                Home::Here(_) => Route::Here(Login::Decided(Some(caller))),
                _ => Route::Unavailable(moving()),
            };
        }
        Entry::Client { certified } => {
            let principal = if context.config.authz.require_login {
                log_in(broker, connect, &connect.client_id, certified).await
            } else {
                Some(Principal::anonymous(connect.client_id.as_str()))
            };
            match principal {
                Some(principal) => Caller::of(&principal),
                None => return Route::Here(Login::Decided(None)),
            }
        }
    };
    match mesh.settled_home(&caller.tenant).await {
        Home::Here(_) => Route::Here(Login::Decided(Some(caller))),
        Home::Owner(node) => Route::Owner { node, caller },
        Home::Moving => Route::Unavailable(moving()),
    }
}

fn moving() -> Refused {
    Refused::new(
        reason::SERVER_UNAVAILABLE,
        reason::V3_SERVER_UNAVAILABLE,
        "the client's tenant is moving to another node; connect again",
    )
}

/// One client's connection on its way to the node that serves its tenant.
pub(super) struct Relaying<'a> {
    pub(super) connect: &'a Connect,
    pub(super) caller: Caller,
    pub(super) node: &'a str,
    pub(super) peer: SocketAddr,
    pub(super) context: &'a MqttContext,
}

impl Relaying<'_> {
    /// Relays until either side ends; `rest` is what the client sent after its
    /// CONNECT. A client whose owner cannot be reached is refused in its protocol.
    pub(super) async fn run<R: Inbound, W: AsyncWrite + Unpin + Send>(
        self,
        reader: R,
        mut writer: W,
        rest: BytesMut,
        shutdown: &CancellationToken,
    ) {
        match self.open(&rest).await {
            Ok(upstream) => {
                self.context
                    .broker
                    .metrics()
                    .connection_opened(crate::metrics::Protocol::Mqtt);
                splice(reader, &mut writer, upstream, shutdown).await;
                self.context
                    .broker
                    .metrics()
                    .connection_closed(crate::metrics::Protocol::Mqtt);
            }
            Err(why) => {
                tracing::info!(peer = %self.peer, node = self.node, why, "could not relay an mqtt client");
                let refused = Refused::new(
                    reason::SERVER_UNAVAILABLE,
                    reason::V3_SERVER_UNAVAILABLE,
                    format!("the node serving the client's tenant cannot be reached: {why}"),
                );
                let _ = writer.write_all(&refused.connack(self.connect.level)).await;
                let _ = writer.shutdown().await;
            }
        }
    }

    /// Connects to the owner and sends who the client is, then its CONNECT (without
    /// its password) and what followed it.
    async fn open(&self, rest: &[u8]) -> Result<TcpStream, String> {
        let mesh = self.context.broker.mesh().ok_or("not in a cluster")?;
        let address = mesh
            .link_address(self.node)
            .ok_or("it is not in the cluster's view")?;
        let cluster = self
            .context
            .config
            .cluster
            .as_ref()
            .map_or("", |c| c.name.as_str());
        let connecting = TcpStream::connect(&address);
        let mut stream = tokio::time::timeout(Duration::from_secs(2), connecting)
            .await
            .map_err(|_| "connecting timed out".to_owned())?
            .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let peer = self.peer.to_string();
        let mut relay = canopy_protocols::link::Relay {
            kind: canopy_protocols::link::RELAY_MQTT,
            cluster,
            tenant: &self.caller.tenant,
            user: self.caller.user.as_deref(),
            guest: self.caller.guest,
            client: &self.connect.client_id,
            peer: &peer,
            proof: canopy_protocols::link::Proof::default(),
        };
        mesh.secret().prove_relay(&mut relay);
        let mut first = Vec::new();
        canopy_protocols::link::encode(&canopy_protocols::link::Frame::Relay(relay), &mut first);
        let mut connect = self.connect.clone();
        connect.password = None;
        let mut encoded = BytesMut::new();
        encode(
            &Packet::Connect(Box::new(connect)),
            self.connect.level,
            &mut encoded,
        )
        .map_err(|e| e.to_string())?;
        first.extend_from_slice(&encoded);
        first.extend_from_slice(rest);
        stream.write_all(&first).await.map_err(|e| e.to_string())?;
        Ok(stream)
    }
}

/// Copies bytes both ways between a client and its owner until either ends or the
/// server shuts down; then closes both.
async fn splice<R: Inbound, W: AsyncWrite + Unpin>(
    mut reader: R,
    writer: &mut W,
    upstream: TcpStream,
    shutdown: &CancellationToken,
) {
    let (mut from_owner, mut to_owner) = upstream.into_split();
    let mut up = BytesMut::new();
    let mut down = BytesMut::with_capacity(RELAY_BUFFER);
    loop {
        let ended = tokio::select! {
            _ = shutdown.cancelled() => true,
            ready = reader.ready() => match ready.map(|()| reader.try_read(&mut up)) {
                Ok(Ok(0)) | Err(_) => true,
                Ok(Ok(_)) => {
                    let failed = to_owner.write_all(&up).await.is_err();
                    up.clear();
                    failed
                }
                Ok(Err(error)) => error.kind() != io::ErrorKind::WouldBlock,
            },
            read = from_owner.read_buf(&mut down) => match read {
                Ok(0) | Err(_) => true,
                Ok(_) => {
                    let failed = writer.write_all(&down).await.is_err() || writer.flush().await.is_err();
                    down.clear();
                    failed
                }
            },
        };
        if ended {
            break;
        }
    }
    let _ = writer.shutdown().await;
    let _ = to_owner.shutdown().await;
}

/// Serves a client another node relayed here (`leftover`: what came after the
/// relay's first frame), as the caller that node logged in.
pub async fn serve_relayed(
    stream: TcpStream,
    leftover: Vec<u8>,
    caller: (Arc<str>, Option<Arc<str>>, bool),
    peer: SocketAddr,
    context: Arc<MqttContext>,
    shutdown: CancellationToken,
) {
    let (tenant, user, guest) = caller;
    let (reading, writing) = stream.into_split();
    let reader =
        super::super::transport::StreamInbound::new(std::io::Cursor::new(leftover).chain(reading));
    let caller = Caller {
        tenant,
        user,
        guest,
    };
    serve_on(
        reader,
        writing,
        peer,
        context,
        Entry::Relayed(caller),
        shutdown,
    )
    .await;
}
