//! Following a tenant's log: "give me tenant T's stored messages that match P, in
//! order, from position X on, live from the sequencer once caught up, from the store
//! across any gap". Table writers, `replay --follow`, a `/ws` subscription's
//! history, an MQTT session's backlog and consumer groups all follow the log through
//! this module, so the rule for joining history to live is written once:
//!
//! 1. register a [`Tap`] (or a live subscription) first, so nothing routed from then
//!    on is missed;
//! 2. pass a durability barrier, so everything routed before is in the store;
//! 3. read the store from the position, a page at a time, until caught up;
//! 4. then take what the tap queued, dropping what the store already gave by
//!    position, and go back to 2 whenever the tap says it missed something.
//!
//! The sequencer routes a round before it is written, so a follower that must hand
//! out only stored messages (`durable`) passes a barrier before it gives out what the
//! tap queued; a failed write marks every tap's gap, and the barrier resolves only
//! after that, so such a follower never gives a message a restart would not find.
//!
//! Must never block the sequencer (a tap's offer never waits: what does not fit is a
//! gap, read from the store later), hold more than a tap's byte bound of queued
//! messages, or know what its followers do with the messages.

mod follower;
mod taps;

pub use follower::{Follower, Page, Target};
pub use taps::{Queue, Registration, Tap, Taps};

#[cfg(test)]
mod tests;
