//! `canopy pub` and `canopy sub`: publishing messages (one, or one per line of standard
//! input) and printing what a subscription receives.
//!
//! Must never: store or read stored history (that is the `$CANOPY.` API's, in
//! `streams`), or print anything but the messages on standard output.

use std::io::{BufRead, Write};

use anyhow::{Context, Result, bail};
use canopy::client::Received;
use canopy_protocols::native::HeaderMap;

use crate::{PubArgs, SubArgs, cli, connect};

pub(crate) fn parse_headers(raw: &[String]) -> Result<Option<HeaderMap>> {
    if raw.is_empty() {
        return Ok(None);
    }
    let mut headers = HeaderMap::default();
    for header in raw {
        let Some((name, value)) = header.split_once(':') else {
            bail!("header `{header}` must look like `Name: value`");
        };
        let name = name.trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            bail!("header name in `{header}` must be one word");
        }
        headers.append(name, value.trim());
    }
    Ok(Some(headers))
}

pub(crate) async fn publish(args: PubArgs) -> Result<()> {
    let headers = parse_headers(&args.headers)?;
    let (mut client, timeout) = connect(&args.connect, "canopy pub").await?;
    if args.ack || args.expect.is_some() || args.msg_id.is_some() || args.await_groups.is_some() {
        let Some(data) = &args.data else {
            bail!("--ack, --expect, --msg-id and --await publish one message: give DATA");
        };
        let options = cli::streams::AckedPublish {
            expect: args.expect,
            msg_id: args.msg_id.as_deref(),
            json: args.json,
            await_groups: args.await_groups.as_deref(),
            await_timeout: args.await_timeout.as_deref(),
        };
        return cli::streams::publish_acked(
            &mut client,
            &args.subject,
            data.as_bytes(),
            headers.unwrap_or_default(),
            &options,
            timeout,
        )
        .await;
    }
    match &args.data {
        Some(data) => {
            client
                .publish(&args.subject, headers.as_ref(), data.as_bytes())
                .await?;
        }
        None => {
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                let line = line.context("cannot read standard input")?;
                client
                    .publish(&args.subject, headers.as_ref(), line.as_bytes())
                    .await?;
            }
        }
    }
    client.flush(timeout).await?;
    Ok(())
}

pub(crate) async fn subscribe(args: SubArgs) -> Result<()> {
    let (mut client, timeout) = connect(&args.connect, "canopy sub").await?;
    if let Some(from) = args.from {
        return cli::streams::replay(
            &mut client,
            &args.pattern,
            from,
            true,
            args.count,
            args.json,
            timeout,
        )
        .await;
    }
    client
        .subscribe(&args.pattern, args.queue.as_deref())
        .await?;
    client.flush(timeout).await?;
    // On stderr, so scripts reading stdout see only messages; tests wait for it.
    eprintln!(
        "canopy: subscribed to '{}' on {}",
        args.pattern, args.connect.address.server
    );
    let mut stdout = std::io::stdout().lock();
    let mut seen = 0u64;
    while args.count.is_none_or(|n| seen < n) {
        let message = client.next_message().await?;
        seen += 1;
        let line = if args.json {
            json_line(&message)
        } else {
            format!(
                "{} {}",
                message.subject,
                String::from_utf8_lossy(&message.payload)
            )
        };
        // A closed pipe (`| head`) ends the command quietly.
        if writeln!(stdout, "{line}")
            .and_then(|_| stdout.flush())
            .is_err()
        {
            break;
        }
    }
    Ok(())
}

pub(crate) fn json_line(message: &Received) -> String {
    let mut object = serde_json::Map::new();
    object.insert("subject".into(), message.subject.clone().into());
    if let Some(reply) = &message.reply {
        object.insert("reply".into(), reply.clone().into());
    }
    if let Some(headers) = &message.headers {
        let mut map = serde_json::Map::new();
        for (name, value) in &headers.entries {
            let entry = map
                .entry(name.clone())
                .or_insert_with(|| serde_json::Value::Array(Vec::new()));
            if let serde_json::Value::Array(values) = entry {
                values.push(value.clone().into());
            }
        }
        object.insert("headers".into(), map.into());
    }
    match std::str::from_utf8(&message.payload) {
        Ok(text) => object.insert("payload".into(), text.into()),
        Err(_) => object.insert(
            "payload_hex".into(),
            message
                .payload
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
                .into(),
        ),
    };
    serde_json::Value::Object(object).to_string()
}
