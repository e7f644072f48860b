//! Subcommands of the `canopy` binary that talk to a running server beyond plain
//! pub/sub. Presentation only: every operation is a request to the server's
//! `$CANOPY.` API, so this code never reaches into the store. `bench` is the exception:
//! it only runs the `canopy-bench` executable, and so is `cluster`, which reads etcd.

pub mod bench;
pub mod cluster;
pub mod connect;
pub mod encryption;
pub mod groups;
pub mod plugins;
pub mod pubsub;
pub mod schemas;
pub mod serve;
pub mod streams;
pub mod tenants;
pub mod users;
