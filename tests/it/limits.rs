//! One limits table (SPEC.md, issue 13, "One limit, end to end"): messages at, one
//! byte under and one byte over `max_payload` (headers + payload), with and without
//! headers, far over it, and subjects at and over `limits.max_subject_len` and
//! `limits.max_subject_tokens`, each published through every front end (native,
//! MQTT 5, MQTT 3.1.1, `/ws`). A message the table says is taken must then read back
//! byte-exact on every read path: native `$CANOPY.get` and `$CANOPY.replay`, a live
//! native subscriber, a live MQTT 3.1.1 subscriber, `/ws` `get` and `sub` with
//! `from_version`, and the `canopy get` / `canopy replay` commands. A refused one must
//! be refused the protocol's way, stored nowhere and delivered to no one. No native
//! delivery may be larger than the `max_payload` INFO announced, and no MQTT 3.1.1
//! delivery larger than the server's Maximum Packet Size.
//!
//! Every cell is collected; the test fails once, at the end, listing every cell that
//! differs from SPEC.md.

use std::collections::HashMap;
use std::sync::Arc;

use canopy_protocols::mqtt::{Level, Packet};
use futures::future::join_all;
use serde_json::{Value, json};

use crate::common::{WAIT, start, test_config};
use crate::frontends::{
    Addrs, Answer, FrontEnd, Message, Mqtt, MqttEvent, Native, NativeEvent, NatsMsg, Publisher,
    Want, Ws, WsEvent, bytes_diff, payload, unb64,
};

/// Small, so the table is fast; every front end must apply the same value.
const MAX_PAYLOAD: usize = 4096;
/// MQTT's Maximum Packet Size: room for a message at `MAX_PAYLOAD` and its topic.
const MAX_PACKET: usize = MAX_PAYLOAD + 1024;
const MAX_SUBJECT_LEN: usize = 64;
const MAX_TOKENS: usize = 8;
/// The `/ws` frame limit today (src/server/mod.rs: `max_payload * 2 + 64 KiB`).
const WS_FRAME_LIMIT: usize = MAX_PAYLOAD * 2 + 64 * 1024;
/// The header every "with headers" row carries, and the size of its block.
const PAD: &str = "X-Pad";
const PAD_VALUE_LEN: usize = 79;
const HEADER_BLOCK: usize = "NATS/1.0\r\n".len() + "X-Pad: ".len() + PAD_VALUE_LEN + 4;

/// The subject a row publishes to, sized to the limits it tests.
#[derive(Clone, Copy)]
enum Shape {
    Short,
    /// Exactly this many bytes.
    Len(usize),
    /// Exactly this many tokens.
    Depth(usize),
}

struct Row {
    key: &'static str,
    name: &'static str,
    headers: bool,
    payload: usize,
    shape: Shape,
    want: [Want; 4],
}

fn taken() -> [Want; 4] {
    [Want::Taken, Want::Taken, Want::Taken, Want::Taken]
}

fn taken_with_headers() -> [Want; 4] {
    [
        Want::Taken,
        Want::Taken,
        Want::Skip("MQTT 3.1.1 has no headers"),
        Want::Taken,
    ]
}

