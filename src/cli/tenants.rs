//! `canopy tenant ...`: the `$CANOPY.tenant.*` API for people. Prints one line per
//! tenant, or JSON with `--json`; `describe` adds the tenant's usage.

use std::time::Duration;

use anyhow::Result;
use canopy::client::Client;
use serde_json::{Value, json};

use super::streams::call_json;
use super::users::rules_text;

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
    /// Retention: messages older than this many seconds are removed, whatever their
    /// subject's policy keeps (the shorter wins).
    #[arg(long)]
    pub max_age_secs: Option<u64>,
    /// A rate limit on the subjects of a pattern, beside the tenant's (repeatable):
    /// `PATTERN=ITEMS`, ITEMS comma-separated from `Nmsgs` (messages per second),
    /// `Nbytes` (payload bytes per second) and `per-client` (each connection its own
    /// bucket, else one shared). E.g. `'devices.*.temp=10msgs,4096bytes,per-client'`.
    #[arg(long, value_name = "PATTERN=ITEMS", value_parser = parse_pattern_rate)]
    pub pattern_rate: Vec<canopy::store::PatternRate>,
}

/// One `--pattern-rate`.
fn parse_pattern_rate(text: &str) -> Result<canopy::store::PatternRate, String> {
    let (pattern, items) = text
        .rsplit_once('=')
        .ok_or_else(|| format!("`{text}`: say PATTERN=ITEMS, e.g. 'a.>=10msgs'"))?;
    let mut rate = canopy::store::PatternRate {
        pattern: pattern.trim().to_owned(),
        msgs_per_sec: None,
        bytes_per_sec: None,
        per_client: false,
    };
    for item in items.split(',').map(str::trim) {
        let number = |unit: &str| {
            item.strip_suffix(unit)
                .and_then(|n| n.trim().parse::<u64>().ok())
        };
        match (item, number("msgs"), number("bytes")) {
            ("per-client", _, _) => rate.per_client = true,
            (_, Some(msgs), _) => rate.msgs_per_sec = Some(msgs),
            (_, _, Some(bytes)) => rate.bytes_per_sec = Some(bytes),
            _ => {
                return Err(format!("`{item}`: items are Nmsgs, Nbytes and per-client"));
            }
        }
    }
    Ok(rate)
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
            ("max_age_secs", self.max_age_secs),
        ] {
            if let Some(value) = value {
                limits.insert(name.to_owned(), json!(value));
            }
        }
        if !self.pattern_rate.is_empty() {
            limits.insert("pattern_rates".to_owned(), json!(self.pattern_rate));
        }
        Value::Object(limits)
    }
}

/// What clients that present no credentials may do in a tenant.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct AnonymousArgs {
    /// Clients without credentials may publish to subjects matching PAT (repeatable).
    /// Any --anonymous-* flag replaces the anonymous rules; a side without flags is
    /// denied.
    #[arg(long, value_name = "PAT")]
    pub anonymous_publish: Vec<String>,
    /// Clients without credentials may subscribe to PAT (repeatable).
    #[arg(long, value_name = "PAT")]
    pub anonymous_subscribe: Vec<String>,
}

impl AnonymousArgs {
    /// The API's `anonymous`: rules when a flag was given, `false` with `off`, and
    /// `None` (keep what the tenant has) otherwise.
    pub fn json(&self, off: bool) -> Option<Value> {
        if off {
            return Some(Value::Bool(false));
        }
        if self.anonymous_publish.is_empty() && self.anonymous_subscribe.is_empty() {
            return None;
        }
        // A side with no allow rules would allow everything: deny it instead.
        let side = |allow: &[String]| {
            if allow.is_empty() {
                json!({"deny": [">"]})
            } else {
                json!({ "allow": allow })
            }
        };
        Some(json!({
            "publish": side(&self.anonymous_publish),
            "subscribe": side(&self.anonymous_subscribe),
        }))
    }
}

