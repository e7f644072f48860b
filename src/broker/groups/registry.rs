//! Running groups: each tenant's (kept in its [`Tenant`]: the handles, its waits'
//! count and its place in the catch-up line) and the server's bounds across tenants
//! (waits per caller, pulls per connection). Starting and stopping group tasks,
//! handing pulls, acks and info calls to the right task, and waits for groups to pass
//! a message (`Canopy-Await`). Must never run a group's work on the caller's task.

use super::*;

/// One tenant's running groups and what they share.
pub struct TenantGroups {
    /// Replaced whole on a change, so a lookup holds the lock only to clone it.
    list: RwLock<Arc<Vec<Arc<Handle>>>>,
    /// Publishes waiting for the tenant's groups (bounded by [`MAX_WAITING`]).
    waiting: Arc<AtomicUsize>,
    /// The tenant's one place in the server's catch-up line (see [`Pace`]).
    pace: Arc<tokio::sync::Semaphore>,
}

impl Default for TenantGroups {
    fn default() -> Self {
        Self {
            list: RwLock::default(),
            waiting: Arc::default(),
            pace: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }
}

impl TenantGroups {
    fn find(&self, group: &str) -> Option<Arc<Handle>> {
        self.list.read().iter().find(|h| h.name == group).cloned()
    }

    /// Replaces the list with `change` made to it.
    fn edit(&self, change: impl FnOnce(&mut Vec<Arc<Handle>>)) {
        let mut list = self.list.write();
        let mut changed = list.as_ref().clone();
        change(&mut changed);
        *list = Arc::new(changed);
    }

    /// Hands every group of the tenant over to another node: each leaves its tenant's
    /// followers and its task ends once its queue is drained, writing its cursors
    /// as it goes (not stopped, which would skip that). Returns the tasks, to wait
    /// for before the store closes.
    pub fn hand_over_all(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        self.edit(|list| {
            for handle in list.drain(..) {
                handle.tap.lock().take();
                tasks.extend(handle.task.lock().take());
            }
        });
        tasks
    }

    /// Stops every group of a tenant that is closing.
    pub fn stop_all(&self) {
        self.edit(|list| {
            for handle in list.drain(..) {
                handle.stop();
            }
        });
    }

    /// How many groups run.
    pub fn len(&self) -> usize {
        self.list.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The server's bounds on groups across tenants; each tenant's groups are in its
/// [`Tenant`].
#[derive(Default)]
pub struct Groups {
    /// Publishes waiting for groups, per caller (bounded by [`CALLER_WAITING`]); a caller without waits
    /// has no entry.
    callers: Arc<parking_lot::Mutex<HashMap<CallerKey, usize>>>,
    /// Pulls handed to groups and not yet ended, per connection (bounded by
    /// [`CONNECTION_PULLS`]); a connection without any has no entry.
    pulls: Arc<parking_lot::Mutex<HashMap<u64, usize>>>,
}

/// A group's turn at catching up: first its tenant's one place, then one of the
/// server's [`CATCH_UP`] places. A tenant thus has at most one step in the server's
/// line at a time, so one tenant's thousand groups take turns among themselves and
/// another tenant's first pull waits for at most one step of each other tenant.
#[derive(Clone)]
pub(super) struct Pace {
    tenant: Arc<tokio::sync::Semaphore>,
}

impl Pace {
    pub(super) async fn step(
        &self,
    ) -> (
        Option<tokio::sync::SemaphorePermit<'static>>,
        Option<tokio::sync::OwnedSemaphorePermit>,
    ) {
        let tenant = Arc::clone(&self.tenant).acquire_owned().await.ok();
        (CATCH_UP.acquire().await.ok(), tenant)
    }
}

/// Gives a waiting publish's places (its tenant's and its caller's) back when its
/// wait ends.
pub(super) struct WaitingPlace {
    tenant: Arc<AtomicUsize>,
    callers: Arc<parking_lot::Mutex<HashMap<CallerKey, usize>>>,
    caller: CallerKey,
}

impl Drop for WaitingPlace {
    fn drop(&mut self) {
        self.tenant.fetch_sub(1, Ordering::AcqRel);
        let mut callers = self.callers.lock();
        if let Some(n) = callers.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                callers.remove(&self.caller);
            }
        }
    }
}

impl Groups {
    /// Queues `input` for a running group; false when it is not running.
    async fn send_to(&self, tenant: &Tenant, group: &str, input: Input) -> bool {
        match tenant.groups.find(group) {
            Some(handle) => handle.tx.send(input).await.is_ok(),
            None => false,
        }
    }

    /// Hands a pull to its group; false when the group is not running.
    pub async fn pull(&self, tenant: &Tenant, group: &str, pull: Pull) -> bool {
        self.send_to(tenant, group, Input::Pull(pull)).await
    }

