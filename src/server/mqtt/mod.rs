//! The MQTT front end (3.1, 3.1.1 and 5.0): the accept loop, and what every MQTT
//! connection shares.
//!
//! MQTT clients live in the same subject space as native ones: a topic is a subject in
//! its MQTT rendering, a publish is routed and stored exactly like a native one, and
//! a subscription sits in the same trie, marked so that routing queues envelopes for
//! it instead of `MSG` frames (`broker::envelope`). Retained messages and offline
//! backlogs are read from the store; sessions are saved there. This module must
//! never touch storage internals or decode bytes itself (the codec lives in
//! `canopy-protocols`).

mod connection;
pub mod session;
pub mod state;
pub mod translate;
pub mod transport;

pub use connection::relay::serve_relayed;
pub use connection::{Entry, serve_on};

use std::sync::Arc;

use canopy_subjects::Limits as SubjectLimits;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::Broker;
use crate::config::Config;

/// What every MQTT connection shares.
pub struct MqttContext {
    config: Arc<Config>,
    broker: Arc<Broker>,
    subject_limits: SubjectLimits,
    /// The limits every front end shares (`max_payload` among them).
    session_limits: Arc<crate::session::SessionLimits>,
    sessions: session::Sessions,
    /// Wills waiting for their delay; the server waits for none of them at shutdown.
    tracker: TaskTracker,
    /// Set when the MQTT listener speaks TLS.
    tls: Option<super::tls::Tls>,
}

impl MqttContext {
    /// Ends the connections of the tenants `of` picks, this node no longer serving
    /// them, and waits (up to `wait`) for their sessions to be saved.
    pub async fn move_away(&self, of: impl Fn(&str) -> bool, wait: std::time::Duration) {
        let handoffs = self.sessions.move_away(of);
        if handoffs.is_empty() {
            return;
        }
        tracing::info!(
            connections = handoffs.len(),
            "mqtt clients moving to their tenants' next node"
        );
        let released = futures::future::join_all(handoffs.iter().map(|h| h.released()));
        let _ = tokio::time::timeout(wait, released).await;
    }

    /// Client ids connected or waiting for a delayed will.
    pub fn live_sessions(&self) -> usize {
        self.sessions.len()
    }

    pub fn new(config: Arc<Config>, broker: Arc<Broker>, tls: Option<super::tls::Tls>) -> Self {
        let subject_limits = SubjectLimits {
            max_len: config.limits.max_subject_len,
            max_tokens: config.limits.max_subject_tokens,
        };
        let session_limits = Arc::new(crate::session::SessionLimits {
            subjects: subject_limits,
            max_payload: config.native.max_payload,
            max_subscriptions: config.mqtt.max_subscriptions,
        });
        Self {
            config,
            broker,
            subject_limits,
            session_limits,
            sessions: session::Sessions::default(),
            tracker: TaskTracker::new(),
            tls,
        }
    }
}

/// Accepts MQTT connections until `shutdown` fires; each gets its own task in
/// `tracker`.
pub async fn accept_loop(
    listener: TcpListener,
    context: Arc<MqttContext>,
    tracker: &TaskTracker,
    shutdown: CancellationToken,
) {
    let max = context.config.mqtt.max_connections;
    super::listener::accept_loop(
        listener,
        "mqtt",
        max,
        tracker,
        shutdown.clone(),
        |stream, peer, admitted| {
            let context = Arc::clone(&context);
            let shutdown = shutdown.clone();
            async move {
                if admitted {
                    connection::serve(stream, peer, context, shutdown).await;
                } else {
                    // MQTT has no way to refuse before CONNECT; closing is the answer.
                    tracing::warn!(%peer, "mqtt connection refused: maximum connections reached");
                }
            }
        },
    )
    .await;
}
