//! `canopy plugin ...`: the `$CANOPY.plugin.*` API for people. Binds a WebAssembly
//! module (binary, or its text form) to a pattern of the tenant's subjects, shows and
//! lists the plugins with how they fare, and unbinds them. This module only builds
//! requests and prints answers: running plugins is the server's.

use anyhow::{Context, Result};
use clap::{Subcommand, ValueEnum};
use serde_json::{Value, json};

use super::connect::ConnectArgs;
use super::streams::call_json;

#[derive(Clone, Copy, ValueEnum)]
pub enum OnError {
    /// Refuse the message, with why, when the plugin fails.
    Reject,
    /// Pass the message on as it was when the plugin fails.
    Pass,
}

#[derive(Subcommand)]
pub enum PluginCommand {
    /// Bind the WebAssembly module in FILE (`.wasm`, or `.wat` text) to PATTERN
    /// (e.g. 'devices.>'), replacing the one bound there.
    ///
    /// On publish, every plugin whose pattern matches the subject runs, the most
    /// specific first, each on what the one before made: it passes the message,
    /// drops it, rejects it with a reason, or replaces it by up to 8 messages.
    Put {
        pattern: String,
        file: String,
        /// Run it on each publish (with --on-deliver too, on both; neither: every
        /// hook the module exports).
        #[arg(long)]
        on_publish: bool,
        /// Run it on each delivery, per reader: filter or change what one reader
        /// gets, without changing what is stored.
        #[arg(long)]
        on_deliver: bool,
        /// What a failure (a trap, the deadline, memory) does to the message.
        #[arg(long, value_enum, default_value = "reject")]
        on_error: OnError,
        /// How long one call may run, in milliseconds (default 10, at most 1000).
        #[arg(long, value_name = "MS")]
        deadline_ms: Option<u64>,
        /// The memory one instance may have, in MiB (default 16, at most 256).
        #[arg(long, value_name = "MIB")]
        memory_mib: Option<u32>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Show the plugin bound to PATTERN: its hooks, limits, calls and faults.
    Get {
        pattern: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// List the tenant's plugins.
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Unbind PATTERN's plugin.
    Delete {
        pattern: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

/// One line for a plugin.
fn line(plugin: &Value) -> String {
    let number = |key: &str| plugin[key].as_u64().unwrap_or(0);
    format!(
        "{}  version {}  on {}  on error {}  {} ms, {} MiB  {} calls, {} faults{}",
        plugin["pattern"].as_str().unwrap_or("?"),
        number("version"),
        plugin["hooks"]
            .as_array()
            .map(|hooks| {
                hooks
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default(),
        plugin["on_error"].as_str().unwrap_or("?"),
        number("deadline_ms"),
        number("memory_mib"),
        number("calls"),
        number("faults"),
        if plugin["disabled"] == json!(true) {
            "  DISABLED"
        } else {
            ""
        },
    )
}

async fn call(connect: &ConnectArgs, subject: &str, body: &Value) -> Result<Value> {
    let (mut client, timeout) = connect.connect("canopy plugin").await?;
    call_json(&mut client, subject, body, timeout).await
}

/// Runs a `canopy plugin` subcommand.
pub async fn run(command: PluginCommand) -> Result<()> {
    match command {
        PluginCommand::Put {
            pattern,
            file,
            on_publish,
            on_deliver,
            on_error,
            deadline_ms,
            memory_mib,
            json,
            connect,
        } => {
            use base64::Engine as _;
            let module = std::fs::read(&file).with_context(|| format!("reading {file}"))?;
            let mut body = json!({
                "pattern": pattern,
                "module": base64::engine::general_purpose::STANDARD.encode(module),
                "on_error": match on_error {
                    OnError::Reject => "reject",
                    OnError::Pass => "pass",
                },
            });
            let hooks: Vec<&str> = [(on_publish, "publish"), (on_deliver, "deliver")]
                .into_iter()
                .filter_map(|(on, hook)| on.then_some(hook))
                .collect();
            if !hooks.is_empty() {
                body["hooks"] = json!(hooks);
            }
            if let Some(ms) = deadline_ms {
                body["deadline_ms"] = json!(ms);
            }
            if let Some(mib) = memory_mib {
                body["memory_mib"] = json!(mib);
            }
            let answer = call(&connect, "$CANOPY.plugin.put", &body).await?;
            if json {
                println!("{answer}");
            } else {
                println!("{}", line(&answer));
            }
        }
        PluginCommand::Get { pattern, connect } => {
            let answer = call(&connect, "$CANOPY.plugin.get", &json!({"pattern": pattern})).await?;
            println!("{}", serde_json::to_string_pretty(&answer)?);
        }
        PluginCommand::List { json, connect } => {
            let answer = call(&connect, "$CANOPY.plugin.list", &json!({})).await?;
            for plugin in answer["plugins"].as_array().into_iter().flatten() {
                if json {
                    println!("{plugin}");
                } else {
                    println!("{}", line(plugin));
                }
            }
        }
        PluginCommand::Delete { pattern, connect } => {
            call(
                &connect,
                "$CANOPY.plugin.delete",
                &json!({"pattern": pattern}),
            )
            .await?;
            println!("{pattern}: plugin deleted");
        }
    }
    Ok(())
}