    /// A place for one more pull of `connection` that may wait, or `None` when it has
    /// [`CONNECTION_PULLS`] already.
    pub fn pull_place(&self, connection: u64) -> Option<PullPlace> {
        let mut pulls = self.pulls.lock();
        let n = pulls.entry(connection).or_default();
        if *n >= CONNECTION_PULLS {
            return None;
        }
        *n += 1;
        Some(PullPlace {
            counts: Arc::clone(&self.pulls),
            connection,
        })
    }

    /// A running group's live counts: members, pending, in flight, redelivered, dead
    /// letters, the last dead letters and, with `laggiest`, the laggiest subjects.
    pub async fn info(
        &self,
        tenant: &Tenant,
        group: &str,
        laggiest: bool,
    ) -> Option<serde_json::Value> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let input = Input::Info {
            answer: tx,
            laggiest,
        };
        if !self.send_to(tenant, group, input).await {
            return None;
        }
        rx.await.ok()
    }

    /// Queues `input` for a running group without waiting: into its queue when there
    /// is room, so an ack costs no task; behind the group's overflow otherwise, which
    /// one task moves into the queue in order, so one connection's acks reach the
    /// group in the order it sent them.
    /// Only when `may_read` allows the group's pattern: an ack needs the right a
    /// pull needs, checked here, on the group it goes to, without reading the store.
    fn hand(
        &self,
        tenant: &Tenant,
        group: &str,
        may_read: impl FnOnce(&str) -> bool,
        input: Input,
    ) -> Handed {
        match tenant.groups.find(group) {
            Some(handle) if !may_read(&handle.text) => Handed::Denied,
            Some(handle) => handle.offer(input),
            None => Handed::NotRunning,
        }
    }

    /// Hands an ack (or nack, in-progress, term) to its group, if `may_read` allows
    /// the group's pattern.
    pub fn reply(
        &self,
        tenant: &Tenant,
        group: &str,
        may_read: impl FnOnce(&str) -> bool,
        reply: Reply,
    ) -> Handed {
        self.hand(tenant, group, may_read, Input::Reply(reply))
    }

    /// Hands a JetStream ack to its group, if `may_read` allows the group's pattern.
    pub fn jetstream_reply(
        &self,
        tenant: &Tenant,
        group: &str,
        may_read: impl FnOnce(&str) -> bool,
        reply: JetStreamReply,
    ) -> Handed {
        self.hand(tenant, group, may_read, Input::JetStreamReply(reply))
    }

