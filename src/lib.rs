//! Canopy: a pub/sub server whose every leaf subject is its own durable key stream.
//!
//! The library holds the server (config, broker, listeners, tenancy) and the small
//! native client the CLI uses; `main.rs` is only the command line around it. Layers
//! import downward only, in the order ARCHITECTURE.md draws and `tests/it/layers.rs`
//! checks (server, session, api, broker, tables, groups, schemas, tenancy, metrics,
//! config, store, clock), and nothing below `server` knows about sockets.

pub mod api;
pub mod broker;
pub mod client;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod follow;
pub mod groups;
pub mod metrics;
pub mod plugins;
pub mod publish;
pub mod schemas;
pub mod sealing;
pub mod server;
pub mod session;
pub mod store;
pub mod streams;
pub mod tables;
pub mod tenancy;
