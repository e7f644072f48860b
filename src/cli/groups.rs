//! `canopy group ...`: the `$CANOPY.group.*` API for people. Creates, lists, shows
//! and deletes the tenant's consumer groups; one line per group, or JSON with
//! `--json`. This module only builds requests and prints answers: what a group does
//! is the server's.

use std::io::BufRead;
use std::time::Duration;

use anyhow::{Result, bail};
use canopy::client::{Client, Received};
use clap::Subcommand;
use serde_json::{Value, json};

use super::connect::ConnectArgs;
use super::streams::{
    call_json, check, header, line as message_line, parse_ago, print as print_line,
};

#[derive(Subcommand)]
pub enum GroupCommand {
    /// Create group NAME consuming the subjects matching PATTERN (e.g. 'orders.>').
    ///
    /// Each subject goes to one member at a time, in version order; members join by
    /// consuming.
    Create {
        /// The group's name: 1 to 64 of A-Z, a-z, 0-9, '-' and '_'.
        name: String,
        /// The subjects it consumes, with NATS wildcards.
        pattern: String,
        /// How long a member has to ack a message before it goes again (500ms, 30s, 5m).
        #[arg(long, default_value = "30s", value_name = "SPAN")]
        ack_wait: String,
        /// Deliveries of one message before it goes to the dead-letter subject (0: no limit).
        #[arg(long, default_value_t = 5, value_name = "N")]
        max_deliveries: u32,
        /// Messages of one subject outstanding at once (1: strict order per subject).
        #[arg(long, default_value_t = 1, value_name = "N")]
        per_subject: u32,
        /// Messages outstanding at one member at once.
        #[arg(long, default_value_t = 1000, value_name = "N")]
        per_member: u32,
        /// Where to start: `new` (messages stored from now on), `all` (everything
        /// stored), or an age (30s, 5m, 2h, 1d: messages stored since then).
        #[arg(long, default_value = "new", value_name = "WHERE")]
        start: String,
        /// Dead-letter subjects are PREFIX.<subject> (default `$DLQ.<group>.<subject>`).
        #[arg(long, value_name = "PREFIX")]
        dead_letter: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// List the tenant's groups.
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Show group NAME: its definition, members, pending and redelivered counts, the
    /// laggiest subjects and the last dead letters.
    Info {
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Consume from group NAME as one member: print each message and ack it.
    ///
    /// Runs until --count messages were handled, or until interrupted.
    Consume {
        name: String,
        /// Stop after this many messages.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
        /// After each message, read what to do from standard input: `ack` (or an
        /// empty line), `nak` (again), `term` (give up on it) or `skip` (leave it to
        /// go again after the ack wait).
        #[arg(long)]
        manual_ack: bool,
        /// The member's name (default: one of this process's own).
        #[arg(long, value_name = "NAME")]
        member: Option<String>,
        /// Messages asked for per pull.
        #[arg(long, default_value_t = 100, value_name = "N")]
        batch: usize,
        /// One JSON object per message.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Delete group NAME and its cursors.
    Delete {
        name: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

/// The API's `start` for what the user typed.
fn start(text: &str) -> Result<Value> {
    Ok(match text {
        "new" => json!("new"),
        "all" => json!("all"),
        age => match parse_ago(age) {
            Some(age) => {
                let age = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
                json!({"time": canopy::clock::system_ms().saturating_sub(age)})
            }
            None => bail!("--start is `new`, `all` or an age like 30s, 5m, 2h, 1d, not `{age}`"),
        },
    })
}

/// One line for a group.
fn line(group: &Value) -> String {
    let text = |key: &str| group[key].as_str().unwrap_or("?").to_owned();
    let number = |key: &str| group[key].as_u64().unwrap_or(0);
    let mut line = format!(
        "{}  {}  ack wait {} ms, {} deliveries, {} in flight per subject, {} per member, \
         dead letters to {}",
        text("name"),
        text("pattern"),
        number("ack_wait_ms"),
        number("max_deliveries"),
        number("per_subject"),
        number("per_member"),
        text("dead_letter_subject"),
    );
    if let Some(subjects) = group["subjects"].as_u64() {
        line.push_str(&format!(", cursors in {subjects} subjects"));
    }
    let live = &group["live"];
    if live.is_object() {
        let n = |key: &str| live[key].as_u64().unwrap_or(0);
        line.push_str(&format!(
            "\n  {} members, {} pending, {} in flight, {} redelivered, {} dead-lettered",
            n("members"),
            n("pending"),
            n("in_flight"),
            n("redelivered"),
            n("dead_lettered"),
        ));
        for lag in live["laggiest"].as_array().into_iter().flatten() {
            line.push_str(&format!(
                "\n  {}  {} pending",
                lag["subject"].as_str().unwrap_or("?"),
                lag["pending"].as_u64().unwrap_or(0)
            ));
        }
        for dead in live["dead_letters"].as_array().into_iter().flatten() {
            line.push_str(&format!(
                "\n  parked {} version {}: {}",
                dead["subject"].as_str().unwrap_or("?"),
                dead["version"].as_u64().unwrap_or(0),
                dead["reason"].as_str().unwrap_or("?")
            ));
        }
    }
    line
}

fn print(value: &Value, json: bool) {
    if json {
        println!("{value}");
    } else {
        println!("{}", line(value));
    }
}

/// Runs a `canopy group` subcommand.
pub async fn run(command: GroupCommand) -> Result<()> {
    match command {
        GroupCommand::Create {
            name,
            pattern,
            ack_wait,
            max_deliveries,
            per_subject,
            per_member,
            start: from,
            dead_letter,
            json,
            connect,
        } => {
            let Some(wait) = parse_ago(&ack_wait) else {
                bail!("--ack-wait is a span like 500ms, 30s or 5m, not `{ack_wait}`");
            };
            let mut body = json!({
                "name": name,
                "pattern": pattern,
                "ack_wait_ms": u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "max_deliveries": max_deliveries,
                "per_subject": per_subject,
                "per_member": per_member,
                "start": start(&from)?,
            });
            if let Some(prefix) = dead_letter {
                body["dead_letter"] = json!(prefix);
            }
            let (mut client, timeout) = connect.connect("canopy group").await?;
            let answer = call_json(&mut client, "$CANOPY.group.create", &body, timeout).await?;
            print(&answer, json);
            Ok(())
        }
        GroupCommand::List { json, connect } => {
            let (mut client, timeout) = connect.connect("canopy group").await?;
            // The list comes a page at a time; an empty page ends it too.
            let mut offset = 0;
            loop {
                let request = json!({ "offset": offset });
                let answer =
                    call_json(&mut client, "$CANOPY.group.list", &request, timeout).await?;
                let page = answer["groups"].as_array().cloned().unwrap_or_default();
                for group in &page {
                    print(group, json);
                }
                offset += page.len();
                let total = answer["total"].as_u64().unwrap_or(0);
                if page.is_empty() || offset as u64 >= total {
                    return Ok(());
                }
            }
        }
        GroupCommand::Info {
            name,
            json,
            connect,
        } => {
            let (mut client, timeout) = connect.connect("canopy group").await?;
            let answer = call_json(
                &mut client,
                "$CANOPY.group.info",
                &json!({"name": name}),
                timeout,
            )
            .await?;
            print(&answer, json);
            Ok(())
        }
        GroupCommand::Consume {
            name,
            count,
            manual_ack,
            member,
            batch,
            json,
            connect,
        } => {
            let (mut client, timeout) = connect.connect("canopy group").await?;
            let member = member.unwrap_or_else(|| format!("canopy-{:016x}", fastrand::u64(..)));
            consume(
                &mut client,
                &name,
                &member,
                count,
                batch,
                manual_ack,
                json,
                timeout,
            )
            .await
        }
        GroupCommand::Delete { name, connect } => {
            let (mut client, timeout) = connect.connect("canopy group").await?;
            call_json(
                &mut client,
                "$CANOPY.group.delete",
                &json!({"name": name}),
                timeout,
            )
            .await?;
            eprintln!("deleted group {name}");
            Ok(())
        }
    }
}

/// How long one pull waits for a first message.
const PULL_WAIT: Duration = Duration::from_secs(5);

#[allow(clippy::too_many_arguments)]
async fn consume(
    client: &mut Client,
    group: &str,
    member: &str,
    count: Option<u64>,
    batch: usize,
    manual_ack: bool,
    json: bool,
    timeout: Duration,
) -> Result<()> {
    let mut handled = 0u64;
    let done =
        |m: &Received| header(m, "Canopy-Done").is_some() || header(m, "Canopy-Status").is_some();
    let mut stdin = std::io::stdin().lock();
    loop {
        let want = match count {
            Some(count) if handled >= count => return Ok(()),
            Some(count) => usize::try_from(count - handled).unwrap_or(batch).min(batch),
            None => batch,
        };
        let body = json!({
            "group": group,
            "member": member,
            "max": want.clamp(1, 1000),
            "wait_ms": u64::try_from(PULL_WAIT.as_millis()).unwrap_or(5_000),
        });
        let answers = client
            .request(
                "$CANOPY.group.next",
                None,
                body.to_string().as_bytes(),
                timeout + PULL_WAIT,
                Some(&done),
            )
            .await?;
        for message in answers {
            check(&message)?;
            if done(&message) {
                continue;
            }
            if !print_line(&message_line(&message, json)) {
                return Ok(());
            }
            let answer: &[u8] = if manual_ack {
                let mut what = String::new();
                if stdin.read_line(&mut what)? == 0 {
                    return Ok(());
                }
                match what.trim() {
                    "" | "ack" => b"+ACK",
                    "nak" => b"-NAK",
                    "term" => b"+TERM",
                    "skip" => b"",
                    other => bail!("`{other}` is not ack, nak, term or skip"),
                }
            } else {
                b"+ACK"
            };
            if let Some(reply) = &message.reply
                && !answer.is_empty()
            {
                let confirmed = client.request(reply, None, answer, timeout, None).await?;
                if let Some(confirmed) = confirmed.first() {
                    check(confirmed)?;
                }
            }
            handled += 1;
        }
    }
}
