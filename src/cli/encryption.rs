//! `canopy encryption ...`: the `$CANOPY.encryption.*` API for people. Seals a
//! pattern's subjects at rest (or rotates its data key), stops sealing, shreds a
//! pattern's keys and lists them. This module only builds requests and prints
//! answers: sealing is the store's.

use anyhow::Result;
use clap::Subcommand;
use serde_json::{Value, json};

use super::connect::ConnectArgs;
use super::streams::call_json;

#[derive(Subcommand)]
pub enum EncryptionCommand {
    /// Keep PATTERN's messages encrypted at rest from now on, under a new data key
    /// (the pattern's key before, if any, goes on opening what it sealed: a data
    /// key rotation). The server needs key-encryption keys (store.keys).
    Seal {
        pattern: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Store PATTERN's new messages in clear again; what its keys sealed still reads.
    Stop {
        pattern: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Delete every data key of PATTERN: what they sealed is unreadable for good.
    Shred {
        pattern: String,
        /// Needed: shredding cannot be undone.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// List the tenant's data keys (never their bytes).
    List {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

/// One line for a data key.
fn line(key: &Value) -> String {
    format!(
        "{}  key {}  {}  wrapped by {}",
        key["pattern"].as_str().unwrap_or("?"),
        key["id"].as_u64().unwrap_or(0),
        if key["sealing"] == json!(true) {
            "sealing"
        } else {
            "opening only"
        },
        key["kek"].as_str().unwrap_or("?"),
    )
}

async fn call(connect: &ConnectArgs, op: &str, body: &Value) -> Result<Value> {
    let (mut client, timeout) = connect.connect("canopy encryption").await?;
    call_json(
        &mut client,
        &format!("$CANOPY.encryption.{op}"),
        body,
        timeout,
    )
    .await
}

/// Runs a `canopy encryption` subcommand.
pub async fn run(command: EncryptionCommand) -> Result<()> {
    match command {
        EncryptionCommand::Seal { pattern, connect } => {
            let answer = call(&connect, "seal", &json!({"pattern": pattern})).await?;
            println!("{}", line(&answer["key"]));
            for id in answer["rotated"].as_array().into_iter().flatten() {
                println!("  key {id} now only opens what it sealed");
            }
        }
        EncryptionCommand::Stop { pattern, connect } => {
            call(&connect, "stop", &json!({"pattern": pattern})).await?;
            println!("{pattern}: new messages are stored in clear; sealed ones still read");
        }
        EncryptionCommand::Shred {
            pattern,
            yes,
            connect,
        } => {
            anyhow::ensure!(
                yes,
                "shredding {pattern}'s data keys makes its sealed messages unreadable for \
                 good: say --yes"
            );
            let answer = call(&connect, "shred", &json!({"pattern": pattern})).await?;
            let ids: Vec<String> = answer["shredded"]
                .as_array()
                .into_iter()
                .flatten()
                .map(Value::to_string)
                .collect();
            println!(
                "{pattern}: data keys {} shredded; what they sealed is unreadable",
                ids.join(", ")
            );
        }
        EncryptionCommand::List { json, connect } => {
            let answer = call(&connect, "list", &json!({})).await?;
            for key in answer["keys"].as_array().into_iter().flatten() {
                if json {
                    println!("{key}");
                } else {
                    println!("{}", line(key));
                }
            }
        }
    }
    Ok(())
}
