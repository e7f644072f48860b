//! One follower of a tenant's log: history from the store, then what its tap queued.
//! Must never hand out a message twice or out of order, or (when `durable`) one a
//! restart would not find.

use std::collections::VecDeque;
use std::sync::Arc;

use canopy_subjects::{Pattern, Subject};
use tokio::sync::mpsc;

use super::taps::{Queue, Queued, Registration, Tap, Taps, size};
use crate::store::{ReplayFrom, ReplayPage, Store, StoreError, StoredMessage};

/// What a follower follows.
#[derive(Debug, Clone)]
pub enum Target {
    /// One subject: positions are its versions, and only its key range is read.
    Subject(String),
    /// Every subject a pattern matches: positions are tenant offsets.
    Pattern(Pattern),
    /// Every subject any of several patterns matches (a JetStream consumer's
    /// `filter_subjects`): positions are tenant offsets.
    Patterns(Vec<Pattern>),
    /// A caller's set of filters, given at each read (an MQTT session's, which may
    /// change between pages): positions are tenant offsets. History only.
    Filters,
}

/// What one step of following gave.
#[derive(Debug, Default)]
pub struct Page {
    pub messages: Vec<StoredMessage>,
    /// The position after this page: a version for a subject, else an offset.
    pub next: u64,
    /// Nothing stored is left after this page, for now.
    pub caught_up: bool,
}

/// Follows one target of one tenant's log from a position; see the module's docs.
pub struct Follower {
    store: Arc<Store>,
    tenant: Arc<str>,
    target: Target,
    from: ReplayFrom,
    live: Option<Live>,
    /// A live source was registered before the follower: the first read waits for
    /// a durability barrier.
    behind_live: bool,
    /// Reading the store (else taking the tap's queue).
    reading: bool,
    /// The next read sets the queue aside and passes a barrier first.
    restart: bool,
    /// Hands out from the queue only what a durability barrier vouches for.
    durable: bool,
    max_messages: usize,
    max_bytes: usize,
}

struct Live {
    queue: Arc<Queue>,
    rx: mpsc::Receiver<Queued>,
    epoch: u64,
    /// Taken off the queue, not yet handed out (kept across a cancelled step).
    pending: VecDeque<StoredMessage>,
    /// One per pattern: a message two patterns match is queued twice, and the second
    /// is dropped by its position.
    _registrations: Vec<Registration>,
}

impl Follower {
    /// Reads `target`'s history from `from` (history only, until [`Follower::tapped`]).
    pub fn new(store: Arc<Store>, tenant: Arc<str>, target: Target, from: ReplayFrom) -> Self {
        Self {
            store,
            tenant,
            target,
            from,
            live: None,
            behind_live: false,
            reading: true,
            restart: true,
            durable: false,
            max_messages: crate::store::PAGE_MESSAGES,
            max_bytes: crate::store::PAGE_BYTES,
        }
    }

    /// At most `messages` and about `bytes` per step.
    pub fn pages_of(mut self, messages: usize, bytes: usize) -> Self {
        self.max_messages = messages.max(1);
        self.max_bytes = bytes.max(1);
        self
    }

    /// Reads from `from` instead: a follower whose tap had to be registered before
    /// its start was known.
    pub fn starting_at(mut self, from: ReplayFrom) -> Self {
        self.from = from;
        self
    }

    /// The caller subscribed live before making the follower: the first read passes a
    /// durability barrier, so the history it reads meets the live messages.
    pub fn behind_live_subscription(mut self) -> Self {
        self.behind_live = true;
        self
    }

    /// Follows live once caught up: a queue of at most `max_bytes` registered now
    /// with the tenant's taps. With `durable`, what the queue gives is handed out
    /// only after a durability barrier. May come after history was read: the next
    /// read passes a barrier and reads again from the position, so what was routed
    /// before the tap is not missed.
    pub fn tapped(mut self, taps: &Arc<Taps>, max_bytes: usize, durable: bool) -> Self {
        self.reading = true;
        self.restart = true;
        let patterns = match &self.target {
            Target::Subject(subject) => Pattern::parse_native(subject).ok().into_iter().collect(),
            Target::Pattern(pattern) => vec![pattern.clone()],
            Target::Patterns(patterns) => patterns.clone(),
            Target::Filters => Vec::new(),
        };
        if !patterns.is_empty() {
            let (queue, rx) = Queue::new(QUEUE_MESSAGES, max_bytes);
            let registrations = patterns
                .iter()
                .map(|pattern| taps.register(pattern, Arc::clone(&queue) as Arc<dyn Tap>))
                .collect();
            self.live = Some(Live {
                queue,
                rx,
                epoch: 0,
                pending: VecDeque::new(),
                _registrations: registrations,
            });
            self.durable = durable;
        }
        self
    }

    /// The position the next message is at least at: a version for a subject, else
    /// an offset.
    pub fn position(&self) -> u64 {
        match self.from {
            ReplayFrom::Version(n) | ReplayFrom::Offset(n) => n.max(1),
            ReplayFrom::Start | ReplayFrom::Time(_) => 1,
        }
    }

    /// Whether the follower takes live messages now (it has caught up).
    pub fn is_live(&self) -> bool {
        !self.reading
    }

