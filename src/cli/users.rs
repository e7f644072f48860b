//! `canopy user ...`: the `$CANOPY.user.*` API for people. Creates, lists and deletes
//! a tenant's users, and issues and revokes their tokens. Prints one line per user,
//! or JSON with `--json`; a token is printed once, alone on standard output, so a
//! script can capture it. This module must never print a password.

use std::io::BufRead;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use canopy::client::Client;
use clap::Subcommand;
use serde_json::{Value, json};

use super::connect::ConnectArgs;
use super::streams::call_json;

#[derive(Subcommand)]
pub enum UserCommand {
    /// Create user NAME in TENANT, with a password and/or rules (tokens: `user token`).
    ///
    /// The password given here is the new user's; log in yourself with --user and
    /// --password (or CANOPY_USER and CANOPY_PASSWORD).
    Create {
        /// The user's tenant.
        tenant: String,
        /// The user's name: 1 to 64 of A-Z, a-z, 0-9, '-' and '_'.
        name: String,
        /// The new user's password (visible to other local users in the process
        /// list: prefer --password-stdin). Without one, the user logs in with tokens
        /// or a client certificate only.
        #[arg(long, value_name = "PASSWORD", conflicts_with = "password_stdin")]
        new_password: Option<String>,
        /// Read the new user's password from the first line of standard input.
        #[arg(long, visible_alias = "new-password-stdin")]
        password_stdin: bool,
        #[command(flatten)]
        rules: RuleArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// List TENANT's users: password or not, token ids, rules.
    List {
        /// The tenant.
        tenant: String,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Delete user NAME of TENANT (its tokens stop working).
    Delete {
        /// The user's tenant.
        tenant: String,
        /// The user's name: 1 to 64 of A-Z, a-z, 0-9, '-' and '_'.
        name: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Issue a token for user NAME of TENANT and print it, alone on standard output.
    ///
    /// The token is shown this once (the server keeps only its hash); its id, for
    /// `user revoke`, goes to standard error.
    Token {
        /// The user's tenant.
        tenant: String,
        /// The user's name: 1 to 64 of A-Z, a-z, 0-9, '-' and '_'.
        name: String,
        /// Print the answer as JSON (token, id) instead.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Revoke one of a user's tokens by its id (see `user list`).
    Revoke {
        /// The user's tenant.
        tenant: String,
        /// The user's name: 1 to 64 of A-Z, a-z, 0-9, '-' and '_'.
        name: String,
        /// The token's id (from `user list`, or `user token`'s message).
        token_id: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

/// A user's rules. Patterns may hold `{user}`, replaced by the user's name when
/// they are checked. A side with no allow rules allows everything its deny rules do
/// not deny.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct RuleArgs {
    /// May publish to subjects matching PAT (repeatable).
    #[arg(long, value_name = "PAT")]
    pub allow_publish: Vec<String>,
    /// May not publish to subjects matching PAT (repeatable; wins over allow).
    #[arg(long, value_name = "PAT")]
    pub deny_publish: Vec<String>,
    /// May subscribe to PAT (repeatable). Requests (`get`, `replay`, `pub --ack`)
    /// need no rule: a connection's own reply inbox is always its to read, and
    /// `_INBOX.>` never shows anyone else's replies.
    #[arg(long, value_name = "PAT")]
    pub allow_subscribe: Vec<String>,
    /// May not subscribe to PAT (repeatable; wins over allow).
    #[arg(long, value_name = "PAT")]
    pub deny_subscribe: Vec<String>,
}

impl RuleArgs {
    /// The API's `permissions`: `{"publish": {"allow", "deny"}, "subscribe": {...}}`.
    fn json(&self) -> Value {
        let side = |allow: &[String], deny: &[String]| {
            let mut rules = serde_json::Map::new();
            if !allow.is_empty() {
                rules.insert("allow".into(), json!(allow));
            }
            if !deny.is_empty() {
                rules.insert("deny".into(), json!(deny));
            }
            Value::Object(rules)
        };
        json!({
            "publish": side(&self.allow_publish, &self.deny_publish),
            "subscribe": side(&self.allow_subscribe, &self.deny_subscribe),
        })
    }
}

/// Rules as text: `publish allow a, b deny c; subscribe anything`.
pub(super) fn rules_text(permissions: &Value) -> String {
    let patterns = |rules: &Value, kind: &str| -> Vec<String> {
        rules[kind]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_owned))
            .collect()
    };
    ["publish", "subscribe"]
        .iter()
        .map(|side| {
            let (allow, deny) = (
                patterns(&permissions[side], "allow"),
                patterns(&permissions[side], "deny"),
            );
            let mut text = (*side).to_owned();
            if allow.is_empty() && deny.is_empty() {
                text.push_str(" anything");
            }
            if !allow.is_empty() {
                text.push_str(&format!(" allow {}", allow.join(", ")));
            }
            if !deny.is_empty() {
                text.push_str(&format!(" deny {}", deny.join(", ")));
            }
            text
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// One line for a user: name, how it logs in, its rules.
fn line(user: &Value) -> String {
    let name = user["name"].as_str().unwrap_or("?");
    let mut logins = Vec::new();
    if user["password"] == json!(true) {
        logins.push("password".to_owned());
    }
    let tokens: Vec<&str> = user["tokens"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !tokens.is_empty() {
        logins.push(format!("tokens {}", tokens.join(" ")));
    }
    if logins.is_empty() {
        logins.push("certificate only".to_owned());
    }
    format!(
        "{name}  {}  {}",
        logins.join(", "),
        rules_text(&user["permissions"])
    )
}

fn print(value: &Value, json: bool) {
    if json {
        println!("{value}");
    } else {
        println!("{}", line(value));
    }
}

/// Runs a `canopy user` subcommand.
pub async fn run(command: UserCommand) -> Result<()> {
    match command {
        UserCommand::Create {
            tenant,
            name,
            new_password,
            password_stdin,
            rules,
            json,
            connect,
        } => {
            let password = match (new_password, password_stdin) {
                (_, true) => Some(read_password()?),
                (Some(password), false) if password.is_empty() => {
                    bail!("an empty password is not a password: leave --new-password out instead")
                }
                (password, false) => password,
            };
            let (mut client, timeout) = connect.connect("canopy user").await?;
            create(
                &mut client,
                &tenant,
                &name,
                password.as_deref(),
                &rules,
                json,
                timeout,
            )
            .await
        }
        UserCommand::List {
            tenant,
            json,
            connect,
        } => {
            let (mut client, timeout) = connect.connect("canopy user").await?;
            let answer = call_json(
                &mut client,
                "$CANOPY.user.list",
                &json!({ "tenant": tenant }),
                timeout,
            )
            .await?;
            for user in answer["users"].as_array().into_iter().flatten() {
                print(user, json);
            }
            Ok(())
        }
        UserCommand::Delete {
            tenant,
            name,
            connect,
        } => {
            let (mut client, timeout) = connect.connect("canopy user").await?;
            call_json(
                &mut client,
                "$CANOPY.user.delete",
                &json!({ "tenant": tenant, "name": name }),
                timeout,
            )
            .await?;
            println!("user {name} of {tenant} deleted");
            Ok(())
        }
        UserCommand::Token {
            tenant,
            name,
            json,
            connect,
        } => {
            let (mut client, timeout) = connect.connect("canopy user").await?;
            token(&mut client, &tenant, &name, json, timeout).await
        }
        UserCommand::Revoke {
            tenant,
            name,
            token_id,
            connect,
        } => {
            let (mut client, timeout) = connect.connect("canopy user").await?;
            call_json(
                &mut client,
                "$CANOPY.user.token.revoke",
                &json!({ "tenant": tenant, "name": name, "id": token_id }),
                timeout,
            )
            .await?;
            println!("token {token_id} of {name} ({tenant}) revoked");
            Ok(())
        }
    }
}

/// The first line of standard input, without its line end.
fn read_password() -> Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("cannot read the password from standard input")?;
    let password = line.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        bail!("--password-stdin read an empty line: an empty password is not a password");
    }
    Ok(password.to_owned())
}

async fn create(
    client: &mut Client,
    tenant: &str,
    name: &str,
    password: Option<&str>,
    rules: &RuleArgs,
    json: bool,
    timeout: Duration,
) -> Result<()> {
    let mut body = json!({"tenant": tenant, "name": name, "permissions": rules.json()});
    if let Some(password) = password {
        body["password"] = password.into();
    }
    let user = call_json(client, "$CANOPY.user.create", &body, timeout).await?;
    print(&user, json);
    Ok(())
}

async fn token(
    client: &mut Client,
    tenant: &str,
    name: &str,
    json: bool,
    timeout: Duration,
) -> Result<()> {
    let answer = call_json(
        client,
        "$CANOPY.user.token.create",
        &json!({ "tenant": tenant, "name": name }),
        timeout,
    )
    .await?;
    if json {
        println!("{answer}");
        return Ok(());
    }
    let token = answer["token"]
        .as_str()
        .context("the server's answer has no token")?;
    println!("{token}");
    eprintln!(
        "canopy: token {} for {name} of {tenant}; it is shown only this once",
        answer["id"].as_str().unwrap_or("?")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{RuleArgs, rules_text};

    #[test]
    fn rules_become_the_api_permissions_and_read_back_as_text() {
        let rules = RuleArgs {
            allow_publish: vec!["devices.{user}.>".into()],
            deny_publish: vec![],
            allow_subscribe: vec!["devices.>".into(), "_INBOX.>".into()],
            deny_subscribe: vec!["devices.secret.>".into()],
        };
        let permissions = rules.json();
        assert_eq!(
            permissions,
            json!({"publish": {"allow": ["devices.{user}.>"]},
                   "subscribe": {"allow": ["devices.>", "_INBOX.>"],
                                 "deny": ["devices.secret.>"]}})
        );
        assert_eq!(
            rules_text(&permissions),
            "publish allow devices.{user}.>; \
             subscribe allow devices.>, _INBOX.> deny devices.secret.>"
        );
        assert_eq!(
            rules_text(&RuleArgs::default().json()),
            "publish anything; subscribe anything"
        );
    }
}
