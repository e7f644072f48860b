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
//!
//! Before that line comes flow control: an outbox whose unsent bytes (queued here,
//! plus what its task took and has not written yet) pass half its limit is *pressing*,
//! and every publisher that queues into it learns so through its [`Wakes`] (or, for a
//! stored message the sequencer routed, through the publisher's own outbox,
//! [`Outbox::note_fed_pressing`]). The publisher's connection then reads nothing more
//! until the pressing outboxes drain below half ([`Outbox::drained`]), as nats-server
//! stalls a fast producer. The wait is bounded three ways, so a slow client costs
//! only those who feed it, and only for a while: it ends when the subscriber's socket
//! has taken nothing for [`STALL_IDLE`] (its client stopped reading: it will be cut
//! at the limit), after [`STALL_MAX`] at most, and not at all once the subscriber has
//! been behind (past half, not yet back under a quarter) for longer than its
//! connection's write deadline: a subscriber that never catches up is then cut too.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

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

/// Most pressing outboxes one publisher waits for at once: past them it waits for
/// none of the rest, only for the stall's time.
const PRESSING_HELD: usize = 16;

/// A publisher stops waiting for an outbox whose socket took nothing for this long.
/// Not shorter: a socket's writer is woken only once the kernel's send buffer has
/// drained by a good part, which at a few MB/s takes tens of milliseconds, and a
/// subscriber that shares a busy machine may not run for as long (50 ms cut a nats-py
/// subscriber that ten nats-py publishers on two cores starved; 250 ms did not).
pub const STALL_IDLE: Duration = Duration::from_millis(250);
/// The longest one stall lasts: a stalled publisher reads a batch at least this often.
pub const STALL_MAX: Duration = Duration::from_secs(1);
/// How long a subscriber may stay behind before its publishers stop waiting for it,
/// unless its connection says otherwise ([`Outbox::with_behind_limit`]).
const BEHIND_LIMIT: Duration = Duration::from_secs(10);

/// Adds `outbox` to a list of pressing outboxes a publisher waits for, once, and at
/// most [`PRESSING_HELD`] of them.
fn hold(held: &mut Vec<Arc<Outbox>>, outbox: &Arc<Outbox>) {
    if held.len() < PRESSING_HELD && !held.iter().any(|h| Arc::ptr_eq(h, outbox)) {
        held.push(Arc::clone(outbox));
    }
}

/// Milliseconds on a monotonic clock, never 0 (0 means "not set" in the atomics).
fn monotonic_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
}

