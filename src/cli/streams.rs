//! `canopy pub --expect/--msg-id`, `get`, `replay` and `subjects`: key streams from
//! the terminal, through the `$CANOPY.` API.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use canopy::client::{Client, Received};
use canopy_protocols::native::HeaderMap;
use serde_json::{Value, json};

/// What a publish asks of the store.
pub struct AckedPublish<'a> {
    pub expect: Option<u64>,
    pub msg_id: Option<&'a str>,
    pub json: bool,
    /// `Canopy-Await`: groups that must ack the message before the publish is answered.
    pub await_groups: Option<&'a str>,
    pub await_timeout: Option<&'a str>,
}

/// Publishes one message and waits for the store's ack; prints it.
pub async fn publish_acked(
    client: &mut Client,
    subject: &str,
    data: &[u8],
    mut headers: HeaderMap,
    options: &AckedPublish<'_>,
    timeout: Duration,
) -> Result<()> {
    let json_output = options.json;
    if let Some(version) = options.expect {
        headers.insert("Canopy-Expected-Version", version.to_string());
    }
    if let Some(id) = options.msg_id {
        headers.insert("Canopy-Msg-Id", id);
    }
    headers.insert("Canopy-Ack", "durable");
    let mut timeout = timeout;
    if let Some(groups) = options.await_groups {
        let awaiting = canopy::groups::awaiting::Await::parse(groups, options.await_timeout)
            .map_err(anyhow::Error::msg)?;
        headers.insert("Canopy-Await", groups);
        headers.insert(
            "Canopy-Await-Timeout",
            format!("{}ms", awaiting.timeout.as_millis()),
        );
        // The server answers when the wait ends: give it that long, and a margin.
        timeout = timeout.max(awaiting.timeout + Duration::from_secs(2));
    }
    let answers = client
        .request(subject, Some(&headers), data, timeout, None)
        .await?;
    let ack = answers.first().context("no ack")?;
    let value: Value = serde_json::from_slice(&ack.payload).context("the ack is not JSON")?;
    if json_output {
        println!("{value}");
    }
    if let Some(error) = value.get("error") {
        bail!(
            "{}",
            error["description"].as_str().unwrap_or("the store refused")
        );
    }
    if !json_output {
        let duplicate = if value["duplicate"] == json!(true) {
            " (duplicate: stored before)"
        } else {
            ""
        };
        println!(
            "stored {} version {} at offset {}{duplicate}",
            value["subject"].as_str().unwrap_or(subject),
            value["version"],
            value["seq"]
        );
        if let Some(passed) = value["await"]["passed"]
            .as_array()
            .filter(|p| !p.is_empty())
        {
            let names: Vec<&str> = passed.iter().filter_map(Value::as_str).collect();
            println!("acked by {}", names.join(", "));
        }
    }
    let pending: Vec<String> = value["await"]["pending"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{} ({})",
                p["group"].as_str().unwrap_or("?"),
                p["reason"].as_str().unwrap_or("?")
            )
        })
        .collect();
    if !pending.is_empty() {
        bail!(
            "the message is stored, but not yet acked by {}",
            pending.join(", ")
        );
    }
    Ok(())
}

pub(super) fn header<'a>(message: &'a Received, name: &str) -> Option<&'a str> {
    message.headers.as_ref()?.get(name)
}

/// Fails with the API's error when the answer carries one.
pub(super) fn check(answer: &Received) -> Result<()> {
    if header(answer, "Canopy-Status").is_some() {
        let value: Value = serde_json::from_slice(&answer.payload).unwrap_or(Value::Null);
        bail!(
            "{}",
            value["error"]["description"]
                .as_str()
                .unwrap_or("the server refused the request")
        );
    }
    Ok(())
}

