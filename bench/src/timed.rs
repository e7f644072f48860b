//! Starting and ending a timed run the same way for every protocol: the receivers first,
//! then the clock, then the publishers, and what the receivers got as one [`Measured`]
//! ([`publish_run`]); every task aborted together when one fails ([`Tasks`]).
//!
//! Owns: the measured span of the publisher shapes, and which error a failed run
//! reports when both sides failed.
//!
//! Must never: start the clock before the receivers run, or leave a task running after
//! it returns.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::clock::now_ns;
use super::flow::Flow;
use super::measured::Measured;
use super::roles::{self, Connection, PublishPlan};
use super::{BenchError, Options};

/// Aborts every task when dropped, so an early error leaves nothing running.
pub struct Tasks<T>(pub Vec<JoinHandle<T>>);

impl<T> Drop for Tasks<T> {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

impl<R> Tasks<Result<R, BenchError>> {
    /// Awaits every task in order; the first error ends the wait (the rest are aborted).
    pub async fn join(mut self) -> Result<Vec<R>, BenchError> {
        let mut out = Vec::with_capacity(self.0.len());
        for task in &mut self.0 {
            out.push(task.await??);
        }
        Ok(out)
    }
}

/// Starts the subscribers (each expecting `options.msgs`, failing after `idle` without
/// a message), then the clock, then the publishers; measures from the start to the last
/// message received, with the end-to-end bound `options.max_in_flight`. Subscribers and
/// publishers may speak different protocols (ws-fanout: WebSocket subscribers, a NATS
/// publisher).
pub async fn publish_run<S: Connection, P: Connection>(
    options: &Options,
    subscribers: Vec<S>,
    publishers: Vec<(P, PublishPlan)>,
    flow: Arc<Flow>,
    idle: Duration,
) -> Result<Measured, BenchError> {
    let expected_each = options.msgs;
    let counts = (publishers.len(), subscribers.len());
    let mut receiving = Tasks(
        subscribers
            .into_iter()
            .enumerate()
            .map(|(index, conn)| {
                let flow = flow.clone();
                tokio::spawn(async move {
                    let result =
                        roles::subscribe(conn, expected_each, idle, flow.clone(), index).await;
                    if result.is_err() {
                        flow.fail();
                    }
                    result
                })
            })
            .collect(),
    );
    let start = now_ns();
    let sending = Tasks(
        publishers
            .into_iter()
            .map(|(conn, plan)| tokio::spawn(roles::publish(conn, plan)))
            .collect(),
    );
    if let Err(error) = sending.join().await {
        // A subscriber that failed (a slow-consumer disconnect, a connection the server
        // closed) explains a publisher's failure better than the publisher can.
        for task in &mut receiving.0 {
            if let Ok(Ok(Err(cause))) = tokio::time::timeout(idle, task).await {
                return Err(cause);
            }
        }
        return Err(error);
    }
    let received = receiving.join().await?;
    Ok(
        Measured::new(options.msgs, options.size, counts.0, counts.1)
            .received(start, &received)
            .bounded(options.max_in_flight),
    )
}
