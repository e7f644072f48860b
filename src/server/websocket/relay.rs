//! In a cluster, a `/ws` client is served by the node that owns its tenant's shard:
//! its reads (get, replay, subjects, history, groups) need that shard's store. Any
//! other node it reaches logs it in and relays its WebSocket messages, each a
//! length-prefixed frame (`kind:u8 body`: text, binary, or close with its code) over
//! a connection of its own to the owner's cluster port, after a `Relay` frame naming
//! the client; the owner serves them as its own client's, under the rules it
//! compiles again from what every node sees. Pings stay with each WebSocket.
//!
//! Must never: relay a relayed client on (two views that disagree for a moment
//! would pass it back and forth), or take a frame over the message limit.

use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use bytes::{BufMut, Bytes, BytesMut};
use canopy_protocols::link;
use futures::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, FramedParts, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;

use super::WsContext;
use crate::broker::mesh::Home;
use crate::tenancy::Principal;

const TEXT: u8 = 1;
const BINARY: u8 = 2;
const CLOSE: u8 = 8;

/// Where a `/ws` client of this node is served.
pub enum Route {
    Here,
    /// Relayed to the node that owns the client's tenant.
    Owner(Arc<str>),
    /// Nobody serves the tenant this moment.
    Moving,
}

/// Where a `/ws` client of `principal` is served, waiting a moment while its
/// tenant's shard has no home.
pub async fn route(context: &WsContext, principal: &Principal) -> Route {
    let Some(mesh) = context.broker.mesh() else {
        return Route::Here;
    };
    match mesh.settled_home(&principal.tenant).await {
        Home::Here(_) => Route::Here,
        Home::Owner(node) => Route::Owner(node),
        Home::Moving => Route::Moving,
    }
}

fn codec(context: &WsContext) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(context.max_message_bytes.saturating_add(1024))
        .new_codec()
}

/// A message as a relay frame; none for pings, which stay with each WebSocket.
fn frame_of(message: Message) -> Option<Bytes> {
    let mut out = BytesMut::new();
    match message {
        Message::Text(text) => {
            out.put_u8(TEXT);
            out.extend_from_slice(text.as_str().as_bytes());
        }
        Message::Binary(bytes) => {
            out.put_u8(BINARY);
            out.extend_from_slice(&bytes);
        }
        Message::Close(frame) => {
            out.put_u8(CLOSE);
            if let Some(frame) = frame {
                out.put_u16(frame.code);
                out.extend_from_slice(frame.reason.as_str().as_bytes());
            }
        }
        Message::Ping(_) | Message::Pong(_) => return None,
    }
    Some(out.freeze())
}

fn message_of(frame: &[u8]) -> Result<Message, axum::Error> {
    let bad = |what: &str| axum::Error::new(std::io::Error::other(what.to_owned()));
    let (&kind, body) = frame
        .split_first()
        .ok_or_else(|| bad("an empty relay frame"))?;
    match kind {
        TEXT => std::str::from_utf8(body)
            .map(|text| Message::Text(Utf8Bytes::from(text.to_owned())))
            .map_err(axum::Error::new),
        BINARY => Ok(Message::Binary(Bytes::copy_from_slice(body))),
        CLOSE => Ok(Message::Close(match body {
            [high, low, reason @ ..] => Some(CloseFrame {
                code: u16::from_be_bytes([*high, *low]),
                reason: Utf8Bytes::from(String::from_utf8_lossy(reason).into_owned()),
            }),
            _ => None,
        })),
        _ => Err(bad("a relay frame of an unknown kind")),
    }
}

/// Relays a client of this node to `node`, the owner of its tenant, until either
/// side ends; a client whose owner cannot be reached is closed with 1013 (try again
/// later).
pub async fn relay(
    socket: WebSocket,
    node: Arc<str>,
    principal: Principal,
    context: Arc<WsContext>,
    shutdown: CancellationToken,
) {
    let (mut client_sink, mut client_stream) = socket.split();
    let upstream = match open(&context, &node, &principal).await {
        Ok(upstream) => upstream,
        Err(why) => {
            tracing::info!(node = %node, why, "could not relay a /ws client");
            let reason = format!("the node serving the tenant cannot be reached: {why}");
            let close = CloseFrame {
                code: 1013,
                reason: Utf8Bytes::from(reason),
            };
            let _ = client_sink.send(Message::Close(Some(close))).await;
            return;
        }
    };
    let (mut owner_sink, mut owner_stream) = Framed::new(upstream, codec(&context)).split();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                let close = CloseFrame { code: 1001, reason: Utf8Bytes::from_static("server shutting down") };
                let _ = client_sink.send(Message::Close(Some(close))).await;
                break;
            }
            message = client_stream.next() => {
                let Some(Ok(message)) = message else {
                    break;
                };
                let closing = matches!(message, Message::Close(_));
                if let Some(frame) = frame_of(message)
                    && owner_sink.send(frame).await.is_err()
                {
                    break;
                }
                if closing {
                    break;
                }
            }
            frame = owner_stream.next() => {
                let Some(Ok(message)) = frame.map(|f| f.map_err(axum::Error::new).and_then(|f| message_of(&f))) else {
                    break;
                };
                let closing = matches!(message, Message::Close(_));
                if client_sink.send(message).await.is_err() || closing {
                    break;
                }
            }
        }
    }
    let _ = client_sink.close().await;
    let _ = owner_sink.close().await;
}