/// A stored message as one line: `subject #version payload`, or JSON.
pub(super) fn line(message: &Received, json_output: bool) -> String {
    let number = |name| header(message, name).and_then(|v| v.parse::<u64>().ok());
    let subject = header(message, "Canopy-Subject").unwrap_or(&message.subject);
    let snapshot = header(message, "Canopy-Snapshot") == Some("true");
    if json_output {
        let mut object = json!({
            "subject": subject,
            "version": number("Canopy-Version"),
            "offset": number("Canopy-Offset"),
            "time_ms": number("Canopy-Time"),
        });
        if snapshot {
            object["snapshot"] = true.into();
        }
        // The schema the server checked the message against, `<pattern>@<version>`.
        if let Some((pattern, version)) =
            header(message, "Canopy-Schema").and_then(|s| s.rsplit_once('@'))
        {
            object["schema"] = json!({"pattern": pattern, "version": version.parse::<u64>().ok()});
        }
        for (name, key) in [
            ("Canopy-Dead-Subject", "dead_subject"),
            ("Canopy-Dead-Reason", "dead_reason"),
        ] {
            if let Some(value) = header(message, name) {
                object[key] = value.into();
            }
        }
        if let Some(headers) = &message.headers {
            let own: serde_json::Map<String, Value> = headers
                .entries
                .iter()
                .filter(|(name, _)| !name.starts_with("Canopy-"))
                .map(|(name, value)| (name.clone(), Value::from(value.clone())))
                .collect();
            if !own.is_empty() {
                object["headers"] = Value::Object(own);
            }
        }
        match std::str::from_utf8(&message.payload) {
            Ok(text) => object["payload"] = text.into(),
            Err(_) => {
                use base64::Engine;
                object["payload_base64"] = base64::engine::general_purpose::STANDARD
                    .encode(&message.payload)
                    .into();
            }
        }
        object.to_string()
    } else {
        format!(
            "{} #{}{} {}",
            subject,
            number("Canopy-Version").unwrap_or(0),
            if snapshot { " (snapshot)" } else { "" },
            String::from_utf8_lossy(&message.payload)
        )
    }
}

pub(super) fn print(text: &str) -> bool {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}")
        .and_then(|_| stdout.flush())
        .is_ok()
}

/// Prints the one message an API answers for a subject and version: a stored
/// message (`$CANOPY.get`) or a snapshot (`$CANOPY.snapshot.get`).
pub async fn show_one(
    client: &mut Client,
    api: &str,
    subject: &str,
    version: Option<u64>,
    json_output: bool,
    timeout: Duration,
) -> Result<()> {
    let body = json!({"subject": subject, "version": version}).to_string();
    let answers = client
        .request(api, None, body.as_bytes(), timeout, None)
        .await?;
    let answer = answers.first().context("no answer")?;
    check(answer)?;
    print(&line(answer, json_output));
    Ok(())
}

/// Where a replay starts, as the user said it.
#[derive(Debug, Clone)]
pub enum StartAt {
    Start,
    Snapshot,
    Number(u64),
    Since(Duration),
}

impl std::str::FromStr for StartAt {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text == "start" {
            return Ok(StartAt::Start);
        }
        if text == "snapshot" {
            return Ok(StartAt::Snapshot);
        }
        if let Ok(n) = text.parse() {
            return Ok(StartAt::Number(n));
        }
        parse_ago(text).map(StartAt::Since).ok_or_else(|| {
            format!(
                "`{text}` is not `start`, `snapshot`, a version (offset for patterns) or an age like 30s, 5m, 2h, 1d"
            )
        })
    }
}

/// A span like 500ms, 30s, 5m, 2h or 1d.
pub(super) fn parse_ago(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    let seconds = match unit {
        "ms" => return Some(Duration::from_millis(n)),
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        "d" => n.checked_mul(86_400)?,
        _ => return None,
    };
    Some(Duration::from_secs(seconds))
}

fn is_pattern(target: &str) -> bool {
    target.split('.').any(|t| t == "*" || t == ">")
}