fn rows() -> Vec<Row> {
    let too_large = |mqtt3: Want| {
        [
            Want::err_closes("Maximum Payload Violation"),
            Want::PubAck {
                code: 0x83,
                why: true,
                property: None,
            },
            mqtt3,
            Want::WsError("too_large"),
        ]
    };
    let invalid = || {
        [
            Want::err("Invalid Publish Subject"),
            Want::puback(0x90),
            Want::Closed,
            Want::WsError("invalid_subject"),
        ]
    };
    let row = |key, name, headers, payload, shape, want| Row {
        key,
        name,
        headers,
        payload,
        shape,
        want,
    };
    let with_headers = MAX_PAYLOAD - HEADER_BLOCK;
    vec![
        row(
            "r01",
            "payload at max_payload",
            false,
            MAX_PAYLOAD,
            Shape::Short,
            taken(),
        ),
        row(
            "r02",
            "payload one byte under max_payload",
            false,
            MAX_PAYLOAD - 1,
            Shape::Short,
            taken(),
        ),
        row(
            "r03",
            "payload one byte over max_payload",
            false,
            MAX_PAYLOAD + 1,
            Shape::Short,
            too_large(Want::Closed),
        ),
        row(
            "r04",
            "headers + payload at max_payload",
            true,
            with_headers,
            Shape::Short,
            taken_with_headers(),
        ),
        row(
            "r05",
            "headers + payload one byte under",
            true,
            with_headers - 1,
            Shape::Short,
            taken_with_headers(),
        ),
        row(
            "r06",
            "headers + payload one byte over",
            true,
            with_headers + 1,
            Shape::Short,
            too_large(Want::Skip("MQTT 3.1.1 has no headers")),
        ),
        row(
            "r07",
            "payload near 2 x max_payload (under the /ws frame limit)",
            false,
            2 * MAX_PAYLOAD - 2048,
            Shape::Short,
            [
                Want::err_closes("Maximum Payload Violation"),
                Want::Disconnect(0x95),
                Want::Closed,
                Want::WsError("too_large"),
            ],
        ),
        row(
            "r08",
            "payload over the /ws frame limit",
            false,
            WS_FRAME_LIMIT,
            Shape::Short,
            [
                Want::err_closes("Maximum Payload Violation"),
                Want::Disconnect(0x95),
                Want::Closed,
                Want::WsTooLarge,
            ],
        ),
        row(
            "r13",
            "payload at max_payload to a subject at max_subject_len",
            false,
            MAX_PAYLOAD,
            Shape::Len(MAX_SUBJECT_LEN),
            taken(),
        ),
        row(
            "r09",
            "subject at max_subject_len",
            false,
            16,
            Shape::Len(MAX_SUBJECT_LEN),
            taken(),
        ),
        row(
            "r10",
            "subject one byte over max_subject_len",
            false,
            16,
            Shape::Len(MAX_SUBJECT_LEN + 1),
            invalid(),
        ),
        row(
            "r11",
            "subject at max_subject_tokens",
            false,
            16,
            Shape::Depth(MAX_TOKENS),
            taken(),
        ),
        row(
            "r12",
            "subject one token over max_subject_tokens",
            false,
            16,
            Shape::Depth(MAX_TOKENS + 1),
            invalid(),
        ),
    ]
}

/// What one cell published.
struct Cell<'a> {
    row: &'a Row,
    front_end: FrontEnd,
    want: &'a Want,
    message: Message,
}

impl Cell<'_> {
    fn name(&self) -> String {
        format!("[{}] × [{}]", self.row.name, self.front_end.name())
    }

    fn pad(&self) -> Option<&str> {
        self.message
            .headers
            .iter()
            .find(|(n, _)| n == PAD)
            .map(|(_, v)| v.as_str())
    }

    /// A subject the server should have refused as too long or too deep.
    fn subject_over_limits(&self) -> bool {
        matches!(self.row.shape, Shape::Len(n) if n > MAX_SUBJECT_LEN)
            || matches!(self.row.shape, Shape::Depth(n) if n > MAX_TOKENS)
    }
}

fn cell_message(row: &Row, front_end: FrontEnd) -> Message {
    let base = format!("lim.{}.{}", row.key, front_end.key());
    let subject = match row.shape {
        Shape::Short => base,
        Shape::Len(n) => format!("{base}.{}", "x".repeat(n - base.len() - 1)),
        Shape::Depth(n) => format!("{base}{}", ".t".repeat(n - 3)),
    };
    let headers = if row.headers {
        vec![(PAD.to_owned(), "p".repeat(PAD_VALUE_LEN))]
    } else {
        Vec::new()
    };
    Message {
        topic: subject.replace('.', "/"),
        payload: payload(&subject, row.payload),
        subject,
        headers,
        reply: true,
        ..Message::default()
    }
}

/// What a stored message read back must be: `payload`, and the pad header if any.
fn compare(what: &str, cell: &Cell<'_>, payload: &[u8], pad: Option<&str>) -> Result<(), String> {
    let mut wrong = Vec::new();
    if let Some(diff) = bytes_diff(payload, &cell.message.payload) {
        wrong.push(format!("payload: {diff}"));
    }
    if pad != cell.pad() {
        wrong.push(format!(
            "header {PAD}: {} where {} was published",
            pad.map_or("missing".into(), |p| format!("{} bytes", p.len())),
            cell.pad()
                .map_or("none".into(), |p| format!("{} bytes", p.len())),
        ));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("{what}: {}", wrong.join("; ")))
    }
}