/// Connects to `node` and says who the client is.
async fn open(context: &WsContext, node: &str, principal: &Principal) -> Result<TcpStream, String> {
    let mesh = context.broker.mesh().ok_or("not in a cluster")?;
    let address = mesh
        .link_address(node)
        .ok_or("it is not in the cluster's view")?;
    let connecting = TcpStream::connect(&address);
    let mut stream = tokio::time::timeout(std::time::Duration::from_secs(2), connecting)
        .await
        .map_err(|_| "connecting timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let mut relay = link::Relay {
        kind: link::RELAY_WS,
        cluster: context.cluster.as_deref().unwrap_or_default(),
        tenant: &principal.tenant,
        user: principal.user.as_deref(),
        guest: principal.is_guest(),
        client: &principal.client,
        peer: "",
        proof: link::Proof::default(),
    };
    mesh.secret().prove_relay(&mut relay);
    let mut first = Vec::new();
    link::encode(&link::Frame::Relay(relay), &mut first);
    stream.write_all(&first).await.map_err(|e| e.to_string())?;
    Ok(stream)
}

/// In a cluster, a token cancelled at `shutdown` or once this node no longer
/// serves `tenant` (its shard moved): the connection then ends as at a shutdown,
/// and its client connects again, to be served by the next owner. The caller
/// cancels it when the connection ends (its watcher stops then).
pub(super) fn while_served(
    context: &WsContext,
    tenant: &Arc<str>,
    shutdown: &CancellationToken,
) -> CancellationToken {
    let token = shutdown.child_token();
    let Some(mesh) = context.broker.mesh().cloned() else {
        return token;
    };
    let tenant = Arc::clone(tenant);
    let watching = token.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = watching.cancelled() => return,
                () = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
            }
            if !matches!(mesh.home(&tenant), Home::Here(_)) {
                watching.cancel();
                return;
            }
        }
    });
    token
}

/// Who a relayed client is, as the node that relayed it logged it in.
pub struct Relayed {
    /// Tenant, user, and whether a guest.
    pub caller: (Arc<str>, Option<Arc<str>>, bool),
    pub client: String,
    pub peer: std::net::SocketAddr,
}

/// Serves a `/ws` client another node relayed here (`leftover`: what came after
/// the relay's first frame).
pub async fn serve_relayed(
    stream: TcpStream,
    leftover: Vec<u8>,
    relayed: Relayed,
    context: Arc<WsContext>,
    shutdown: CancellationToken,
) {
    let (tenant, user, guest) = relayed.caller;
    let broker = &context.broker;
    let principal = crate::tenancy::login::of_forwarded(
        broker.user_book(),
        broker.tenant_records(),
        &tenant,
        user.as_deref(),
        guest,
        &relayed.client,
    );
    let Ok(principal) = principal else {
        tracing::info!(peer = %relayed.peer, tenant = %tenant, "a relayed /ws client this node does not know; closed");
        return;
    };
    if !matches!(route(&context, &principal).await, Route::Here) {
        return;
    }
    let mut parts = FramedParts::new::<Bytes>(stream, codec(&context));
    parts.read_buf = BytesMut::from(&leftover[..]);
    let (sink, stream) = Framed::from_parts(parts).split();
    let sink = sink
        .sink_map_err(axum::Error::new)
        .with_flat_map(|message: Message| futures::stream::iter(frame_of(message).map(Ok)));
    let stream = stream.map(|frame| {
        frame
            .map_err(axum::Error::new)
            .and_then(|frame| message_of(&frame))
    });
    super::serve_on(
        Box::pin(sink),
        Box::pin(stream),
        context,
        principal,
        shutdown,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_but_pings_comes_back_as_it_went() {
        let close = CloseFrame {
            code: 1008,
            reason: Utf8Bytes::from_static("slow"),
        };
        for message in [
            Message::Text(Utf8Bytes::from_static("{\"op\":\"pub\"}")),
            Message::Binary(Bytes::from_static(b"\x00\x01")),
            Message::Close(Some(close)),
            Message::Close(None),
        ] {
            let frame = frame_of(message.clone()).expect("a frame");
            assert_eq!(message_of(&frame).expect("a message"), message);
        }
        assert!(frame_of(Message::Ping(Bytes::new())).is_none());
        assert!(message_of(&[]).is_err());
        assert!(message_of(&[99, 1]).is_err());
        assert!(message_of(&[TEXT, 0xff]).is_err());
    }
}
