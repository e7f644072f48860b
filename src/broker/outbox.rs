//! The bounded outbox of one connection: the only place where a publisher hands
//! bytes to a subscriber.
//!
//! Publishers encode each delivery straight into the subscriber's buffer under a
//! short lock (one copy of the payload), mark the outbox in their [`Wakes`], and wake
//! it once at the end of their inbound batch. The connection's own task swaps the
//! buffer out and writes it. An outbox never grows past `max_pending` bytes plus one
//! message: the delivery that crosses the line turns the connection into a slow
//! consumer instead, and it is closed by its own task. Nothing here may block on a
//! socket or wait for the subscriber.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::Metrics;

const OPEN: u8 = 0;
const SLOW: u8 = 1;
const CLOSED: u8 = 2;

/// Why bytes were not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The outbox passed its limit: the connection is now a slow consumer.
    SlowConsumer,
    /// The connection is closing or closed.
    Closed,
}

pub struct Outbox {
    pub conn_id: u64,
    buf: Mutex<BytesMut>,
    notify: Notify,
    max_pending: usize,
    state: AtomicU8,
    /// Set while some publisher holds this outbox in its [`Wakes`], so a batch wakes
    /// each outbox once however many messages it queued there.
    wake_scheduled: AtomicBool,
    /// The client negotiated headers (HMSG); without them headers are stripped.
    headers: AtomicBool,
    /// The client wants its own publishes delivered to its own subscriptions.
    echo: AtomicBool,
    metrics: Arc<Metrics>,
}

impl Outbox {
    pub fn new(conn_id: u64, max_pending: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            conn_id,
            // Allocated on first use: idle connections hold no buffer.
            buf: Mutex::new(BytesMut::new()),
            notify: Notify::new(),
            max_pending,
            state: AtomicU8::new(OPEN),
            wake_scheduled: AtomicBool::new(false),
            headers: AtomicBool::new(false),
            echo: AtomicBool::new(true),
            metrics,
        }
    }

    pub fn set_options(&self, headers: bool, echo: bool) {
        self.headers.store(headers, Ordering::Relaxed);
        self.echo.store(echo, Ordering::Relaxed);
    }

    pub fn headers(&self) -> bool {
        self.headers.load(Ordering::Relaxed)
    }

    pub fn echo(&self) -> bool {
        self.echo.load(Ordering::Relaxed)
    }

    /// Appends what `encode` writes, unless the outbox is closed or already slow.
    /// Crossing `max_pending` marks the connection a slow consumer (counted once) and
    /// wakes its task, which tells the client and closes.
    #[inline]
    pub fn push(&self, encode: impl FnOnce(&mut BytesMut)) -> Result<(), Refused> {
        let mut buf = self.buf.lock();
        match self.state.load(Ordering::Acquire) {
            OPEN => {}
            SLOW => return Err(Refused::SlowConsumer),
            _ => return Err(Refused::Closed),
        }
        encode(&mut buf);
        if buf.len() > self.max_pending {
            drop(buf);
            if self
                .state
                .compare_exchange(OPEN, SLOW, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.metrics.count_slow_consumer();
            }
            self.notify.notify_one();
            return Err(Refused::SlowConsumer);
        }
        Ok(())
    }

    /// Queues bytes the connection sends for itself (PONG, +OK, -ERR): these bypass
    /// the limit so a slow consumer can still be told why it is dropped.
    pub fn push_control(&self, encode: impl FnOnce(&mut BytesMut)) {
        let mut buf = self.buf.lock();
        if self.state.load(Ordering::Acquire) != CLOSED {
            encode(&mut buf);
        }
    }

    /// Swaps the pending bytes into `spare` for writing; what `spare` held is dropped.
    pub fn take(&self, spare: &mut BytesMut) {
        spare.clear();
        std::mem::swap(&mut *self.buf.lock(), spare);
    }

    pub fn is_empty(&self) -> bool {
        self.buf.lock().is_empty()
    }

    pub fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) == OPEN
    }

    pub fn is_slow(&self) -> bool {
        self.state.load(Ordering::Acquire) == SLOW
    }

    /// Marks the outbox a slow consumer from the owning task (a socket write that
    /// passed its deadline).
    pub fn mark_slow(&self) {
        if self
            .state
            .compare_exchange(OPEN, SLOW, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.metrics.count_slow_consumer();
        }
    }

    /// Refuses every later delivery and drops what is queued.
    pub fn close(&self) {
        self.state.store(CLOSED, Ordering::Release);
        let mut buf = self.buf.lock();
        *buf = BytesMut::new();
    }

    /// Resolves when a publisher or the owner woke this outbox. Cancel-safe: a wake
    /// that arrives while nobody waits is kept as a permit.
    pub async fn woken(&self) {
        self.notify.notified().await;
    }

    pub fn wake(&self) {
        self.notify.notify_one();
    }
}

