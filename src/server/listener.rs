//! Accepting TCP connections for any front end: one task per connection in the
//! server's tracker, a cap on how many are open, and back-off when accepting fails.
//!
//! What a connection does is the front end's business; this module must never read
//! or write a connection's bytes.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::FutureExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Accepts on `listener` until `shutdown` fires. `serve` gets each connection, and
/// whether it fits under `max_open` (a front end answers one that does not in its
/// own protocol).
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    protocol: &'static str,
    max_open: usize,
    tracker: &TaskTracker,
    shutdown: CancellationToken,
    serve: F,
) where
    F: Fn(TcpStream, SocketAddr, bool) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let open = std::sync::Arc::new(AtomicUsize::new(0));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, protocol, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let admitted = open.fetch_add(1, Ordering::AcqRel) < max_open;
        let connection = serve(stream, peer, admitted);
        let slot = OpenSlot(std::sync::Arc::clone(&open));
        // A combinator, not `async move { connection.await; … }`: such a block keeps
        // the captured future and the awaited one side by side, and every open
        // connection would pay for its state twice.
        tracker.spawn(connection.map(move |()| drop(slot)));
    }
}

/// One connection counted as open until its task ends, however it ends.
struct OpenSlot(std::sync::Arc<AtomicUsize>);

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
