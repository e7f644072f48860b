//! A running group's door: its bounded input queue, and the overflow where acks wait in
//! order when the queue is full, so an ack is never dropped for a moment's backlog and
//! never overtakes one sent before it. Must never wait on the group's task.

use super::*;

pub(super) struct Handle {
    pub(super) name: String,
    pub(super) pattern: Pattern,
    /// The pattern as given, for a caller's right to read the group.
    pub(super) text: Arc<str>,
    pub(super) tx: mpsc::Sender<Input>,
    pub(super) lagging: Arc<AtomicBool>,
    /// Set when the group is deleted or replaced: its task writes no more cursors,
    /// which would outlive the group's deletion.
    pub(super) stopped: Arc<AtomicBool>,
    /// Acks that found the queue full, in the order they came.
    pub(super) overflow: parking_lot::Mutex<Overflow>,
    /// The group's place among its tenant's followers of the log, until it stops.
    pub(super) tap: parking_lot::Mutex<Option<crate::follow::Registration>>,
    /// The group's task, until someone waits for it to end.
    pub(super) task: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The sequencer offers a group each stored message its pattern matches; a full
/// queue marks the group lagging, and it rescans its subjects from the store.
impl crate::follow::Tap for Handle {
    fn offer(&self, message: &Sequenced<'_>) {
        let observed = Observed {
            offset: message.offset,
            time_ms: message.time_ms,
            headers: message.headers.clone(),
            payload: message.payload.clone(),
        };
        let input = Input::Observed(Arc::from(message.subject), message.version, observed);
        if self.tx.try_send(input).is_err() {
            self.lagging.store(true, Ordering::Release);
        }
    }

    fn lost(&self) {
        // What was offered may not be stored: the walk finds what is.
        self.lagging.store(true, Ordering::Release);
    }
}

impl Handle {
    /// Takes the group out of its tenant's followers and tells its task it stopped.
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.tap.lock().take();
    }
}

/// Inputs waiting for room in a group's queue, and whether a task is moving them in.
#[derive(Default)]
pub(super) struct Overflow {
    pub(super) queued: VecDeque<Input>,
    /// The subjects and reply subjects those inputs carry, in bytes.
    pub(super) bytes: usize,
    pub(super) draining: bool,
}

/// Acks one group holds beyond its queue at most; more are refused as busy.
pub(super) const OVERFLOW: usize = 65_536;
/// And the bytes of their subjects at most (an ack names a subject of up to the
/// subject limit, and a confirmation's reply subject).
pub(super) const OVERFLOW_BYTES: usize = 8 << 20;

/// The bytes an input in the overflow holds beyond its fixed size.
pub(super) fn weight(input: &Input) -> usize {
    let confirm = |c: &Option<(String, Arc<Tenant>)>| c.as_ref().map_or(0, |(to, _)| to.len());
    match input {
        Input::Reply(reply) => reply.subject.len() + confirm(&reply.confirm),
        Input::JetStreamReply(reply) => confirm(&reply.confirm),
        _ => 0,
    }
}

/// How [`Groups::reply`] and [`Groups::jetstream_reply`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handed {
    /// The group has it, or will in the order it came.
    Queued,
    /// No such group is running.
    NotRunning,
    /// The group is this far behind: the ack was dropped (the delivery goes again
    /// after its ack wait).
    Busy,
    /// The caller may not read the group: the ack was dropped.
    Denied,
}

impl Handle {
    /// Queues `input` without waiting (see [`Groups::reply`]).
    pub(super) fn offer(self: &Arc<Self>, input: Input) -> Handed {
        let mut overflow = self.overflow.lock();
        let input = if overflow.queued.is_empty() {
            match self.tx.try_send(input) {
                Ok(()) => return Handed::Queued,
                Err(mpsc::error::TrySendError::Closed(_)) => return Handed::NotRunning,
                Err(mpsc::error::TrySendError::Full(input)) => input,
            }
        } else if overflow.queued.len() >= OVERFLOW || overflow.bytes >= OVERFLOW_BYTES {
            return Handed::Busy;
        } else {
            input
        };
        overflow.bytes += weight(&input);
        overflow.queued.push_back(input);
        if !std::mem::replace(&mut overflow.draining, true) {
            tokio::spawn(Arc::clone(self).drain());
        }
        Handed::Queued
    }

    /// Moves the overflow into the queue as it has room, oldest first. A hand-off
    /// finds the overflow empty only once its last input is in the queue, so nothing
    /// overtakes what came before it.
    pub(super) async fn drain(self: Arc<Self>) {
        loop {
            let Ok(permit) = self.tx.reserve().await else {
                let mut overflow = self.overflow.lock();
                overflow.queued.clear();
                overflow.bytes = 0;
                overflow.draining = false;
                return;
            };
            let mut overflow = self.overflow.lock();
            match overflow.queued.pop_front() {
                Some(input) => {
                    overflow.bytes = overflow.bytes.saturating_sub(weight(&input));
                    permit.send(input);
                }
                None => {
                    overflow.draining = false;
                    return;
                }
            }
        }
    }
}