/// One line for a tenant: its name, its limits and its anonymous rules.
fn line(tenant: &Value) -> String {
    let name = tenant["name"].as_str().unwrap_or("?");
    let limits = match tenant["limits"].as_object() {
        Some(limits) if !limits.is_empty() => limits
            .iter()
            .map(|(k, v)| match v.as_array() {
                Some(rates) if k == "pattern_rates" => {
                    rates.iter().map(rate_text).collect::<Vec<_>>().join(" ")
                }
                _ => format!("{k}={v}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => "no limits".to_owned(),
    };
    match tenant.get("anonymous").filter(|rules| rules.is_object()) {
        Some(rules) => format!("{name}  {limits}  anonymous: {}", rules_text(rules)),
        None => format!("{name}  {limits}"),
    }
}

/// A pattern rate as `--pattern-rate` takes it.
fn rate_text(rate: &Value) -> String {
    let mut items = Vec::new();
    if let Some(msgs) = rate["msgs_per_sec"].as_u64() {
        items.push(format!("{msgs}msgs"));
    }
    if let Some(bytes) = rate["bytes_per_sec"].as_u64() {
        items.push(format!("{bytes}bytes"));
    }
    if rate["per_client"] == json!(true) {
        items.push("per-client".to_owned());
    }
    format!(
        "pattern_rate={}={}",
        rate["pattern"].as_str().unwrap_or("?"),
        items.join(",")
    )
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

/// Creates a tenant, or replaces its limits (and its anonymous rules, when given),
/// and prints the result.
pub async fn change(
    client: &mut Client,
    change: Change,
    name: &str,
    limits: &LimitArgs,
    anonymous: Option<Value>,
    json: bool,
    timeout: Duration,
) -> Result<()> {
    let api = match change {
        Change::Create => "$CANOPY.tenant.create",
        Change::Update => "$CANOPY.tenant.update",
    };
    let mut body = json!({"name": name, "limits": limits.json()});
    if let Some(anonymous) = anonymous {
        body["anonymous"] = anonymous;
    }
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
        for (name, value) in usage_lines(&answer["usage"]) {
            println!("{name}  {value}");
        }
    }
    Ok(())
}

/// The usage fields `describe` answers, in a fixed order (those it lacks left out).
fn usage_lines(usage: &Value) -> Vec<(&'static str, String)> {
    [
        "connections",
        "subscriptions",
        "subjects",
        "stored_bytes",
        "msgs_per_sec",
        "bytes_per_sec",
        "published_msgs",
        "published_bytes",
        "refused_by_quota",
        "throttled_by_quota",
    ]
    .into_iter()
    .filter_map(|name| Some((name, usage.get(name)?.to_string())))
    .collect()
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{AnonymousArgs, line, usage_lines};

    #[test]
    fn anonymous_flags_deny_the_side_they_leave_out() {
        let none = AnonymousArgs::default();
        assert_eq!(none.json(false), None, "no flag keeps the current rules");
        assert_eq!(none.json(true), Some(json!(false)));
        let subscribe_only = AnonymousArgs {
            anonymous_publish: vec![],
            anonymous_subscribe: vec!["public.>".into()],
        };
        assert_eq!(
            subscribe_only.json(false),
            Some(json!({"publish": {"deny": [">"]},
                        "subscribe": {"allow": ["public.>"]}}))
        );
    }

    #[test]
    fn a_tenant_line_shows_anonymous_rules_and_describe_its_usage() {
        let tenant = json!({"name": "acme", "limits": {},
                            "anonymous": {"publish": {"deny": [">"]},
                                          "subscribe": {"allow": ["public.>"]}}});
        assert_eq!(
            line(&tenant),
            "acme  no limits  anonymous: publish deny >; subscribe allow public.>"
        );
        let usage = json!({"connections": 2, "subjects": 0, "msgs_per_sec": 1.5});
        assert_eq!(
            usage_lines(&usage),
            vec![
                ("connections", "2".to_owned()),
                ("subjects", "0".to_owned()),
                ("msgs_per_sec", "1.5".to_owned())
            ]
        );
    }
}