/// The outboxes one inbound batch touched, each woken once when the batch ends.
#[derive(Default)]
pub struct Wakes {
    pending: Vec<Arc<Outbox>>,
}

impl Wakes {
    pub fn add(&mut self, outbox: &Arc<Outbox>) {
        // Whoever set the flag wakes the outbox after clearing it, and our bytes were
        // queued before we looked: either we push it, or its wake comes after our push.
        if !outbox.wake_scheduled.swap(true, Ordering::AcqRel) {
            self.pending.push(Arc::clone(outbox));
        }
    }

    pub fn wake_all(&mut self) {
        for outbox in self.pending.drain(..) {
            // An RMW, so that it joins the release sequence of the flag that other
            // publishers' swaps read.
            outbox.wake_scheduled.swap(false, Ordering::AcqRel);
            outbox.wake();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

impl Drop for Wakes {
    fn drop(&mut self) {
        self.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outbox_past_its_limit_becomes_slow_and_counts_once() {
        let metrics = Arc::new(Metrics::default());
        let outbox = Outbox::new(1, 10, Arc::clone(&metrics));
        assert_eq!(outbox.push(|b| b.extend_from_slice(b"12345")), Ok(()));
        assert_eq!(
            outbox.push(|b| b.extend_from_slice(b"123456")),
            Err(Refused::SlowConsumer)
        );
        assert_eq!(
            outbox.push(|b| b.extend_from_slice(b"1")),
            Err(Refused::SlowConsumer)
        );
        assert!(outbox.is_slow());
        assert_eq!(metrics.snapshot().slow_consumers, 1);
        outbox.push_control(|b| b.extend_from_slice(b"-ERR"));
        let mut spare = BytesMut::new();
        outbox.take(&mut spare);
        assert_eq!(&spare[..], b"12345123456-ERR");
    }

    #[test]
    fn a_batch_wakes_each_outbox_once() {
        let metrics = Arc::new(Metrics::default());
        let a = Arc::new(Outbox::new(1, 100, Arc::clone(&metrics)));
        let b = Arc::new(Outbox::new(2, 100, metrics));
        let mut wakes = Wakes::default();
        for _ in 0..3 {
            wakes.add(&a);
            wakes.add(&b);
        }
        assert_eq!(wakes.pending.len(), 2);
        wakes.wake_all();
        assert!(wakes.is_empty());
        wakes.add(&a);
        assert_eq!(
            wakes.pending.len(),
            1,
            "a woken outbox can be scheduled again"
        );
    }

    #[test]
    fn a_closed_outbox_refuses_and_forgets() {
        let outbox = Outbox::new(1, 100, Arc::new(Metrics::default()));
        outbox.push(|b| b.extend_from_slice(b"x")).expect("open");
        outbox.close();
        assert_eq!(
            outbox.push(|b| b.extend_from_slice(b"y")),
            Err(Refused::Closed)
        );
        assert!(outbox.is_empty());
    }
}
