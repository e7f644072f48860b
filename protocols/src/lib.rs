//! Canopy's wire codecs, kept free of I/O.
//!
//! Owns: turning bytes into protocol frames and frames into bytes, for every front end Canopy
//! speaks: the NATS-compatible native protocol in [`native`], MQTT 3.1, 3.1.1 and 5.0 in
//! [`mqtt`], the JSON messages of the `/ws` WebSocket API in [`ws`], and the frames
//! Canopy nodes send each other in [`link`].
//!
//! Must never: do I/O, depend on tokio or on any client library, allocate without bound for
//! input it has not validated, or panic on any input bytes.

#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic
    )
)]

pub mod address;
pub mod link;
pub mod mqtt;
pub mod native;
pub mod ws;