    /// The next messages: a page of history while behind; once caught up, what the
    /// tap queued, waiting for at least one. A follower without a tap gives its last
    /// page (`caught_up`, maybe empty) and reads again on the next call.
    /// Cancel-safe: what was taken off the queue waits for the next call.
    pub async fn next(&mut self) -> Result<Page, StoreError> {
        self.next_matching(&|_| true).await
    }

    /// [`Follower::next`] for [`Target::Filters`]: `matches` says which subjects.
    pub async fn next_matching(
        &mut self,
        matches: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Page, StoreError> {
        loop {
            if self.reading {
                let page = self.read(matches).await?;
                if !page.messages.is_empty() || !page.caught_up || self.live.is_none() {
                    return Ok(page);
                }
                continue;
            }
            let page = self.take_queued().await?;
            if !page.messages.is_empty() {
                return Ok(page);
            }
        }
    }

    /// One page of history; once caught up, a tapped follower goes live.
    async fn read(&mut self, matches: &(dyn Fn(&str) -> bool + Sync)) -> Result<Page, StoreError> {
        if self.restart {
            self.set_queue_aside();
            if self.behind_live || self.live.is_some() {
                self.store.durable_barrier().await?;
            }
            self.restart = false;
        }
        let (max, bytes) = (self.max_messages, self.max_bytes);
        let page: ReplayPage = match &self.target {
            Target::Subject(subject) => {
                self.store
                    .replay_subject(&self.tenant, subject, self.from, max, bytes)
                    .await?
            }
            Target::Pattern(pattern) => {
                let matches = |subject: &str| {
                    Subject::parse_native(subject).is_ok_and(|s| pattern.matches(&s))
                };
                self.store
                    .replay_matching(&self.tenant, &matches, self.from, max, bytes)
                    .await?
            }
            Target::Patterns(patterns) => {
                let matches = |subject: &str| {
                    Subject::parse_native(subject)
                        .is_ok_and(|s| patterns.iter().any(|p| p.matches(&s)))
                };
                self.store
                    .replay_matching(&self.tenant, &matches, self.from, max, bytes)
                    .await?
            }
            Target::Filters => {
                self.store
                    .replay_matching(&self.tenant, matches, self.from, max, bytes)
                    .await?
            }
        };
        self.from = self.position_at(page.next);
        if page.caught_up && self.live.is_some() {
            self.reading = false;
        }
        Ok(Page {
            messages: page.messages,
            next: page.next,
            caught_up: page.caught_up,
        })
    }

    /// About to read the store from the position: what the queue missed or holds is
    /// read there, so the queue starts a new epoch and its stale messages' room is
    /// freed now, for what comes while the store is read.
    fn set_queue_aside(&mut self) {
        let Some(live) = self.live.as_mut() else {
            return;
        };
        live.queue.take_gap();
        live.epoch = live.queue.next_epoch();
        live.pending.clear();
        // The queue is in order: stale messages come first.
        while let Ok(queued) = live.rx.try_recv() {
            live.queue.taken(&queued);
            if queued.epoch == live.epoch {
                live.pending.push_back(queued.message);
                break;
            }
        }
    }

    /// What the queue gives, after the position and (when durable) a barrier; a gap
    /// sends the follower back to the store.
    async fn take_queued(&mut self) -> Result<Page, StoreError> {
        let by_version = matches!(self.target, Target::Subject(_));
        let mut position = self.position();
        let Some(live) = self.live.as_mut() else {
            self.reading = true;
            return Ok(Page::default());
        };
        if live.pending.is_empty() && !live.queue.has_gap() {
            let first = tokio::select! {
                first = live.rx.recv() => first,
                () = live.queue.missed_something() => None,
            };
            if let Some(first) = first {
                take(live, first);
            }
            while live.pending.len() < self.max_messages {
                let Ok(queued) = live.rx.try_recv() else {
                    break;
                };
                take(live, queued);
            }
        }
        let gap = if self.durable {
            self.store.durable_barrier().await?;
            live.queue.take_gap()
        } else if live.queue.has_gap() {
            live.queue.take_gap()
        } else {
            None
        };
        let mut page = Page::default();
        let mut bytes = 0;
        while page.messages.len() < self.max_messages && bytes < self.max_bytes {
            let Some(message) = live.pending.pop_front() else {
                break;
            };
            if gap.is_some_and(|gap| message.offset >= gap) {
                live.pending.clear();
                break;
            }
            let at = if by_version {
                message.version
            } else {
                message.offset
            };
            if at < position {
                continue;
            }
            position = at + 1;
            bytes += size(&message);
            page.messages.push(message);
        }
        if gap.is_some() {
            self.reading = true;
            self.restart = true;
        }
        page.next = position;
        page.caught_up = !self.reading && live.pending.is_empty() && live.rx.is_empty();
        self.from = self.position_at(position);
        Ok(page)
    }

    fn position_at(&self, next: u64) -> ReplayFrom {
        match self.target {
            Target::Subject(_) => ReplayFrom::Version(next),
            _ => ReplayFrom::Offset(next),
        }
    }
}

/// Messages a follower's queue holds at most.
const QUEUE_MESSAGES: usize = 65_536;

/// Takes a queued message unless it is of an older epoch.
fn take(live: &mut Live, queued: Queued) {
    live.queue.taken(&queued);
    if queued.epoch == live.epoch {
        live.pending.push_back(queued.message);
    }
}
