//! `canopy tenant ...`: the `$CANOPY.tenant.*` API for people. Prints one line per
//! tenant, or JSON with `--json`.

use std::time::Duration;

use anyhow::Result;
use canopy::client::Client;
use serde_json::{Value, json};

use super::streams::call_json;

/// What a tenant may use, as the command line gives it (unset: no limit).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct LimitArgs {
    /// Open connections at most.
    #[arg(long)]
    pub max_connections: Option<u64>,
    /// Live subscriptions at most.
    #[arg(long)]
    pub max_subscriptions: Option<u64>,
    /// Messages published per second at most.
    #[arg(long)]
    pub max_publish_msgs_per_sec: Option<u64>,
    /// Payload bytes published per second at most.
    #[arg(long)]
    pub max_publish_bytes_per_sec: Option<u64>,
    /// Bytes stored at most.
    #[arg(long)]
    pub max_stored_bytes: Option<u64>,
    /// Stored subjects at most.
    #[arg(long)]
    pub max_subjects: Option<u64>,
}

impl LimitArgs {
    fn json(&self) -> Value {
        let mut limits = serde_json::Map::new();
        for (name, value) in [
            ("max_connections", self.max_connections),
            ("max_subscriptions", self.max_subscriptions),
            ("max_publish_msgs_per_sec", self.max_publish_msgs_per_sec),
            ("max_publish_bytes_per_sec", self.max_publish_bytes_per_sec),
            ("max_stored_bytes", self.max_stored_bytes),
            ("max_subjects", self.max_subjects),
        ] {
            if let Some(value) = value {
                limits.insert(name.to_owned(), json!(value));
            }
        }
        Value::Object(limits)
    }
}

/// One line for a tenant: its name and its limits.
fn line(tenant: &Value) -> String {
    let name = tenant["name"].as_str().unwrap_or("?");
    let limits = match tenant["limits"].as_object() {
        Some(limits) if !limits.is_empty() => limits
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        _ => "no limits".to_owned(),
    };
    format!("{name}  {limits}")
}

fn print(value: &Value, json: bool) {
    if json {
        println!("{value}");
    } else {
        println!("{}", line(value));
    }
}

/// Whether a tenant is made or its limits replaced.
#[derive(Debug, Clone, Copy)]
pub enum Change {
    Create,
    Update,
}

/// Creates a tenant, or replaces its limits, and prints the result.
pub async fn change(
    client: &mut Client,
    change: Change,
    name: &str,
    limits: &LimitArgs,
    json: bool,
    timeout: Duration,
) -> Result<()> {
    let api = match change {
        Change::Create => "$CANOPY.tenant.create",
        Change::Update => "$CANOPY.tenant.update",
    };
    let body = json!({"name": name, "limits": limits.json()});
    let record = call_json(client, api, &body, timeout).await?;
    print(&record, json);
    Ok(())
}

pub async fn list(client: &mut Client, json: bool, timeout: Duration) -> Result<()> {
    let answer = call_json(client, "$CANOPY.tenant.list", &json!({}), timeout).await?;
    for tenant in answer["tenants"].as_array().into_iter().flatten() {
        print(tenant, json);
    }
    Ok(())
}

pub async fn describe(
    client: &mut Client,
    name: &str,
    json: bool,
    timeout: Duration,
) -> Result<()> {
    let answer = call_json(
        client,
        "$CANOPY.tenant.describe",
        &json!({ "name": name }),
        timeout,
    )
    .await?;
    if json {
        println!("{answer}");
    } else {
        println!("{}", line(&answer));
        println!("subjects  {}", answer["usage"]["subjects"]);
    }
    Ok(())
}

pub async fn delete(client: &mut Client, name: &str, timeout: Duration) -> Result<()> {
    call_json(
        client,
        "$CANOPY.tenant.delete",
        &json!({ "name": name }),
        timeout,
    )
    .await?;
    println!("tenant {name} deleted; its data is purged in the background");
    Ok(())
}
