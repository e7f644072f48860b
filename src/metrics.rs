//! Counters of what the broker did, shared by every connection.
//!
//! Plain relaxed atomics: they are read for reports and `/metrics`, never used to
//! decide anything, so they must never take a lock or sit behind one.

use std::sync::atomic::{AtomicU64, Ordering};

/// The front ends, for counting connections by protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Native = 0,
    Mqtt = 1,
    /// The JSON API on `/ws` (MQTT over WebSocket counts as MQTT).
    WebSocket = 2,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::Native, Protocol::Mqtt, Protocol::WebSocket];

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Native => "native",
            Protocol::Mqtt => "mqtt",
            Protocol::WebSocket => "websocket",
        }
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    connections_total: AtomicU64,
    connections_open: AtomicU64,
    /// Open connections by [`Protocol`].
    open_by_protocol: [AtomicU64; 3],
    msgs_in: AtomicU64,
    bytes_in: AtomicU64,
    msgs_out: AtomicU64,
    bytes_out: AtomicU64,
    slow_consumers: AtomicU64,
    stalls: AtomicU64,
    stale_connections: AtomicU64,
    /// Deliveries not sent: larger than the client's maximum packet size.
    dropped: AtomicU64,
    password_checks: AtomicU64,
    group_catch_up_reads: AtomicU64,
    group_delivery_reads: AtomicU64,
}

/// One reading of every counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    pub connections_total: u64,
    pub connections_open: u64,
    pub msgs_in: u64,
    pub bytes_in: u64,
    pub msgs_out: u64,
    pub bytes_out: u64,
    pub slow_consumers: u64,
    /// Times a publisher's reading waited for subscribers falling behind.
    pub stalls: u64,
    pub stale_connections: u64,
    pub dropped: u64,
    /// Password hash verifications of logins (an unknown user costs one too).
    pub password_checks: u64,
    /// Store reads consumer groups made to catch up: pages of their subjects walked,
    /// and subjects read for where a group's start begins.
    pub group_catch_up_reads: u64,
    pub group_delivery_reads: u64,
}

impl Metrics {
    pub fn connection_opened(&self, protocol: Protocol) {
        self.connections_total.fetch_add(1, Ordering::Relaxed);
        self.connections_open.fetch_add(1, Ordering::Relaxed);
        self.open_by_protocol[protocol as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_closed(&self, protocol: Protocol) {
        self.connections_open.fetch_sub(1, Ordering::Relaxed);
        self.open_by_protocol[protocol as usize].fetch_sub(1, Ordering::Relaxed);
    }

    /// Connections open now on one front end.
    pub fn open_connections(&self, protocol: Protocol) -> u64 {
        self.open_by_protocol[protocol as usize].load(Ordering::Relaxed)
    }

    pub fn count_in(&self, msgs: u64, bytes: u64) {
        self.msgs_in.fetch_add(msgs, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn count_out(&self, msgs: u64, bytes: u64) {
        self.msgs_out.fetch_add(msgs, Ordering::Relaxed);
        self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn count_slow_consumer(&self) {
        self.slow_consumers.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_stall(&self) {
        self.stalls.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_password_check(&self) {
        self.password_checks.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_group_catch_up_read(&self) {
        self.group_catch_up_reads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_group_delivery_read(&self) {
        self.group_delivery_reads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }

    pub fn count_stale_connection(&self) {
        self.stale_connections.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> MetricsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            connections_total: get(&self.connections_total),
            connections_open: get(&self.connections_open),
            msgs_in: get(&self.msgs_in),
            bytes_in: get(&self.bytes_in),
            msgs_out: get(&self.msgs_out),
            bytes_out: get(&self.bytes_out),
            slow_consumers: get(&self.slow_consumers),
            stalls: get(&self.stalls),
            stale_connections: get(&self.stale_connections),
            dropped: get(&self.dropped),
            password_checks: get(&self.password_checks),
            group_catch_up_reads: get(&self.group_catch_up_reads),
            group_delivery_reads: get(&self.group_delivery_reads),
        }
    }
}
