//! Integration tests: a real Canopy server on free loopback ports, driven by real
//! clients (async-nats, nats-py, the `canopy` binary, raw TCP). One test binary, so
//! CI links once.

mod asyncapi;
mod auth;
mod bench;
mod bench_mqtt;
mod browser;
mod cli;
mod cli_auth;
mod common;
mod crash;
mod deploy;
mod durable;
mod faults;
mod format;
mod frontends;
mod group_await;
mod groups;
mod http;
mod isolation;
mod jetstream_publish;
mod jetstream_pull;
mod js;
mod limits;
mod local_folder;
mod login_memory;
mod logins;
mod mqtt;
mod mqtt_native;
mod nats_client;
mod python;
mod quotas;
mod refusals;
mod replies;
mod response_topics;
mod s3;
mod schemas;
mod snapshots;
mod tables;
mod tenants;
mod tls;
mod wills;
mod wire;
mod ws_groups;
mod ws_limits;