    /// Calls `answer` once every group in `awaiting` has passed `version` of `subject`
    /// (acked or ended it), or at once for a group that cannot (unknown, not matching
    /// the subject, without live members), or when the wait runs out: with the groups
    /// that passed and those that did not. Never waits itself. A group the wait's
    /// caller may not read is answered as unknown, whatever it is; a wait counts
    /// against its tenant's places and its caller's.
    pub fn await_passing(
        &self,
        tenant: &Tenant,
        subject: Arc<str>,
        version: u64,
        awaiting: &Await,
        answer: impl FnOnce(AwaitOutcome) + Send + 'static,
    ) {
        let parsed = canopy_subjects::Subject::parse_native(&subject).ok();
        let mut slots: Vec<Slot> = Vec::new();
        let mut targets = Vec::new();
        let caller = awaiting.caller.as_ref();
        for name in &awaiting.groups {
            let readable = tenant
                .groups
                .find(name)
                .filter(|handle| caller.is_some_and(|c| c.may_read(&handle.text)));
            let result = match readable {
                None => Some(Err(Missed::NoSuchGroup)),
                Some(handle)
                    if !parsed
                        .as_ref()
                        .is_some_and(|subject| handle.pattern.matches(subject)) =>
                {
                    Some(Err(Missed::NotMatching))
                }
                Some(handle) => {
                    targets.push((slots.len(), handle));
                    None
                }
            };
            slots.push((name.clone(), result));
        }
        // A caller is there whenever a group is a target.
        let (false, Some(caller)) = (targets.is_empty(), caller) else {
            answer(outcome_of(slots, Missed::TimedOut));
            return;
        };
        let Some(place) = self.waiting_place(tenant, caller.key()) else {
            answer(outcome_of(slots, Missed::TooManyWaiting));
            return;
        };
        let deadline = tokio::time::Instant::now() + awaiting.timeout;
        tokio::spawn(async move {
            let _place = place;
            let (tx, mut rx) = mpsc::channel(targets.len());
            let mut left = targets.len();
            for (slot, handle) in targets {
                let waiter = Waiter {
                    subject: Arc::clone(&subject),
                    version,
                    slot,
                    tx: tx.clone(),
                };
                let sent = tokio::time::timeout_at(deadline, handle.tx.send(Input::Await(waiter)));
                if !matches!(sent.await, Ok(Ok(()))) {
                    slots[slot].1 = Some(Err(Missed::Stopped));
                    left -= 1;
                }
            }
            drop(tx);
            let mut unanswered = Missed::TimedOut;
            while left > 0 {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some((slot, result))) => {
                        if slots[slot].1.replace(result).is_none() {
                            left -= 1;
                        }
                    }
                    // Every group that held the wait is gone.
                    Ok(None) => {
                        unanswered = Missed::Stopped;
                        break;
                    }
                    Err(_) => break,
                }
            }
            answer(outcome_of(slots, unanswered));
        });
    }

    /// A place for one more wait of `caller` in `tenant`, or `None` when either has
    /// all it may.
    fn waiting_place(&self, tenant: &Tenant, caller: CallerKey) -> Option<WaitingPlace> {
        let count = Arc::clone(&tenant.groups.waiting);
        if count.fetch_add(1, Ordering::AcqRel) >= MAX_WAITING {
            count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let mut callers = self.callers.lock();
        let n = callers.entry(caller.clone()).or_default();
        if *n >= CALLER_WAITING {
            drop(callers);
            count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        *n += 1;
        drop(callers);
        Some(WaitingPlace {
            tenant: count,
            callers: Arc::clone(&self.callers),
            caller,
        })
    }

    /// Starts a group's task (a group of that name already running is stopped first).
    pub fn start(
        &self,
        broker: &Arc<Broker>,
        store: &Arc<Store>,
        tenant: &Tenant,
        group: StoredGroup,
    ) {
        let StoredGroup {
            spec, created_ms, ..
        } = group;
        let Ok(pattern) = Pattern::parse_native(&spec.pattern) else {
            tracing::warn!(tenant = %tenant.name, group = %spec.name, "a stored group has a bad pattern; not started");
            return;
        };
        let (tx, rx) = mpsc::channel(QUEUE);
        let lagging = Arc::new(AtomicBool::new(false));
        let stopped = Arc::new(AtomicBool::new(false));
        let handle = Arc::new(Handle {
            name: spec.name.clone(),
            pattern: pattern.clone(),
            text: Arc::from(spec.pattern.as_str()),
            tx,
            lagging: Arc::clone(&lagging),
            stopped: Arc::clone(&stopped),
            overflow: parking_lot::Mutex::default(),
            tap: parking_lot::Mutex::default(),
            task: parking_lot::Mutex::default(),
        });

        let task = GroupTask {
            tenant: Arc::clone(&tenant.name),
            dispatcher: Dispatcher::new(spec.limits(), spec.start == StartAt::All),
            spec,
            created_ms,
            pattern,
            broker: Arc::downgrade(broker),
            store: Arc::clone(store),
            lagging,
            stopped,
            members: HashMap::new(),
            next_member: 1,
            waiting: VecDeque::new(),
            sequences: Sequences::default(),
            last_offset: 0,
            observed: Vec::new(),
            kept: Kept::default(),
            awaits: HashMap::new(),
            touched: Vec::new(),
            clock: broker.clock().clone(),
            scan: Scan::Wanted,
            pace: Pace {
                tenant: Arc::clone(&tenant.groups.pace),
            },
        };
        tenant.groups.edit(|list| {
            stop_named(list, &handle.name);
            list.push(Arc::clone(&handle));
        });
        *handle.tap.lock() = Some(tenant.taps.register(
            &handle.pattern,
            Arc::clone(&handle) as Arc<dyn crate::follow::Tap>,
        ));
        *handle.task.lock() = Some(tokio::spawn(task.run(rx)));
    }

    /// Stops a group's task: its queue closes and the task ends.
    pub fn stop(&self, tenant: &Tenant, group: &str) {
        tenant.groups.edit(|list| stop_named(list, group));
    }
}

/// Takes the group called `name` out of `list`, telling its task it is stopped.
pub(super) fn stop_named(list: &mut Vec<Arc<Handle>>, name: &str) {
    list.retain(|h| {
        let keep = h.name != name;
        if !keep {
            h.stop();
        }
        keep
    });
}

/// One group a wait names, and what it answered so far.
type Slot = (Box<str>, Option<Result<(), Missed>>);

/// What a wait's groups did: `unanswered` for each that had not answered.
fn outcome_of(slots: Vec<Slot>, unanswered: Missed) -> AwaitOutcome {
    let mut outcome = AwaitOutcome::default();
    for (group, result) in slots {
        match result.unwrap_or(Err(unanswered)) {
            Ok(()) => outcome.passed.push(group),
            Err(why) => outcome.pending.push((group, why)),
        }
    }
    outcome
}
