//! Who runs the sequencer's rounds: the task that queued an input runs the next round
//! itself when no round is under way, and the sequencer's own task runs them when one
//! is (a round under way, a publisher that found the sequencer busy). A lone publish
//! then goes from its connection's task straight into a round and the journal, with
//! no hop to another task; under load the sequencer's task takes round after round
//! as before, and publishers only queue and wake it (BENCHMARKS.md, session 24).
//!
//! Must never: leave a queued input with no round coming to take it (whoever cannot
//! run one wakes the sequencer's task, which takes everything queued), run two rounds
//! at once (one lock holds the sequencer), or stop a round half-way: a round whose
//! caller stops waiting (a connection's task aborted) finishes on a task of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::mpsc::error::SendError;
use tokio::sync::{Mutex, Notify, OwnedMutexGuard, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Gathered, RoundSink, Sequencer};
use crate::store::Input;

/// The sequencer's queue, as the store sends to it.
pub(in crate::store) struct Inbox {
    queue: mpsc::Sender<Input>,
    shared: Arc<Combining>,
}

struct Combining {
    core: Arc<Mutex<Core>>,
    /// Wakes the sequencer's task: something is queued that no caller took.
    wake: Notify,
}

/// The sequencer and what a round needs, held by whoever runs one.
struct Core {
    sequencer: Sequencer,
    queue: mpsc::Receiver<Input>,
    /// `None` once closed.
    sink: Option<RoundSink>,
    gathered: Gathered,
}

impl Core {
    /// Runs one round of what is queued (up to a round's worth); false when nothing
    /// was.
    async fn pass(&mut self) -> bool {
        let Some(sink) = self.sink.as_mut() else {
            return false;
        };
        let mut took = false;
        while self.sequencer.has_room(&self.gathered)
            && let Ok(input) = self.queue.try_recv()
        {
            self.sequencer.gather(input, &mut self.gathered);
            took = true;
        }
        if took {
            self.sequencer.run_round(&mut self.gathered, sink).await;
        }
        took
    }
}

/// Starts the sequencer: its task, and the inbox that runs rounds in the caller's
/// task when it can.
pub(in crate::store) fn start(
    mut sequencer: Sequencer,
    queue_depth: usize,
    stop: CancellationToken,
) -> (Inbox, JoinHandle<()>) {
    let (sender, queue) = mpsc::channel(queue_depth.max(1));
    let sink = sequencer.start_writing();
    let gathered = Gathered {
        requests: Vec::with_capacity(sequencer.max_batch),
        ..Gathered::default()
    };
    let shared = Arc::new(Combining {
        core: Arc::new(Mutex::new(Core {
            sequencer,
            queue,
            sink: Some(sink),
            gathered,
        })),
        wake: Notify::new(),
    });
    let task = tokio::spawn(run(Arc::clone(&shared), stop));
    let inbox = Inbox {
        queue: sender,
        shared,
    };
    (inbox, task)
}

/// The sequencer's task: runs rounds until nothing is queued whenever woken; once
/// stopped, takes what is already queued, then closes what writes the rounds.
async fn run(shared: Arc<Combining>, stop: CancellationToken) {
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            () = shared.wake.notified() => {}
        }
        let mut core = shared.core.lock().await;
        while core.pass().await {}
    }
    let mut core = shared.core.lock().await;
    core.queue.close();
    while core.pass().await {}
    if let Some(sink) = core.sink.take() {
        sink.close().await;
    }
}

impl Inbox {
    /// Queues an input, then runs a round of what is queued when none is under way
    /// (else the sequencer's task will). Waits while the queue is full.
    pub(in crate::store) async fn send(&self, input: Input) -> Result<(), SendError<Input>> {
        self.queue(input).await?;
        self.run_queued().await;
        Ok(())
    }

    /// Queues an input without running a round: callers with several to send queue
    /// them all, then call [`Inbox::run_queued`] once, so they share one round.
    pub(in crate::store) async fn queue(&self, input: Input) -> Result<(), SendError<Input>> {
        self.queue.send(input).await
    }

    /// Runs one round of what is queued here, in this task, when no round is under
    /// way; else leaves it to the sequencer's task.
    pub(in crate::store) async fn run_queued(&self) {
        match Arc::clone(&self.shared.core).try_lock_owned() {
            Ok(core) => Finishing::new(pass_once(core, Arc::clone(&self.shared))).await,
            Err(_) => self.shared.wake.notify_one(),
        }
    }
}

/// One round run by a caller; what it left queued goes to the sequencer's task, so a
/// caller runs one round at most and gets back to its own work. When no sync was
/// under way, the caller also syncs the round in place once it has let go of the
/// sequencer (others decide and journal the next rounds meanwhile): a blocking data
/// sync on this thread, at most one at a time, instead of two hops to the sync
/// thread and back.
async fn pass_once(mut core: OwnedMutexGuard<Core>, shared: Arc<Combining>) {
    if let Some(sink) = core.sink.as_mut() {
        sink.claim_next();
    }
    core.pass().await;
    let claimed = core.sink.as_mut().and_then(RoundSink::claimed);
    if !core.queue.is_empty() {
        shared.wake.notify_one();
    }
    drop(core);
    if let Some((claimed, syncer)) = claimed {
        syncer.sync_claimed(claimed);
    }
}

/// A future that runs to its end even when dropped: the rest is spawned on the
/// runtime, so a round is never left half-decided by a caller that stops waiting.
struct Finishing(Option<Pin<Box<dyn Future<Output = ()> + Send>>>);

impl Finishing {
    fn new(future: impl Future<Output = ()> + Send + 'static) -> Finishing {
        Finishing(Some(Box::pin(future)))
    }
}

impl Future for Finishing {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(future) = self.0.as_mut() else {
            return Poll::Ready(());
        };
        let polled = future.as_mut().poll(cx);
        if polled.is_ready() {
            self.0 = None;
        }
        polled
    }
}

impl Drop for Finishing {
    fn drop(&mut self) {
        if let Some(rest) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(rest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dropped_future_finishes_on_a_task_of_its_own() {
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
        let finishing = Finishing::new(async move {
            let _ = go.await;
            let _ = done_tx.send(());
        });
        // Polled once (it waits for `go`), then dropped half-way.
        let mut finishing = Box::pin(finishing);
        assert!(futures::poll!(finishing.as_mut()).is_pending());
        drop(finishing);
        go_tx.send(()).expect("the rest still waits for it");
        done.await.expect("the rest ran to its end");
    }
}