/// Prints a subject's or pattern's history page by page; with `follow`, keeps
/// waiting for new messages (pulled from the store, so nothing is missed between
/// pages and nothing is printed twice).
pub async fn replay(
    client: &mut Client,
    target: &str,
    from: StartAt,
    follow: bool,
    count: Option<u64>,
    json_output: bool,
    timeout: Duration,
) -> Result<()> {
    let key = if is_pattern(target) {
        "pattern"
    } else {
        "subject"
    };
    let mut cursor: Option<u64> = None;
    let mut printed = 0u64;
    let wait_ms = 5_000u64;
    loop {
        let mut body = json!({key: target, "max": 500});
        match (cursor, &from) {
            (Some(c), _) => body["cursor"] = c.into(),
            (None, StartAt::Start) => {}
            (None, StartAt::Snapshot) => body["from"] = "snapshot".into(),
            (None, StartAt::Number(n)) if key == "subject" => body["from"] = json!({"version": n}),
            (None, StartAt::Number(n)) => body["from"] = json!({"offset": n}),
            (None, StartAt::Since(age)) => {
                let now = canopy::clock::system_ms();
                let age = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
                body["from"] = json!({"time_ms": now.saturating_sub(age)});
            }
        }
        if follow {
            body["follow"] = true.into();
            body["wait_ms"] = wait_ms.into();
        }
        let done = |m: &Received| {
            header(m, "Canopy-Done").is_some() || header(m, "Canopy-Status").is_some()
        };
        let wait = timeout + Duration::from_millis(if follow { wait_ms } else { 0 });
        let answers = client
            .request(
                "$CANOPY.replay",
                None,
                body.to_string().as_bytes(),
                wait,
                Some(&done),
            )
            .await?;
        let Some(end) = answers.last() else {
            bail!("no answer");
        };
        check(end)?;
        for message in &answers[..answers.len() - 1] {
            if count.is_some_and(|n| printed >= n) || !print(&line(message, json_output)) {
                return Ok(());
            }
            printed += 1;
        }
        if count.is_some_and(|n| printed >= n) {
            return Ok(());
        }
        cursor = header(end, "Canopy-Cursor").and_then(|c| c.parse().ok());
        let caught_up = header(end, "Canopy-Caught-Up") == Some("true");
        if caught_up && !follow {
            return Ok(());
        }
    }
}

pub async fn subjects(
    client: &mut Client,
    pattern: &str,
    json_output: bool,
    timeout: Duration,
) -> Result<()> {
    let mut after: Option<String> = None;
    loop {
        let body = json!({"pattern": pattern, "after": after, "max": 500}).to_string();
        let answers = client
            .request("$CANOPY.subjects", None, body.as_bytes(), timeout, None)
            .await?;
        let answer = answers.first().context("no answer")?;
        check(answer)?;
        let page: Value = serde_json::from_slice(&answer.payload).context("not JSON")?;
        for entry in page["subjects"].as_array().into_iter().flatten() {
            let text = if json_output {
                entry.to_string()
            } else {
                format!(
                    "{} version {}",
                    entry["subject"].as_str().unwrap_or(""),
                    entry["version"]
                )
            };
            if !print(&text) {
                return Ok(());
            }
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return Ok(()),
        }
    }
}

/// Asks the API for one JSON answer and fails with its error, if any.
pub(crate) async fn call_json(
    client: &mut Client,
    subject: &str,
    body: &Value,
    timeout: Duration,
) -> Result<Value> {
    let answers = client
        .request(subject, None, body.to_string().as_bytes(), timeout, None)
        .await?;
    let answer = answers.first().context("no answer")?;
    check(answer)?;
    serde_json::from_slice(&answer.payload).context("the answer is not JSON")
}

pub async fn snapshot_put(
    client: &mut Client,
    subject: &str,
    version: u64,
    data: &str,
    timeout: Duration,
) -> Result<()> {
    let mut body = json!({"subject": subject, "version": version, "data": data});
    // JSON text is marked as such, so browsers and the console show it inline.
    if serde_json::from_str::<serde::de::IgnoredAny>(data).is_ok() {
        body["content_type"] = json!("application/json");
    }
    call_json(client, "$CANOPY.snapshot.put", &body, timeout).await?;
    println!("snapshot of {subject} at version {version} stored");
    Ok(())
}

/// Purges after asking, unless `yes`; refuses to guess when nobody can answer.
pub async fn purge(client: &mut Client, target: &str, yes: bool, timeout: Duration) -> Result<()> {
    if !yes {
        use std::io::{BufRead, IsTerminal};
        if !std::io::stdin().is_terminal() {
            bail!("purge deletes history for good: confirm with --yes when not at a terminal");
        }
        eprint!("Delete every stored message of '{target}'? This cannot be undone. [y/N] ");
        let mut reply = String::new();
        std::io::stdin().lock().read_line(&mut reply)?;
        if !matches!(reply.trim(), "y" | "Y" | "yes") {
            bail!("nothing purged");
        }
    }
    let key = if is_pattern(target) {
        "pattern"
    } else {
        "subject"
    };
    let purged = call_json(client, "$CANOPY.purge", &json!({key: target}), timeout).await?;
    println!(
        "purged {} messages of {} subjects",
        purged["messages"], purged["subjects"]
    );
    Ok(())
}
