//! Stored publishes that wait for their shard. In a cluster a shard can be without
//! a home for a moment: no node owns it (a node handed it over and the next has not
//! claimed it yet, or its owner's lease ran out), its owner cannot be reached (it
//! died and its lease has not run out yet), or this node claimed it and is still
//! opening its store. A publish that comes then waits here,
//! in order, and goes to the shard's home once it has one; past a bound of time it
//! is answered as not stored, as it was at once before.
//!
//! Must never: hold more than its byte bound (a publish past it is refused at once),
//! or let a later publish to a shard overtake one waiting for it (while a shard's
//! queue is being released, new publishes join its end).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::Broker;
use crate::store::AppendRequest;

/// What all waiting publishes of a node may hold together.
const MAX_BYTES: usize = 64 << 20;
/// How many publishes a release hands on before looking at the shard's home again.
const RELEASE_BATCH: usize = 64;

/// The publishes waiting for their shards.
pub struct Parked {
    wait: Duration,
    inner: Mutex<Inner>,
    /// Shards with a queue: when none has, a publish never takes the lock.
    queues: AtomicUsize,
}

#[derive(Default)]
struct Inner {
    shards: HashMap<u32, Queue>,
    bytes: usize,
}

#[derive(Default)]
struct Queue {
    /// Oldest first.
    waiting: VecDeque<Waiting>,
    /// A task is handing the queue on to the shard's home.
    releasing: bool,
}

/// A publish waiting, with the time it is refused at.
struct Waiting {
    deadline: Instant,
    size: usize,
    request: AppendRequest,
}

fn size_of(request: &AppendRequest) -> usize {
    let messages: usize = request
        .messages
        .iter()
        .map(|m| m.headers.len() + m.payload.len() + 32)
        .sum();
    messages + request.subject.len() + 256
}

impl Parked {
    /// Publishes wait up to `wait` for their shard.
    pub fn new(wait: Duration) -> Self {
        Self {
            wait,
            inner: Mutex::default(),
            queues: AtomicUsize::new(0),
        }
    }

    /// How long a publish may wait.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Whether publishes to `shard` wait, or are being released: a new one then
    /// joins the queue rather than overtaking them.
    pub fn holds(&self, shard: u32) -> bool {
        self.queues.load(Ordering::Acquire) != 0 && self.inner.lock().shards.contains_key(&shard)
    }

    /// Queues `request` for `shard`; gives it back when the bound is reached.
    pub fn park(&self, shard: u32, request: AppendRequest) -> Result<(), Box<AppendRequest>> {
        let size = size_of(&request);
        let mut inner = self.inner.lock();
        if inner.bytes + size > MAX_BYTES {
            return Err(Box::new(request));
        }
        inner.bytes += size;
        let deadline = Instant::now() + self.wait;
        let queue = inner.shards.entry(shard).or_insert_with(|| {
            self.queues.fetch_add(1, Ordering::AcqRel);
            Queue::default()
        });
        queue.waiting.push_back(Waiting {
            deadline,
            size,
            request,
        });
        Ok(())
    }

    /// Marks `shard`'s queue as being released; false when it has none or another
    /// task releases it already.
    fn begin_release(&self, shard: u32) -> bool {
        match self.inner.lock().shards.get_mut(&shard) {
            Some(queue) if !queue.releasing && !queue.waiting.is_empty() => {
                queue.releasing = true;
                true
            }
            _ => false,
        }
    }

    /// The next publishes of a queue being released, oldest first. Empty when none
    /// is left: the queue is gone and the release over.
    fn next(&self, shard: u32) -> VecDeque<Waiting> {
        let mut inner = self.inner.lock();
        let Some(queue) = inner.shards.get_mut(&shard) else {
            return VecDeque::new();
        };
        let count = queue.waiting.len().min(RELEASE_BATCH);
        let taken: VecDeque<Waiting> = queue.waiting.drain(..count).collect();
        if queue.waiting.is_empty() && taken.is_empty() {
            inner.shards.remove(&shard);
            self.queues.fetch_sub(1, Ordering::AcqRel);
        }
        inner.bytes -= taken.iter().map(|w| w.size).sum::<usize>();
        taken
    }

    /// Puts publishes taken for release back at the front of their queue (the
    /// shard lost its home meanwhile, or its owner cannot be reached) and ends the
    /// release.
    fn put_back(&self, shard: u32, taken: VecDeque<Waiting>) {
        let mut inner = self.inner.lock();
        inner.bytes += taken.iter().map(|w| w.size).sum::<usize>();
        let queue = inner.shards.entry(shard).or_insert_with(|| {
            self.queues.fetch_add(1, Ordering::AcqRel);
            Queue::default()
        });
        for waiting in taken.into_iter().rev() {
            queue.waiting.push_front(waiting);
        }
        queue.releasing = false;
    }

    /// Takes the publishes whose wait is over.
    fn expired(&self, now: Instant) -> Vec<AppendRequest> {
        let mut inner = self.inner.lock();
        let mut taken = Vec::new();
        let mut freed = 0;
        for queue in inner.shards.values_mut() {
            while queue.waiting.front().is_some_and(|w| w.deadline <= now) {
                if let Some(waiting) = queue.waiting.pop_front() {
                    freed += waiting.size;
                    taken.push(waiting.request);
                }
            }
        }
        inner.bytes -= freed;
        let before = inner.shards.len();
        inner
            .shards
            .retain(|_, queue| queue.releasing || !queue.waiting.is_empty());
        self.queues
            .fetch_sub(before - inner.shards.len(), Ordering::AcqRel);
        taken
    }

