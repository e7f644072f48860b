//! `canopy schema ...`: the `$CANOPY.schema.*` API for people. Binds JSON Schemas to
//! patterns of the tenant's subjects, shows and lists them, their history and the
//! messages they refused lately, and unbinds them. This module only builds requests
//! and prints answers: checking messages is the server's.

use std::io::Read;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};

use super::connect::ConnectArgs;
use super::streams::call_json;

#[derive(Clone, Copy, ValueEnum)]
pub enum Mode {
    None,
    Backward,
    BackwardTransitive,
    Forward,
    ForwardTransitive,
    Full,
    FullTransitive,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Backward => "backward",
            Mode::BackwardTransitive => "backward_transitive",
            Mode::Forward => "forward",
            Mode::ForwardTransitive => "forward_transitive",
            Mode::Full => "full",
            Mode::FullTransitive => "full_transitive",
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum OnInvalid {
    /// Refuse the message in the publisher's protocol.
    Reject,
    /// Store it under the dead-letter subject instead, and acknowledge it.
    DeadLetter,
}

#[derive(Subcommand)]
pub enum SchemaCommand {
    /// Bind the JSON Schema in FILE (`-`: standard input) to PATTERN (e.g.
    /// 'devices.*.temp'), as its next version.
    ///
    /// Every publish to a subject the pattern matches is checked against it, on every
    /// front end; when several bound patterns match a subject, the most specific wins.
    /// A new version must keep the binding's compatibility mode.
    Put {
        pattern: String,
        file: String,
        /// What each new version must keep (default: the binding's, else backward).
        #[arg(long, value_enum)]
        mode: Option<Mode>,
        /// What happens to a message the schema refuses (default: the binding's, else reject).
        #[arg(long, value_enum)]
        on_invalid: Option<OnInvalid>,
        /// Dead letters go to PREFIX.<subject> (default `$DLQ.schema.<subject>`).
        #[arg(long, value_name = "PREFIX")]
        dead_letter: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Print the schema bound to PATTERN (or the one SUBJECT falls under, with --subject).
    Get {
        /// The bound pattern; or a subject, with --subject.
        pattern: String,
        /// PATTERN is a subject: show the binding that covers it.
        #[arg(long)]
        subject: bool,
        /// An earlier version.
        #[arg(long, value_name = "N")]
        version: Option<u64>,
        /// Print the whole answer as JSON (the schema with its binding).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// List the tenant's bindings.
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Every version of PATTERN's binding, deletions included.
    History {
        pattern: String,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// The messages schemas refused lately (the tenant's last 100).
    Errors {
        /// Only this subject's.
        #[arg(long, value_name = "SUBJECT", conflicts_with = "pattern")]
        subject: Option<String>,
        /// Only those of subjects matching PATTERN.
        #[arg(long, value_name = "PATTERN")]
        pattern: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Unbind PATTERN: its subjects are no longer checked (its history stays).
    Delete {
        pattern: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

/// One line for a binding's version.
fn line(binding: &Value) -> String {
    let text = |key: &str| binding[key].as_str().unwrap_or("?").to_owned();
    let mut line = format!(
        "{}  version {}  {}",
        text("pattern"),
        binding["version"].as_u64().unwrap_or(0),
        if binding["deleted"] == json!(true) {
            "deleted".to_owned()
        } else {
            format!(
                "mode {}, invalid messages: {}",
                text("mode"),
                match binding["on_invalid"].as_str() {
                    Some("dead_letter") => format!("to {}.<subject>", text("dead_letter")),
                    _ => "refused".to_owned(),
                }
            )
        },
    );
    if binding["unchanged"] == json!(true) {
        line.push_str("  (unchanged)");
    }
    line
}

fn read_schema(file: &str) -> Result<Value> {
    let mut text = String::new();
    if file == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the schema from standard input")?;
    } else {
        text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
    }
    serde_json::from_str(&text).with_context(|| format!("{file} is not JSON"))
}

/// The body of a `schema.put` request, with the schema read from `file`.
fn put_request(
    pattern: String,
    file: &str,
    mode: Option<Mode>,
    on_invalid: Option<OnInvalid>,
    dead_letter: Option<String>,
) -> Result<Value> {
    let mut body = json!({"pattern": pattern, "schema": read_schema(file)?});
    if let Some(mode) = mode {
        body["mode"] = json!(mode.name());
    }
    if let Some(on_invalid) = on_invalid {
        body["on_invalid"] = json!(match on_invalid {
            OnInvalid::Reject => "reject",
            OnInvalid::DeadLetter => "dead_letter",
        });
    }
    if let Some(prefix) = dead_letter {
        body["dead_letter"] = json!(prefix);
    }
    Ok(body)
}

/// Connects and calls one `$CANOPY.schema.*` subject.
async fn call(connect: &ConnectArgs, subject: &str, body: &Value) -> Result<Value> {
    let (mut client, timeout) = connect.connect("canopy schema").await?;
    call_json(&mut client, subject, body, timeout).await
}

/// Prints each item of a listing, as JSON or as `text` makes it.
fn print_each(items: &Value, json: bool, text: fn(&Value) -> String) {
    for item in items.as_array().into_iter().flatten() {
        if json {
            println!("{item}");
        } else {
            println!("{}", text(item));
        }
    }
}

/// One line for a message a schema refused.
fn error_line(error: &Value) -> String {
    let text = |key: &str| error[key].as_str().unwrap_or("?").to_owned();
    format!(
        "{}  {}  at {}: {}{}",
        text("subject"),
        text("schema"),
        match text("path") {
            path if path.is_empty() => "/".to_owned(),
            path => path,
        },
        text("message"),
        if error["dead_lettered"] == json!(true) {
            "  (dead-lettered)"
        } else {
            ""
        }
    )
}

/// Runs a `canopy schema` subcommand.
pub async fn run(command: SchemaCommand) -> Result<()> {
    match command {
        SchemaCommand::Put {
            pattern,
            file,
            mode,
            on_invalid,
            dead_letter,
            json,
            connect,
        } => {
            let body = put_request(pattern, &file, mode, on_invalid, dead_letter)?;
            let answer = call(&connect, "$CANOPY.schema.put", &body).await?;
            if json {
                println!("{answer}");
            } else {
                println!("{}", line(&answer));
            }
        }
        SchemaCommand::Get {
            pattern,
            subject,
            version,
            json,
            connect,
        } => {
            let mut body = if subject {
                json!({"subject": pattern})
            } else {
                json!({"pattern": pattern})
            };
            if let Some(version) = version {
                body["version"] = json!(version);
            }
            let answer = call(&connect, "$CANOPY.schema.get", &body).await?;
            if json {
                println!("{answer}");
            } else {
                eprintln!("{}", line(&answer));
                match answer.get("schema") {
                    Some(schema) => println!("{}", serde_json::to_string_pretty(schema)?),
                    None => bail!("version {} is a deletion", answer["version"]),
                }
            }
        }
        SchemaCommand::List { json, connect } => {
            let answer = call(&connect, "$CANOPY.schema.list", &json!({})).await?;
            print_each(&answer["schemas"], json, line);
        }
        SchemaCommand::History {
            pattern,
            json,
            connect,
        } => {
            let body = json!({"pattern": pattern});
            let answer = call(&connect, "$CANOPY.schema.history", &body).await?;
            print_each(&answer["versions"], json, line);
        }
        SchemaCommand::Errors {
            subject,
            pattern,
            json,
            connect,
        } => {
            let mut body = json!({});
            if let Some(subject) = subject {
                body["subject"] = json!(subject);
            }
            if let Some(pattern) = pattern {
                body["pattern"] = json!(pattern);
            }
            let answer = call(&connect, "$CANOPY.schema.errors", &body).await?;
            print_each(&answer["errors"], json, error_line);
        }
        SchemaCommand::Delete { pattern, connect } => {
            let body = json!({"pattern": pattern});
            let answer = call(&connect, "$CANOPY.schema.delete", &body).await?;
            println!(
                "{pattern} unbound (version {})",
                answer["version"].as_u64().unwrap_or(0)
            );
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct AsyncApiArgs {
    /// Another tenant's document (for the default tenant's users).
    #[arg(long)]
    tenant: Option<String>,
    /// One line of JSON instead of indented JSON.
    #[arg(long)]
    compact: bool,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// Runs `canopy asyncapi`.
pub async fn asyncapi(args: AsyncApiArgs) -> Result<()> {
    let mut body = json!({});
    if let Some(tenant) = args.tenant {
        body["tenant"] = json!(tenant);
    }
    let (mut client, timeout) = args.connect.connect("canopy asyncapi").await?;
    let document = call_json(&mut client, "$CANOPY.asyncapi", &body, timeout).await?;
    if args.compact {
        println!("{document}");
    } else {
        println!("{}", serde_json::to_string_pretty(&document)?);
    }
    Ok(())
}
