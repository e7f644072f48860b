//! MQTT 5 exchanges between clients, with paho-mqtt 2.x and the raw-socket client:
//! the scenarios of tests/python/mqtt5_exchanges.py (`--list` prints what each
//! checks), one fresh server per test.
//!
//! - request/response between two MQTT 5 clients: the Response Topic and Correlation
//!   Data reach the responder unchanged, and its answer reaches the requester;
//! - overlapping subscriptions of one connection deliver one copy, at the highest
//!   QoS, with every matching subscription identifier;
//! - a subscription acknowledged right after a reconnect with the same client id
//!   (clean start, the old connection ending or being taken over) receives what is
//!   published after its SUBACK.

use std::net::SocketAddr;

use super::mqtt_addr;
use crate::common::{start, test_config};

/// Runs one scenario of mqtt5_exchanges.py against `addr`; fails with its message.
async fn run(addr: SocketAddr, scenario: &str, args: &[&str]) {
    super::run_script("mqtt5_exchanges.py", addr, scenario, args).await;
}

async fn scenario(name: &str, args: &[&str]) {
    let server = start(test_config()).await;
    run(mqtt_addr(&server), name, args).await;
    server.stop().await;
}

#[tokio::test]
async fn request_response_between_two_mqtt5_clients_qos1() {
    scenario("request_response", &["1"]).await;
}

#[tokio::test]
async fn request_response_between_two_mqtt5_clients_qos0() {
    scenario("request_response", &["0"]).await;
}

#[tokio::test]
async fn overlapping_subscriptions_deliver_one_copy_with_both_ids() {
    scenario("overlap_one_copy", &[]).await;
}

#[tokio::test]
async fn a_subscription_right_after_a_reconnect_receives_mqtt5() {
    scenario("reconnect_then_receive", &["90", "v5"]).await;
}

#[tokio::test]
async fn a_subscription_right_after_a_reconnect_receives_mqtt311() {
    scenario("reconnect_then_receive", &["90", "v311"]).await;
}

#[tokio::test]
async fn a_subscription_right_after_a_paho_reconnect_receives() {
    scenario("reconnect_then_receive_paho", &["30"]).await;
}