    /// The shards with publishes waiting and no release under way.
    fn waiting_shards(&self) -> Vec<u32> {
        self.inner
            .lock()
            .shards
            .iter()
            .filter(|(_, queue)| !queue.releasing && !queue.waiting.is_empty())
            .map(|(&shard, _)| shard)
            .collect()
    }
}

const WAITED_TOO_LONG: &str = "the tenant's shard found no owner in time (it is moving to another node); not stored, \
     try again";
const TOO_MANY_WAITING: &str = "the tenant's shard is moving to another node and too many publishes wait for it; not \
     stored, try again";

impl Broker {
    /// Lets `request` wait for its shard's home, or answers it as not stored when
    /// too much waits already.
    pub fn park(&self, request: AppendRequest) {
        let Some(mesh) = self.mesh() else {
            return;
        };
        let shard = mesh.shard_of(&request.tenant);
        if let Err(request) = mesh.parked().park(shard, request) {
            self.answer(mesh.refuse_append(*request, TOO_MANY_WAITING));
        }
    }

    /// Sends what waits for `shard` to its home, if it has one now. Publishes
    /// meanwhile queue behind, so the order of each publisher's holds.
    pub fn release_parked(self: &Arc<Self>, shard: u32) {
        let Some(mesh) = self.mesh() else {
            return;
        };
        if !mesh.has_home(shard) || !mesh.parked().begin_release(shard) {
            return;
        }
        let broker = Arc::clone(self);
        tokio::spawn(async move { broker.drain_parked(shard).await });
    }

    async fn drain_parked(&self, shard: u32) {
        let Some(mesh) = self.mesh() else {
            return;
        };
        loop {
            let mut batch = mesh.parked().next(shard);
            if batch.is_empty() {
                return;
            }
            while let Some(waiting) = batch.pop_front() {
                let Waiting { deadline, size, .. } = waiting;
                if let Err(request) = self.append_routed(mesh, waiting.request).await {
                    batch.push_front(Waiting {
                        deadline,
                        size,
                        request: *request,
                    });
                    mesh.parked().put_back(shard, batch);
                    return;
                }
            }
        }
    }

    /// Answers the publishes that waited too long, and releases the queues whose
    /// shards found a home (a release missed while one was under way). Called a few
    /// times a second.
    pub fn tend_parked(self: &Arc<Self>) {
        let Some(mesh) = self.mesh() else {
            return;
        };
        let expired = mesh.parked().expired(Instant::now());
        if !expired.is_empty() {
            tracing::warn!(
                count = expired.len(),
                "publishes waited too long for their shard's owner; answered as not stored"
            );
        }
        for request in expired {
            self.answer(mesh.refuse_append(request, WAITED_TOO_LONG));
        }
        for shard in mesh.parked().waiting_shards() {
            self.release_parked(shard);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Durability, NewMessage, RouteTag};

    fn request(subject: &str) -> AppendRequest {
        AppendRequest {
            tenant: Arc::from("t"),
            subject: Arc::from(subject),
            messages: vec![NewMessage {
                headers: bytes::Bytes::new(),
                payload: bytes::Bytes::from_static(b"x"),
                flags: 0,
            }],
            expect: None,
            msg_id: None,
            durability: Durability::Durable,
            ack: None,
            route: RouteTag::default(),
            compaction: None,
            max_versions: 0,
            retain: false,
        }
    }

    fn subjects<'a>(requests: impl IntoIterator<Item = &'a AppendRequest>) -> Vec<&'a str> {
        requests.into_iter().map(|r| &*r.subject).collect()
    }

    fn taken(waiting: &VecDeque<Waiting>) -> Vec<&str> {
        subjects(waiting.iter().map(|w| &w.request))
    }

    #[tokio::test(start_paused = true)]
    async fn releases_in_order_and_keeps_latecomers_behind() {
        let parked = Parked::new(Duration::from_secs(5));
        assert!(!parked.holds(3));
        parked.park(3, request("a")).ok().unwrap();
        parked.park(3, request("b")).ok().unwrap();
        assert!(parked.holds(3));
        assert!(!parked.holds(4));
        assert!(parked.begin_release(3));
        assert!(!parked.begin_release(3), "one release at a time");
        let first = parked.next(3);
        assert_eq!(taken(&first), ["a", "b"]);
        // A publish during the release still queues: it must not pass a and b.
        assert!(parked.holds(3));
        parked.park(3, request("c")).ok().unwrap();
        parked.put_back(3, first);
        assert!(parked.begin_release(3));
        assert_eq!(taken(&parked.next(3)), ["a", "b", "c"]);
        assert!(parked.next(3).is_empty());
        assert!(!parked.holds(3));
        assert_eq!(parked.inner.lock().bytes, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn refuses_past_the_wait_and_the_bound() {
        let parked = Parked::new(Duration::from_secs(5));
        parked.park(1, request("a")).ok().unwrap();
        tokio::time::advance(Duration::from_secs(3)).await;
        parked.park(1, request("b")).ok().unwrap();
        assert!(parked.expired(Instant::now()).is_empty());
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(subjects(&parked.expired(Instant::now())), ["a"]);
        assert_eq!(parked.waiting_shards(), [1]);
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(subjects(&parked.expired(Instant::now())), ["b"]);
        assert!(!parked.holds(1));
        let mut big = request("big");
        big.messages[0].payload = bytes::Bytes::from(vec![0u8; MAX_BYTES]);
        assert!(parked.park(1, big).is_err());
        assert!(!parked.holds(1));
    }
}
