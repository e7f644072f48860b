//! End-to-end flow control shared by the publishers and subscribers of one run: a
//! publisher waits while more than `max_in_flight` messages are published but not yet
//! received by every subscriber.
//!
//! PING/PONG alone only proves the server *processed* the publishes; a server that
//! queues deliveries without slowing publishers (Canopy does, by design) lets the backlog
//! grow until a slow-consumer disconnect. Bounding what is in flight end to end keeps the
//! run measuring sustained throughput on both servers, and keeps latency meaningful.
//!
//! Owns: the shared counters, the wait and its deadline, and the failure flag a receiver
//! raises so publishers stop at once.
//!
//! Must never: block a thread (waits are async), or wait without a deadline.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::BenchError;

pub struct Flow {
    /// Messages published, summed over publishers (updated after every batch written).
    sent: AtomicU64,
    /// Per subscriber: messages received.
    received: Vec<AtomicU64>,
    /// Published messages each subscriber receives (1 for fan-in and fan-out alike).
    max_in_flight: u64,
    failed: AtomicBool,
    progress: Notify,
}

impl Flow {
    /// `max_in_flight == 0` turns the bound off.
    pub fn new(subscribers: usize, max_in_flight: u64) -> Flow {
        Flow {
            sent: AtomicU64::new(0),
            received: (0..subscribers).map(|_| AtomicU64::new(0)).collect(),
            max_in_flight,
            failed: AtomicBool::new(false),
            progress: Notify::new(),
        }
    }

    /// A subscriber's running count.
    pub fn received(&self, subscriber: usize, count: u64) {
        if let Some(slot) = self.received.get(subscriber) {
            slot.store(count, Ordering::Release);
        }
        self.progress.notify_waiters();
    }

    /// A receiver failed: publishers waiting or about to wait stop.
    pub fn fail(&self) {
        self.failed.store(true, Ordering::Release);
        self.progress.notify_waiters();
    }

    fn in_flight(&self) -> u64 {
        let slowest = self
            .received
            .iter()
            .map(|r| r.load(Ordering::Acquire))
            .min()
            .unwrap_or(u64::MAX);
        self.sent.load(Ordering::Acquire).saturating_sub(slowest)
    }

    /// Counts `n` more published messages, then waits (up to `timeout` without
    /// progress) until at most `max_in_flight` are in flight.
    pub async fn published(&self, n: u64, timeout: Duration) -> Result<(), BenchError> {
        self.sent.fetch_add(n, Ordering::AcqRel);
        if self.max_in_flight == 0 {
            return Ok(());
        }
        loop {
            let progress = self.progress.notified();
            if self.failed.load(Ordering::Acquire) {
                return Err(BenchError::ReceiverFailed);
            }
            if self.in_flight() <= self.max_in_flight {
                return Ok(());
            }
            tokio::time::timeout(timeout, progress)
                .await
                .map_err(|_| BenchError::Timeout {
                    role: "publisher (waiting for subscribers)",
                    timeout,
                })?;
        }
    }
}
