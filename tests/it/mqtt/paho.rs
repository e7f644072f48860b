//! paho-mqtt 2.x and a raw-socket Python client against Canopy: one fresh server per
//! test, one scenario of tests/python/mqtt_scenarios.py per test (its docstrings say
//! exactly what each checks; `python mqtt_scenarios.py --list` prints them).

use canopy::config::Config;

use super::{mqtt_addr, run_scenario};
use crate::common::{file_config, start, test_config};

async fn scenario_with(config: Config, scenario: &str, args: &[&str]) {
    let server = start(config).await;
    run_scenario(mqtt_addr(&server), scenario, args).await;
    server.stop().await;
}

async fn scenario(scenario: &str, args: &[&str]) {
    scenario_with(test_config(), scenario, args).await;
}

// --- Publish and subscribe, each protocol level ---------------------------------

#[tokio::test]
async fn roundtrip_qos_0_1_2_mqtt31() {
    scenario("roundtrip", &["v31"]).await;
}

#[tokio::test]
async fn roundtrip_qos_0_1_2_mqtt311() {
    scenario("roundtrip", &["v311"]).await;
}

#[tokio::test]
async fn roundtrip_qos_0_1_2_mqtt5() {
    scenario("roundtrip", &["v5"]).await;
}

// --- Retained messages ------------------------------------------------------------

#[tokio::test]
async fn retained_delivered_kept_and_cleared_mqtt311() {
    scenario("retained", &["v311"]).await;
}

#[tokio::test]
async fn retained_delivered_kept_and_cleared_mqtt5() {
    scenario("retained", &["v5"]).await;
}

// --- Wills --------------------------------------------------------------------------

#[tokio::test]
async fn will_on_abnormal_close_not_on_disconnect_mqtt31() {
    scenario("will", &["v31"]).await;
}

#[tokio::test]
async fn will_on_abnormal_close_not_on_disconnect_mqtt311() {
    scenario("will", &["v311"]).await;
}

#[tokio::test]
async fn will_on_abnormal_close_not_on_disconnect_mqtt5() {
    scenario("will", &["v5"]).await;
}

#[tokio::test]
async fn will_delay_interval_mqtt5() {
    scenario("will_delay", &["v5"]).await;
}

// --- QoS 2 and redelivery -----------------------------------------------------------

#[tokio::test]
async fn qos2_exactly_once_and_qos_downgrade_mqtt311() {
    scenario("qos2", &["v311"]).await;
}

#[tokio::test]
async fn qos2_exactly_once_and_qos_downgrade_mqtt5() {
    scenario("qos2", &["v5"]).await;
}

#[tokio::test]
async fn unacked_qos1_redelivered_with_dup_and_same_id_mqtt311() {
    scenario("redelivery", &["v311", "1"]).await;
}

#[tokio::test]
async fn unacked_qos2_and_pubrel_redelivered_mqtt311() {
    scenario("redelivery", &["v311", "2"]).await;
}

#[tokio::test]
async fn unacked_qos1_redelivered_with_dup_and_same_id_mqtt5() {
    scenario("redelivery", &["v5", "1"]).await;
}

#[tokio::test]
async fn unacked_qos2_and_pubrel_redelivered_mqtt5() {
    scenario("redelivery", &["v5", "2"]).await;
}

// --- Sessions -----------------------------------------------------------------------

#[tokio::test]
async fn persistent_session_gets_offline_messages_in_order_mqtt311() {
    scenario("persistent_session", &["v311"]).await;
}

#[tokio::test]
async fn persistent_session_gets_offline_messages_in_order_mqtt5() {
    scenario("persistent_session", &["v5"]).await;
}

#[tokio::test]
async fn clean_session_ends_at_disconnect_mqtt311() {
    scenario("clean_session", &["v311"]).await;
}

#[tokio::test]
async fn clean_start_with_expiry_0_ends_at_disconnect_mqtt5() {
    scenario("clean_session", &["v5"]).await;
}

#[tokio::test]
async fn second_connect_with_same_client_id_takes_over_mqtt311() {
    scenario("takeover", &["v311"]).await;
}

#[tokio::test]
async fn second_connect_with_same_client_id_takes_over_with_0x8e_mqtt5() {
    scenario("takeover", &["v5"]).await;
}

/// The session (subscription and queued QoS 1 messages) and retained messages are in
/// the store, so they outlive the server process.
async fn restart(version: &str) {
    let folder = tempfile::tempdir().expect("tempdir");
    let server = start(file_config(folder.path())).await;
    run_scenario(mqtt_addr(&server), "restart_setup", &[version]).await;
    server.stop().await;
    let server = start(file_config(folder.path())).await;
    run_scenario(mqtt_addr(&server), "restart_check", &[version]).await;
    server.stop().await;
}

#[tokio::test]
async fn session_and_retained_survive_restart_mqtt311() {
    restart("v311").await;
}

#[tokio::test]
async fn session_and_retained_survive_restart_mqtt5() {
    restart("v5").await;
}

// --- Authorization --------------------------------------------------------------------

fn deny_secret() -> Config {
    let mut config = test_config();
    config.authz.deny_subscribe = vec!["secret.>".into()];
    config
}

#[tokio::test]
async fn denied_filter_gets_suback_0x80_others_granted_mqtt311() {
    scenario_with(deny_secret(), "suback_deny", &["v311"]).await;
}

#[tokio::test]
async fn denied_filter_gets_suback_0x87_others_granted_mqtt5() {
    scenario_with(deny_secret(), "suback_deny", &["v5"]).await;
}

// --- Matching -----------------------------------------------------------------------

#[tokio::test]
async fn overlapping_subscriptions_max_qos_mqtt311() {
    scenario("overlap", &["v311"]).await;
}

#[tokio::test]
async fn overlapping_subscriptions_carry_subscription_ids_mqtt5() {
    scenario("overlap", &["v5"]).await;
}

#[tokio::test]
async fn dollar_topics_not_matched_by_wildcards_mqtt311() {
    scenario("dollar_topics", &["v311"]).await;
}

#[tokio::test]
async fn dollar_topics_not_matched_by_wildcards_mqtt5() {
    scenario("dollar_topics", &["v5"]).await;
}

#[tokio::test]
async fn shared_subscription_splits_messages_mqtt5() {
    scenario("shared", &["v5"]).await;
}

// --- Keep alive and limits ------------------------------------------------------------

#[tokio::test]
async fn keep_alive_expiry_disconnects_and_publishes_will_mqtt311() {
    scenario("keepalive", &["v311"]).await;
}

#[tokio::test]
async fn keep_alive_expiry_disconnects_and_publishes_will_mqtt5() {
    scenario("keepalive", &["v5"]).await;
}

#[tokio::test]
async fn topic_alias_set_used_and_out_of_range_0x94_mqtt5() {
    scenario("topic_alias", &["v5"]).await;
}

#[tokio::test]
async fn client_receive_maximum_bounds_unacked_deliveries_mqtt5() {
    scenario("receive_maximum_out", &["v5"]).await;
}

#[tokio::test]
async fn exceeding_server_receive_maximum_gets_0x93_mqtt5() {
    scenario("receive_maximum_in", &["v5"]).await;
}