pub struct Outbox {
    pub conn_id: u64,
    buf: Mutex<BytesMut>,
    notify: Notify,
    max_pending: usize,
    /// Bytes queued and not yet written to the socket (what the task took counts
    /// until it reports it written): past half of `max_pending`, publishers stall.
    unsent: AtomicUsize,
    /// Woken when `unsent` falls back to half of `max_pending` or the outbox closes.
    drained: Notify,
    /// When `unsent` last passed half of `max_pending` after being under a quarter
    /// ([`monotonic_ms`], 0: not behind).
    behind_since: AtomicU64,
    /// When the task last reported bytes written.
    progress: AtomicU64,
    behind_limit_ms: u64,
    /// Subscribers' outboxes that stored messages this connection published were
    /// routed to while they were pressing (the sequencer routes those, not this
    /// connection's task): taken by the connection after its batch.
    fed_pressing: Mutex<Vec<Arc<Outbox>>>,
    any_fed_pressing: AtomicBool,
    state: AtomicU8,
    /// Set while some publisher holds this outbox in its [`Wakes`], so a batch wakes
    /// each outbox once however many messages it queued there.
    wake_scheduled: AtomicBool,
    /// Who reads here: the logged-in user's name (empty for an anonymous client),
    /// which deliver plugins are told.
    reader: parking_lot::RwLock<Arc<str>>,
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
            unsent: AtomicUsize::new(0),
            drained: Notify::new(),
            behind_since: AtomicU64::new(0),
            progress: AtomicU64::new(0),
            behind_limit_ms: BEHIND_LIMIT.as_millis() as u64,
            fed_pressing: Mutex::new(Vec::new()),
            any_fed_pressing: AtomicBool::new(false),
            state: AtomicU8::new(OPEN),
            wake_scheduled: AtomicBool::new(false),
            reader: parking_lot::RwLock::new(Arc::from("")),
            headers: AtomicBool::new(false),
            echo: AtomicBool::new(true),
            metrics,
        }
    }

    /// Who reads here (see [`Outbox::reader`]).
    pub fn set_reader(&self, user: Arc<str>) {
        *self.reader.write() = user;
    }

    /// The user reading here, as deliver plugins are told (empty: anonymous).
    pub fn reader(&self) -> Arc<str> {
        Arc::clone(&self.reader.read())
    }

    /// How long the subscriber may stay behind before its publishers stop waiting
    /// for it (the connection's write deadline, say).
    pub fn with_behind_limit(mut self, limit: Duration) -> Self {
        self.behind_limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        self
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
        let before = buf.len();
        encode(&mut buf);
        self.add_unsent(buf.len() - before);
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
            let before = buf.len();
            encode(&mut buf);
            self.add_unsent(buf.len() - before);
        }
    }

    #[inline]
    fn add_unsent(&self, n: usize) {
        let unsent = self.unsent.fetch_add(n, Ordering::Relaxed) + n;
        if unsent > self.max_pending / 2 && self.behind_since.load(Ordering::Relaxed) == 0 {
            self.fell_behind();
        }
    }

    #[cold]
    fn fell_behind(&self) {
        let _ = self.behind_since.compare_exchange(
            0,
            monotonic_ms(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Swaps the pending bytes into `spare`; what `spare` held is dropped. The bytes
    /// count as sent: for a task that writes them before it takes again.
    pub fn take(&self, spare: &mut BytesMut) {
        self.take_unsent(spare);
        self.sent(spare.len());
    }

    /// Swaps the pending bytes into `spare` for writing, still counted as unsent
    /// until the task reports them with [`Outbox::sent`] as it writes them.
    pub fn take_unsent(&self, spare: &mut BytesMut) {
        spare.clear();
        std::mem::swap(&mut *self.buf.lock(), spare);
    }

    /// Reports `n` taken bytes written (or dropped); wakes the publishers waiting
    /// for this outbox once it is back to half its limit.
    pub fn sent(&self, n: usize) {
        if n == 0 {
            return;
        }
        self.progress.store(monotonic_ms(), Ordering::Relaxed);
        let half = self.max_pending / 2;
        let before = self
            .unsent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            })
            .unwrap_or_default();
        let after = before.saturating_sub(n);
        if after <= self.max_pending / 4 && self.behind_since.load(Ordering::Relaxed) != 0 {
            self.behind_since.store(0, Ordering::Relaxed);
        }
        if before > half && after <= half {
            self.drained.notify_waiters();
        }
    }

    /// Past half its limit and not behind for too long: publishers feeding it
    /// should wait for it.
    #[inline]
    pub fn is_pressing(&self) -> bool {
        self.unsent.load(Ordering::Relaxed) > self.max_pending / 2 && !self.behind_too_long()
    }

    #[cold]
    fn behind_too_long(&self) -> bool {
        let since = self.behind_since.load(Ordering::Relaxed);
        since != 0 && monotonic_ms().saturating_sub(since) > self.behind_limit_ms
    }

    /// Whether a publisher that fed this outbox should wait for it now: it is
    /// pressing, open, and its socket took bytes within [`STALL_IDLE`] (counted from
    /// when it fell behind, if later: an idle connection had nothing to write).
    pub fn holds_back(&self) -> bool {
        self.is_pressing()
            && self.state.load(Ordering::Acquire) == OPEN
            && self.idle_for().is_some()
    }

    /// How much of [`STALL_IDLE`] is left before its socket counts as stuck.
    fn idle_for(&self) -> Option<Duration> {
        let last = self
            .progress
            .load(Ordering::Relaxed)
            .max(self.behind_since.load(Ordering::Relaxed));
        let idle = Duration::from_millis(monotonic_ms().saturating_sub(last));
        let left = STALL_IDLE.saturating_sub(idle);
        (!left.is_zero()).then_some(left)
    }

    /// Waits until a publisher no longer needs to wait for this outbox
    /// ([`Outbox::holds_back`]). Cancel-safe.
    pub async fn drained(&self) {
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if !self.is_pressing() || self.state.load(Ordering::Acquire) != OPEN {
                return;
            }
            let Some(left) = self.idle_for() else {
                return;
            };
            let _ = tokio::time::timeout(left, drained).await;
        }
    }

    /// Records that a stored message this connection published went to `pressing`
    /// (called by the routing of stored messages).
    pub fn note_fed_pressing(&self, pressing: &[Arc<Outbox>]) {
        if self.state.load(Ordering::Acquire) == CLOSED {
            return;
        }
        let mut held = self.fed_pressing.lock();
        for outbox in pressing {
            hold(&mut held, outbox);
        }
        self.any_fed_pressing.store(true, Ordering::Release);
    }

    /// Moves what [`Outbox::note_fed_pressing`] recorded into `into`.
    pub fn take_fed_pressing(&self, into: &mut Vec<Arc<Outbox>>) {
        // A load first: this runs once per turn of the connection's loop, and the
        // flag is almost always clear.
        if !self.any_fed_pressing.load(Ordering::Relaxed)
            || !self.any_fed_pressing.swap(false, Ordering::AcqRel)
        {
            return;
        }
        for outbox in self.fed_pressing.lock().drain(..) {
            hold(into, &outbox);
        }
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
        drop(buf);
        self.unsent.store(0, Ordering::Release);
        self.drained.notify_waiters();
        // Nothing more waits on what this connection fed, and no circle of outboxes
        // holding each other outlives it.
        self.fed_pressing.lock().clear();
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

/// The outboxes one inbound batch touched, each woken once when the batch ends, and
/// those of them that were pressing, which the publisher waits for.
#[derive(Default)]
pub struct Wakes {
    pending: Vec<Arc<Outbox>>,
    pressing: Vec<Arc<Outbox>>,
}

impl Wakes {
    #[inline]
    pub fn add(&mut self, outbox: &Arc<Outbox>) {
        if outbox.is_pressing() {
            self.add_pressing(outbox);
        }
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

    #[cold]
    fn add_pressing(&mut self, outbox: &Arc<Outbox>) {
        hold(&mut self.pressing, outbox);
    }

    /// The pressing outboxes this batch fed, left in `into` (emptied here).
    pub fn take_pressing(&mut self, into: &mut Vec<Arc<Outbox>>) {
        for outbox in self.pressing.drain(..) {
            hold(into, &outbox);
        }
    }

    /// Whether a pressing outbox was fed since the last [`Wakes::take_pressing`].
    pub fn fed_pressing(&self) -> bool {
        !self.pressing.is_empty()
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
    fn an_outbox_presses_past_half_until_what_it_took_is_written() {
        let outbox = Outbox::new(1, 100, Arc::new(Metrics::default()));
        outbox
            .push(|b| b.extend_from_slice(&[b'x'; 50]))
            .expect("open");
        assert!(!outbox.is_pressing(), "half is not past half");
        outbox.push(|b| b.extend_from_slice(b"y")).expect("open");
        assert!(outbox.is_pressing());
        let mut spare = BytesMut::new();
        outbox.take_unsent(&mut spare);
        assert!(outbox.is_pressing(), "taken is not written");
        outbox.sent(1);
        assert!(!outbox.is_pressing(), "back to half");
        outbox.push(|b| b.extend_from_slice(b"z")).expect("open");
        outbox.take(&mut spare);
        assert!(!outbox.is_pressing(), "take counts what it takes as sent");
    }

    #[test]
    fn publishers_stop_waiting_for_a_subscriber_behind_for_too_long() {
        let outbox = Outbox::new(1, 100, Arc::new(Metrics::default()))
            .with_behind_limit(Duration::from_millis(1));
        outbox
            .push(|b| b.extend_from_slice(&[b'x'; 60]))
            .expect("open");
        assert!(
            outbox.holds_back(),
            "just fell behind: its socket had nothing to do"
        );
        std::thread::sleep(Duration::from_millis(5));
        assert!(!outbox.is_pressing(), "behind for longer than its limit");
        // Back under a quarter, it may hold publishers back again next time.
        outbox.sent(40);
        outbox
            .push(|b| b.extend_from_slice(&[b'x'; 40]))
            .expect("open");
        assert!(outbox.is_pressing());
    }

    #[tokio::test]
    async fn a_stuck_subscriber_holds_publishers_back_for_the_idle_bound_only() {
        let outbox = Outbox::new(1, 100, Arc::new(Metrics::default()));
        outbox
            .push(|b| b.extend_from_slice(&[b'x'; 60]))
            .expect("open");
        let started = std::time::Instant::now();
        outbox.drained().await;
        assert!(
            started.elapsed() >= STALL_IDLE / 2,
            "{:?}",
            started.elapsed()
        );
        assert!(!outbox.holds_back(), "its socket took nothing: it is stuck");
        assert!(
            outbox.is_pressing(),
            "still past half: it will be cut at its limit"
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