/// A native delivery of a stored message: the same bytes, within `max_payload`.
fn native_stored(
    what: &str,
    cell: &Cell<'_>,
    m: &NatsMsg,
    max_payload: usize,
) -> Result<(), String> {
    if let Some(status) = m.header("Canopy-Status") {
        return Err(format!(
            "{what}: API error {status}: {}",
            String::from_utf8_lossy(&m.payload)
        ));
    }
    let mut wrong = Vec::new();
    if let Err(e) = compare(what, cell, &m.payload, m.header(PAD).as_deref()) {
        wrong.push(e);
    }
    // A get or replay answer is the stored message plus the metadata the API adds
    // (`Canopy-Subject`, `-Version`, `-Offset`, `-Time`), as JetStream's direct get
    // adds its `Nats-*` headers: the message itself stays within `max_payload`.
    let own = message_size_without_metadata(m);
    if own > max_payload {
        wrong.push(format!(
            "{what}: {own} bytes of the message's own headers + payload, above the \
             max_payload of {max_payload} that INFO announced"
        ));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Header and payload bytes of a stored message as it was published: the answer's
/// header block without the lines the API adds, counted as the block the publisher
/// sent (an empty block when only metadata is left).
fn message_size_without_metadata(m: &NatsMsg) -> usize {
    const METADATA: [&str; 4] = [
        "Canopy-Subject",
        "Canopy-Version",
        "Canopy-Offset",
        "Canopy-Time",
    ];
    let Some(block) = m.headers.as_deref() else {
        return m.payload.len();
    };
    let text = String::from_utf8_lossy(block);
    let own: Vec<&str> = text
        .split("\r\n")
        .skip(1)
        .filter(|line| !line.is_empty())
        .filter(|line| {
            let name = line.split(':').next().unwrap_or_default();
            !METADATA.contains(&name)
        })
        .collect();
    if own.is_empty() {
        return m.payload.len();
    }
    // `NATS/1.0\r\n`, each line with its `\r\n`, and the blank line.
    let block_len = 10 + own.iter().map(|l| l.len() + 2).sum::<usize>() + 2;
    block_len + m.payload.len()
}

/// The read paths a taken message must come back through.
#[derive(Debug, Clone, Copy)]
enum ReadPath {
    NativeGet,
    NativeReplay,
    NativeSub,
    Mqtt311Sub,
    WsGet,
    WsSubFrom,
    CliGet,
    CliReplay,
}

impl ReadPath {
    const ALL: [ReadPath; 8] = [
        ReadPath::NativeGet,
        ReadPath::NativeReplay,
        ReadPath::NativeSub,
        ReadPath::Mqtt311Sub,
        ReadPath::WsGet,
        ReadPath::WsSubFrom,
        ReadPath::CliGet,
        ReadPath::CliReplay,
    ];

    fn name(self) -> &'static str {
        match self {
            ReadPath::NativeGet => "native $CANOPY.get",
            ReadPath::NativeReplay => "native $CANOPY.replay",
            ReadPath::NativeSub => "native live subscriber",
            ReadPath::Mqtt311Sub => "MQTT 3.1.1 live subscriber",
            ReadPath::WsGet => "/ws get",
            ReadPath::WsSubFrom => "/ws sub from_version",
            ReadPath::CliGet => "canopy get",
            ReadPath::CliReplay => "canopy replay",
        }
    }
}

/// What the live subscribers received, by subject (native) and topic (MQTT 3.1.1).
#[derive(Default)]
struct Live {
    native: HashMap<String, Vec<NatsMsg>>,
    native_max_payload: usize,
    /// Payloads with the size of the PUBLISH packet that carried them.
    mqtt3: HashMap<String, Vec<(Vec<u8>, usize)>>,
}

/// A 3.1.1 QoS 0 PUBLISH's size on the wire.
fn mqtt3_packet_size(topic: &str, payload: &[u8]) -> usize {
    let remaining = 2 + topic.len() + payload.len();
    let length_bytes = match remaining {
        0..128 => 1,
        128..16_384 => 2,
        16_384..2_097_152 => 3,
        _ => 4,
    };
    1 + length_bytes + remaining
}

async fn cli(args: &[&str], addrs: Addrs) -> Result<String, String> {
    let url = format!("nats://{}", addrs.native);
    let output = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_canopy"))
            .args(args)
            .args(["--server", url.as_str()])
            .env_remove("CANOPY_TOKEN")
            .env_remove("CANOPY_USER")
            .env_remove("CANOPY_PASSWORD")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("canopy {args:?} did not finish within the wait"))?
    .map_err(|e| format!("cannot run canopy: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "canopy {} failed ({}): {}",
            args[0],
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A message the CLI printed as JSON.
fn cli_message(what: &str, cell: &Cell<'_>, line: &str) -> Result<(), String> {
    let value: Value =
        serde_json::from_str(line).map_err(|e| format!("{what}: not JSON ({e}): {:.200}", line))?;
    let payload = match (value["payload_base64"].as_str(), value["payload"].as_str()) {
        (Some(b64), _) => unb64(b64).map_err(|e| format!("{what}: {e}"))?,
        (None, Some(text)) => text.as_bytes().to_vec(),
        (None, None) => return Err(format!("{what}: no payload in {value}")),
    };
    compare(what, cell, &payload, value["headers"][PAD].as_str())
}

/// A `/ws` message (`get` answer or `msg`): headers and `data_b64`.
fn ws_message(what: &str, cell: &Cell<'_>, value: &Value) -> Result<(), String> {
    let payload = match (value["data_b64"].as_str(), value.get("data")) {
        (Some(b64), _) => unb64(b64).map_err(|e| format!("{what}: {e}"))?,
        (None, Some(data)) => data.to_string().into_bytes(),
        (None, None) => return Err(format!("{what}: no payload in {value:.200}")),
    };
    compare(what, cell, &payload, value["headers"][PAD].as_str())
}

async fn read_back(
    path: ReadPath,
    cell: &Cell<'_>,
    addrs: Addrs,
    live: &Live,
    cli_slots: &tokio::sync::Semaphore,
) -> Result<(), String> {
    let what = path.name();
    let subject = cell.message.subject.as_str();
    match path {
        ReadPath::NativeGet => {
            let mut native = Native::connect(addrs.native, None).await?;
            let answers = native
                .api("get", &json!({"subject": subject, "version": 1}), |_| true)
                .await
                .map_err(|e| format!("{what}: {e}"))?;
            native_stored(what, cell, &answers[0], native.max_payload)
        }
        ReadPath::NativeReplay => {
            let mut native = Native::connect(addrs.native, None).await?;
            let mut answers = native
                .api("replay", &json!({"subject": subject, "max": 10}), |m| {
                    m.header("Canopy-Done").as_deref() == Some("true")
                        || m.header("Canopy-Status").is_some()
                })
                .await
                .map_err(|e| format!("{what}: {e}"))?;
            let end = answers.pop().ok_or_else(|| format!("{what}: no answer"))?;
            if let Some(status) = end.header("Canopy-Status") {
                return Err(format!(
                    "{what}: API error {status}: {}",
                    String::from_utf8_lossy(&end.payload)
                ));
            }
            match answers.as_slice() {
                [one] => native_stored(what, cell, one, native.max_payload),
                other => Err(format!("{what}: {} messages instead of 1", other.len())),
            }
        }
        ReadPath::NativeSub => match live.native.get(subject).map(Vec::as_slice) {
            Some([one]) => native_stored(what, cell, one, live.native_max_payload),
            Some(many) => Err(format!("{what}: {} deliveries instead of 1", many.len())),
            None => Err(format!("{what}: never delivered")),
        },
        ReadPath::Mqtt311Sub => match live.mqtt3.get(&cell.message.topic).map(Vec::as_slice) {
            // 3.1.1 has no headers: the payload alone.
            Some([(got, _)]) => bytes_diff(got, &cell.message.payload)
                .map_or(Ok(()), |d| Err(format!("{what}: payload: {d}"))),
            Some(many) => Err(format!("{what}: {} deliveries instead of 1", many.len())),
            None => Err(format!("{what}: never delivered")),
        },
        ReadPath::WsGet => {
            let mut ws = Ws::open(addrs.http, None).await?;
            match ws
                .call(json!({"op": "get", "subject": subject, "version": 1}))
                .await
            {
                Some(WsEvent::Text(value)) if value["op"] == "ok" => ws_message(what, cell, &value),
                other => Err(format!("{what}: {other:.300?}")),
            }
        }
        ReadPath::WsSubFrom => {
            let mut ws = Ws::open(addrs.http, None).await?;
            let sid = match ws
                .call(json!({"op": "sub", "pattern": subject, "from_version": 1}))
                .await
            {
                Some(WsEvent::Text(value)) if value["op"] == "ok" => value["sid"].clone(),
                other => return Err(format!("{what}: {other:.300?}")),
            };
            loop {
                match ws.next().await {
                    Some(WsEvent::Text(value)) if value["op"] == "msg" && value["sid"] == sid => {
                        return ws_message(what, cell, &value);
                    }
                    Some(WsEvent::Text(value)) if value["op"] == "error" => {
                        return Err(format!("{what}: {value}"));
                    }
                    Some(WsEvent::Text(_)) => {}
                    other => return Err(format!("{what}: {other:.300?} instead of the message")),
                }
            }
        }
        ReadPath::CliGet => {
            let _slot = cli_slots.acquire().await.map_err(|e| e.to_string())?;
            let out = cli(&["get", subject, "--version", "1", "--json"], addrs).await?;
            cli_message(what, cell, out.trim_end())
        }
        ReadPath::CliReplay => {
            let _slot = cli_slots.acquire().await.map_err(|e| e.to_string())?;
            let out = cli(
                &["replay", subject, "--from", "1", "-n", "1", "--json"],
                addrs,
            )
            .await?;
            match out.lines().collect::<Vec<_>>().as_slice() {
                [one] => cli_message(what, cell, one),
                other => Err(format!("{what}: {} lines instead of 1", other.len())),
            }
        }
    }
}

/// Whether the store holds anything under a refused message's subject.
async fn not_stored(cell: &Cell<'_>, addrs: Addrs) -> Result<(), String> {
    let mut native = Native::connect(addrs.native, None).await?;
    let answers = native
        .api("get", &json!({"subject": cell.message.subject}), |_| true)
        .await?;
    match answers[0].header("Canopy-Status").as_deref() {
        Some("404") => Ok(()),
        other => Err(format!(
            "the refused message was stored (get answered status {other:?} with {} bytes)",
            answers[0].payload.len()
        )),
    }
}

#[tokio::test]
async fn one_limit_end_to_end_on_every_front_end_and_read_path() {
    let mut config = test_config();
    config.native.max_payload = MAX_PAYLOAD;
    config.mqtt.max_packet_size = MAX_PACKET;
    config.limits.max_subject_len = MAX_SUBJECT_LEN;
    config.limits.max_subject_tokens = MAX_TOKENS;
    // Every stored publish with a reply subject is acked (JetStream's way), so a native
    // publish needs no Canopy-Ack header that would change its header bytes.
    for policy in &mut config.store.policies {
        if policy.pattern == ">" {
            policy.ack = canopy::config::AckMode::Always;
        }
    }
    let server = start(config).await;
    let addrs = Addrs::of(&server);

    let mut live_native = Native::connect(addrs.native, None)
        .await
        .expect("the live native subscriber connects");
    live_native
        .subscribe("lim.>", "live")
        .await
        .expect("the live native subscription");
    // 3.1.1 announces no Maximum Packet Size: this client takes anything, and the
    // table checks each PUBLISH against the server's own limit.
    let mut live_mqtt3 = Mqtt::connect(addrs.mqtt, Level::V311, "lim-live-3", None, 1 << 20)
        .await
        .expect("the live MQTT 3.1.1 subscriber connects");
    assert_eq!(
        live_mqtt3.subscribe("lim/#").await,
        Ok(0),
        "SUBACK for lim/#"
    );

    let rows = rows();
    let cells: Vec<Cell<'_>> = rows
        .iter()
        .flat_map(|row| {
            FrontEnd::ALL
                .iter()
                .zip(&row.want)
                .filter(|(_, want)| !matches!(want, Want::Skip(_)))
                .map(move |(front_end, want)| Cell {
                    row,
                    front_end: *front_end,
                    want,
                    message: cell_message(row, *front_end),
                })
        })
        .collect();

    // Publish every cell at once, each on a connection of its own.
    let answers = join_all(cells.iter().map(|cell| async move {
        let client_id = format!("lim-{}-{}", cell.row.key, cell.front_end.key());
        match Publisher::open(cell.front_end, addrs, None, &client_id, 1 << 20).await {
            Ok(mut publisher) => Ok(publisher.publish(&cell.message).await),
            Err(e) => Err(e),
        }
    }))
    .await;

    // Everything routed before it reaches the live subscribers before this marker.
    let mut marker = Publisher::open(FrontEnd::Native, addrs, None, "", 1 << 20)
        .await
        .expect("the marker's publisher connects");
    let marked = marker
        .publish(&Message {
            reply: true,
            ..Message::plain("lim.end", b"end")
        })
        .await;
    assert!(
        matches!(marked, Answer::Taken { .. }),
        "the marker: {marked}"
    );

    let mut failing: Vec<String> = Vec::new();
    let mut live = Live {
        native_max_payload: live_native.max_payload,
        ..Live::default()
    };
    loop {
        match live_native.next().await {
            Some(NativeEvent::Msg(m)) if m.subject == "lim.end" => break,
            Some(NativeEvent::Msg(m)) => live.native.entry(m.subject.clone()).or_default().push(m),
            Some(NativeEvent::Closed(why)) => {
                failing.push(format!("the live native subscriber was closed: {why:?}"));
                break;
            }
            Some(_) => {}
            None => {
                failing.push("the live native subscriber never received lim.end".into());
                break;
            }
        }
    }
    loop {
        match live_mqtt3.next().await.map(MqttEvent::packet) {
            Some(Ok(Packet::Publish(p))) if p.topic.as_str() == "lim/end" => break,
            Some(Ok(Packet::Publish(p))) => {
                let size = mqtt3_packet_size(p.topic.as_str(), &p.payload);
                live.mqtt3
                    .entry(p.topic.as_str().to_owned())
                    .or_default()
                    .push((p.payload.to_vec(), size));
            }
            Some(Ok(_)) => {}
            Some(Err(why)) => {
                failing.push(format!(
                    "the live MQTT 3.1.1 subscriber was closed: {why:?}"
                ));
                break;
            }
            None => {
                failing.push("the live MQTT 3.1.1 subscriber never received lim/end".into());
                break;
            }
        }
    }
    for (subject, messages) in &live.native {
        for m in messages
            .iter()
            .filter(|m| m.size() > live.native_max_payload)
        {
            failing.push(format!(
                "the live native subscriber received {subject} with {} bytes of headers + \
                 payload, above the max_payload of {} its INFO announced",
                m.size(),
                live.native_max_payload
            ));
        }
    }
    for (topic, messages) in &live.mqtt3 {
        for (_, size) in messages.iter().filter(|(_, size)| *size > MAX_PACKET) {
            failing.push(format!(
                "the live MQTT 3.1.1 subscriber received a {size}-byte PUBLISH on {topic}, \
                 above the Maximum Packet Size of {MAX_PACKET}"
            ));
        }
    }

    // Judge each publish; read the taken ones back on every path, at once.
    let cli_slots = Arc::new(tokio::sync::Semaphore::new(4));
    let live = &live;
    let judged = join_all(cells.iter().zip(&answers).map(|(cell, answer)| {
        let cli_slots = Arc::clone(&cli_slots);
        async move {
            let mut problems = Vec::new();
            let answer = match answer {
                Ok(answer) => answer,
                Err(e) => return vec![format!("{}: cannot connect: {e}", cell.name())],
            };
            if let Some(wrong) = cell.want.check(answer) {
                problems.push(format!("{} (publish): {wrong}", cell.name()));
            }
            if matches!(cell.want, Want::Taken) {
                if matches!(answer, Answer::Taken { .. }) {
                    let reads = join_all(
                        ReadPath::ALL
                            .iter()
                            .map(|path| read_back(*path, cell, addrs, live, &cli_slots)),
                    )
                    .await;
                    for (path, read) in ReadPath::ALL.iter().zip(reads) {
                        if let Err(e) = read {
                            problems.push(format!("{} → [{}]: {e}", cell.name(), path.name()));
                        }
                    }
                }
            } else {
                if live.native.contains_key(&cell.message.subject) {
                    problems.push(format!(
                        "{}: the refused message reached the live native subscriber",
                        cell.name()
                    ));
                }
                if live.mqtt3.contains_key(&cell.message.topic) {
                    problems.push(format!(
                        "{}: the refused message reached the live MQTT 3.1.1 subscriber",
                        cell.name()
                    ));
                }
                if !cell.subject_over_limits()
                    && let Err(e) = not_stored(cell, addrs).await
                {
                    problems.push(format!("{}: {e}", cell.name()));
                }
            }
            problems
        }
    }))
    .await;
    failing.extend(judged.into_iter().flatten());
    let total = cells.len();
    server.stop().await;
    assert!(
        failing.is_empty(),
        "{} problems in {total} publish cells (each × {} read paths when taken) differ from \
         SPEC.md:\n{}",
        failing.len(),
        ReadPath::ALL.len(),
        failing.join("\n")
    );
}
