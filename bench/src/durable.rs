//! The durable shapes: acked publishes (`durable`) and the replay of one subject
//! (`replay`), with the same raw client against Canopy's store and nats-server's JetStream.
//!
//! Canopy: every publish carries `Canopy-Ack: durable`, so it is answered once the
//! write-ahead log holding it is in the object store (fsynced on `file://`); with
//! `--expect` also `Canopy-Expected-Version`. nats-server: a stream with file storage
//! over `<prefix>.>` is created (or reused) first, so every publish with a reply subject
//! is answered with a PubAck; with `--expect` it carries
//! `Nats-Expected-Last-Subject-Sequence`. Which server is which comes from INFO (Canopy
//! says `go: canopy <version>`).
//!
//! Each publisher connection owns the subjects `i` with `i % publishers == its number`
//! and cycles through them, with at most `--ack-window` publishes unacknowledged. A
//! publish's reply subject names its window slot, so an ack is matched to its publish
//! (and its send time) whatever order acks come in.
//!
//! Owns: subjects, priming, the ack window, expected-version tracking, reading acks,
//! JetStream stream and consumer setup, and timing replays.
//!
//! Must never: have two publishes to one subject in flight when expecting versions,
//! count an answer it cannot match to a publish, or pass a refused publish (or any
//! error answer) as a success.

use std::io::Write as _;
use std::time::Duration;

use bytes::Bytes;
use canopy_protocols::native::{
    HeaderMap, ServerInfo, ServerOp, encode_hpub, encode_pub, encode_sub, encode_unsub,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::clock::{now_ns, stamp};
use super::conn::{Conn, WRITE_BATCH};
use super::measured::Measured;
use super::report::{DurableInfo, ReplayStats};
use super::roles::{Acked, Connection as _, share};
use super::timed::Tasks;
use super::{BenchError, DurableArgs, Options, Report};

/// The header block asking Canopy for a durable ack.
const CANOPY_ACK: &[u8] = b"NATS/1.0\r\nCanopy-Ack: durable\r\n\r\n";
/// JetStream's "stream name already in use" error code.
const JS_STREAM_NAME_IN_USE: u64 = 10058;

/// Which server is under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Canopy,
    Nats,
}

impl Kind {
    fn of(info: &ServerInfo) -> Kind {
        if info.go.starts_with("canopy") {
            Kind::Canopy
        } else {
            Kind::Nats
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Canopy => "canopy",
            Kind::Nats => "nats-server",
        }
    }

    fn acks(self, args: &DurableArgs) -> String {
        match self {
            Kind::Canopy => "Canopy-Ack: durable (WAL flushed to the object store, fsync)".into(),
            Kind::Nats => format!(
                "JetStream PubAck, stream {} over {}.> with file storage (acked before fsync)",
                args.stream, args.prefix
            ),
        }
    }
}

fn new_inbox() -> String {
    format!("_INBOX.{:016x}{:08x}", fastrand::u64(..), fastrand::u32(..))
}

/// A `NATS/1.0 <status>` header block's status, if it has one.
fn status_of(headers: &[u8]) -> Option<String> {
    let line = headers.split(|&b| b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let rest = line.strip_prefix("NATS/1.0")?.trim();
    (!rest.is_empty()).then(|| rest.to_owned())
}

/// One connection for API requests (stream and consumer setup, replay): headers and
/// no-responders on, so a request nobody serves fails at once.
struct Api {
    conn: Conn,
    inbox: String,
    next: u64,
    timeout: Duration,
}

/// A message received on the API connection.
struct Answer {
    subject: Bytes,
    sid: Bytes,
    headers: Option<Bytes>,
    payload: Bytes,
}

impl Api {
    async fn connect(addr: &str, timeout: Duration) -> Result<Api, BenchError> {
        let mut conn = Conn::connect_with(addr, "api client", timeout, true, true).await?;
        let inbox = new_inbox();
        encode_sub(conn.wbuf(), format!("{inbox}.*").as_bytes(), None, b"1");
        conn.ping_pong(timeout).await?;
        Ok(Api {
            conn,
            inbox,
            next: 0,
            timeout,
        })
    }

    fn reply(&mut self, tag: &str) -> String {
        self.next += 1;
        format!("{}.{tag}{}", self.inbox, self.next)
    }

    /// The next message on the inbox, waiting up to the timeout.
    async fn next_answer(&mut self, role: &'static str) -> Result<Answer, BenchError> {
        let timeout = self.timeout;
        loop {
            match self.conn.next_op()? {
                Some(ServerOp::Msg {
                    subject,
                    sid,
                    payload,
                    ..
                }) => {
                    return Ok(Answer {
                        subject,
                        sid,
                        headers: None,
                        payload,
                    });
                }
                Some(ServerOp::HMsg {
                    subject,
                    sid,
                    headers,
                    payload,
                    ..
                }) => {
                    return Ok(Answer {
                        subject,
                        sid,
                        headers: Some(headers),
                        payload,
                    });
                }
                Some(_) => continue,
                None => {}
            }
            self.conn.send().await?;
            tokio::time::timeout(timeout, self.conn.read_more())
                .await
                .map_err(|_| BenchError::Timeout { role, timeout })??;
        }
    }

    /// Sends `body` to `subject` and returns the JSON answer; other messages on the
    /// inbox (late ones of an earlier request) are skipped.
    async fn request(
        &mut self,
        role: &'static str,
        subject: &str,
        body: &Value,
    ) -> Result<Value, BenchError> {
        let reply = self.reply("q");
        encode_pub(
            self.conn.wbuf(),
            subject.as_bytes(),
            Some(reply.as_bytes()),
            body.to_string().as_bytes(),
        );
        self.conn.send().await?;
        loop {
            let answer = self.next_answer(role).await?;
            if answer.subject != reply.as_bytes() {
                continue;
            }
            if let Some(status) = answer.headers.as_deref().and_then(status_of) {
                return Err(BenchError::Api {
                    role,
                    text: format!("{subject} answered with status {status}"),
                });
            }
            return serde_json::from_slice(&answer.payload).map_err(|e| BenchError::Api {
                role,
                text: format!("{subject} answered with something that is not JSON: {e}"),
            });
        }
    }
}

/// JetStream's `{"error": {...}}`, as text.
fn js_error(answer: &Value) -> Option<(u64, String)> {
    let error = answer.get("error")?;
    let code = error.get("err_code").and_then(Value::as_u64).unwrap_or(0);
    Some((code, error.to_string()))
}

/// Creates the stream over `<prefix>.>` with file storage, or checks that an existing
/// one of that name captures the prefix.
async fn create_stream(api: &mut Api, args: &DurableArgs) -> Result<(), BenchError> {
    const ROLE: &str = "JetStream stream setup";
    let wanted = format!("{}.>", args.prefix);
    let create = json!({"name": args.stream, "subjects": [wanted], "storage": "file"});
    let subject = format!("$JS.API.STREAM.CREATE.{}", args.stream);
    let answer = api.request(ROLE, &subject, &create).await?;
    match js_error(&answer) {
        None => Ok(()),
        Some((JS_STREAM_NAME_IN_USE, _)) => {
            let info = api
                .request(
                    ROLE,
                    &format!("$JS.API.STREAM.INFO.{}", args.stream),
                    &json!({}),
                )
                .await?;
            let covers = info["config"]["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .any(|s| {
                    s == ">"
                        || s.strip_suffix('>')
                            .is_some_and(|head| format!("{}.", args.prefix).starts_with(head))
                });
            if covers {
                Ok(())
            } else {
                Err(BenchError::Api {
                    role: ROLE,
                    text: format!(
                        "stream {} exists with subjects {} which do not capture {wanted}",
                        args.stream, info["config"]["subjects"]
                    ),
                })
            }
        }
        Some((_, text)) => Err(BenchError::Api { role: ROLE, text }),
    }
}

/// A window slot: one publish awaiting its ack.
#[derive(Clone, Copy)]
struct Slot {
    sent_ns: u64,
    /// Index into the publisher's subjects; `u32::MAX` when free.
    subject: u32,
}

const FREE: u32 = u32::MAX;

/// The fields of an ack both servers send (Canopy adds `version`).
#[derive(Deserialize)]
struct AckBody {
    seq: Option<u64>,
    version: Option<u64>,
    error: Option<Value>,
    #[serde(default)]
    duplicate: bool,
}

/// The subject's new head from an ack (Canopy: its version; JetStream: the sequence),
/// or why the publish was refused.
fn read_ack(kind: Kind, headers: Option<&[u8]>, payload: &[u8]) -> Result<u64, String> {
    if let Some(status) = headers.and_then(status_of) {
        return Err(format!("status {status}"));
    }
    let ack: AckBody = serde_json::from_slice(payload).map_err(|e| {
        format!(
            "an answer that is not an ack ({e}): {}",
            String::from_utf8_lossy(payload)
        )
    })?;
    if let Some(error) = ack.error {
        return Err(error.to_string());
    }
    if ack.duplicate {
        return Err("acknowledged as a duplicate".into());
    }
    match kind {
        Kind::Canopy => ack.version,
        Kind::Nats => ack.seq,
    }
    .ok_or_else(|| {
        format!(
            "an ack without its head: {}",
            String::from_utf8_lossy(payload)
        )
    })
}

/// One publisher connection with its subjects and ack window.
struct Publisher {
    conn: Conn,
    kind: Kind,
    /// `_INBOX.<id>.`: a publish's reply subject is this plus its slot number.
    inbox: Vec<u8>,
    subjects: Vec<Bytes>,
    /// Per subject: the version (Canopy) or last sequence (JetStream) the last ack named.
    heads: Vec<u64>,
    in_flight: Vec<bool>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    cursor: usize,
    payload: Vec<u8>,
    /// xorshift state for `--random-payload`; 0 when payloads repeat one byte.
    noise: u64,
    headers: Vec<u8>,
    reply: Vec<u8>,
    idle: Duration,
}

impl Publisher {
    async fn connect(
        addr: &str,
        subjects: Vec<Bytes>,
        window: usize,
        size: usize,
        random: bool,
        timeout: Duration,
    ) -> Result<Publisher, BenchError> {
        let mut conn = Conn::connect_with(addr, "durable publisher", timeout, true, false).await?;
        let kind = Kind::of(conn.info());
        let inbox = new_inbox();
        encode_sub(conn.wbuf(), format!("{inbox}.*").as_bytes(), None, b"1");
        conn.ping_pong(timeout).await?;
        let n = subjects.len();
        Ok(Publisher {
            conn,
            kind,
            inbox: format!("{inbox}.").into_bytes(),
            subjects,
            heads: vec![0; n],
            in_flight: vec![false; n],
            slots: vec![
                Slot {
                    sent_ns: 0,
                    subject: FREE,
                };
                window
            ],
            free: (0..window as u32).rev().collect(),
            cursor: 0,
            payload: vec![b'x'; size],
            // Any odd seed; different per publisher through the inbox's address.
            noise: if random {
                (inbox.as_ptr() as u64) | 1
            } else {
                0
            },
            headers: Vec::with_capacity(96),
            reply: Vec::with_capacity(48),
            idle: timeout,
        })
    }

    /// Queues one publish of the subject at `local` in `slot`.
    fn queue(&mut self, slot: u32, local: usize, expect: bool) {
        self.reply.clear();
        self.reply.extend_from_slice(&self.inbox);
        let _ = write!(self.reply, "{slot}");
        if self.noise != 0 {
            for chunk in self.payload.chunks_mut(8) {
                self.noise ^= self.noise << 13;
                self.noise ^= self.noise >> 7;
                self.noise ^= self.noise << 17;
                let bytes = self.noise.to_le_bytes();
                chunk.copy_from_slice(&bytes[..chunk.len()]);
            }
        }
        stamp(&mut self.payload);
        let subject = self.subjects.get(local).map_or(&[][..], |s| &s[..]);
        let head = self.heads.get(local).copied().unwrap_or(0);
        let headers = match (self.kind, expect) {
            (Kind::Canopy, false) => Some(CANOPY_ACK),
            (Kind::Nats, false) => None,
            (kind, true) => {
                self.headers.clear();
                let _ = match kind {
                    Kind::Canopy => write!(
                        self.headers,
                        "NATS/1.0\r\nCanopy-Ack: durable\r\nCanopy-Expected-Version: {head}\r\n\r\n"
                    ),
                    Kind::Nats => write!(
                        self.headers,
                        "NATS/1.0\r\nNats-Expected-Last-Subject-Sequence: {head}\r\n\r\n"
                    ),
                };
                Some(&self.headers[..])
            }
        };
        let wbuf = self.conn.wbuf();
        match headers {
            Some(headers) => encode_hpub(wbuf, subject, Some(&self.reply), headers, &self.payload),
            None => encode_pub(wbuf, subject, Some(&self.reply), &self.payload),
        }
        if let Some(s) = self.slots.get_mut(slot as usize) {
            *s = Slot {
                sent_ns: now_ns(),
                subject: local as u32,
            };
        }
        if let Some(flag) = self.in_flight.get_mut(local) {
            *flag = true;
        }
    }

    /// Publishes `count` messages round robin over this publisher's subjects, keeping
    /// the window full, until every one is answered.
    async fn run(&mut self, count: u64, expect: bool) -> Result<Acked, BenchError> {
        let mut acked = Acked::new(now_ns());
        let n = self.subjects.len().max(1);
        let (mut sent, mut answered) = (0u64, 0u64);
        while answered < count {
            while sent < count {
                let local = self.cursor;
                if expect && self.in_flight.get(local).copied().unwrap_or(false) {
                    break;
                }
                let Some(slot) = self.free.pop() else {
                    break;
                };
                self.cursor = (local + 1) % n;
                self.queue(slot, local, expect);
                sent += 1;
                if self.conn.wbuf().len() >= WRITE_BATCH {
                    self.conn.send().await?;
                }
            }
            self.conn.send().await?;
            self.conn.stalled_read(self.idle, answered, count).await?;
            let now = now_ns();
            while let Some(op) = self.conn.next_op()? {
                let (subject, headers, payload) = match op {
                    ServerOp::Msg {
                        subject, payload, ..
                    } => (subject, None, payload),
                    ServerOp::HMsg {
                        subject,
                        headers,
                        payload,
                        ..
                    } => (subject, Some(headers), payload),
                    _ => continue,
                };
                let index = subject
                    .strip_prefix(&self.inbox[..])
                    .and_then(|tail| std::str::from_utf8(tail).ok())
                    .and_then(|tail| tail.parse::<usize>().ok());
                let Some(slot) = index.and_then(|i| self.slots.get_mut(i)) else {
                    return Err(BenchError::Unexpected {
                        role: "durable publisher",
                        what: format!("a message on {}", String::from_utf8_lossy(&subject)),
                    });
                };
                if slot.subject == FREE {
                    return Err(BenchError::Unexpected {
                        role: "durable publisher",
                        what: format!("a second answer on {}", String::from_utf8_lossy(&subject)),
                    });
                }
                let local = slot.subject as usize;
                acked.acks.latency.record(now.saturating_sub(slot.sent_ns));
                slot.subject = FREE;
                if let Some(i) = index {
                    self.free.push(i as u32);
                }
                if let Some(flag) = self.in_flight.get_mut(local) {
                    *flag = false;
                }
                answered += 1;
                acked.answered_at(now);
                match read_ack(self.kind, headers.as_deref(), &payload) {
                    Ok(head) => {
                        acked.acks.count += 1;
                        if let Some(h) = self.heads.get_mut(local) {
                            *h = head;
                        }
                    }
                    Err(text) => acked.refused(|| {
                        format!("{}: {text}", String::from_utf8_lossy(&self.subjects[local]))
                    }),
                }
            }
        }
        Ok(acked)
    }
}

fn check(args: &DurableArgs, expect: bool) -> Result<(), BenchError> {
    if args.publishers == 0 || args.subjects < args.publishers || args.ack_window == 0 {
        return Err(BenchError::Config(
            "the durable shapes need --publishers >= 1, --subjects >= --publishers and \
             --ack-window >= 1"
                .into(),
        ));
    }
    if args.subjects >= FREE as usize || args.ack_window >= FREE as usize {
        return Err(BenchError::Config(
            "too many subjects or too wide a window".into(),
        ));
    }
    if expect && args.subjects < args.publishers * args.ack_window {
        return Err(BenchError::Config(format!(
            "--expect needs --subjects >= --publishers x --ack-window ({} x {}), so no \
             subject waits for its own ack",
            args.publishers, args.ack_window
        )));
    }
    Ok(())
}

/// Connects the API client, finds the server kind and sets up JetStream if needed.
async fn setup(addr: &str, options: &Options) -> Result<(Api, Kind, ServerInfo), BenchError> {
    let mut api = Api::connect(addr, options.timeout).await?;
    let info = api.conn.info().clone();
    let kind = Kind::of(&info);
    if kind == Kind::Nats {
        create_stream(&mut api, &options.durable).await?;
    }
    Ok((api, kind, info))
}

/// The result of a load: every publisher's acks and the measured span.
struct Load {
    acked: Vec<Acked>,
    start: u64,
}

/// Connects the publishers, primes them if `expect`, then publishes `msgs` acked
/// messages in total and waits for every answer.
async fn load(addr: &str, options: &Options, msgs: u64, expect: bool) -> Result<Load, BenchError> {
    let args = &options.durable;
    let n = args.publishers;
    let mut publishers = Vec::with_capacity(n);
    for p in 0..n {
        let subjects = (p..args.subjects)
            .step_by(n)
            .map(|i| Bytes::from(format!("{}.{i}", args.prefix)))
            .collect();
        publishers.push(
            Publisher::connect(
                addr,
                subjects,
                args.ack_window,
                options.size,
                args.random_payload,
                options.timeout,
            )
            .await?,
        );
    }
    if expect {
        // One unmeasured publish per subject: its ack names the subject's head.
        let priming = Tasks(
            publishers
                .into_iter()
                .map(|mut publisher| {
                    tokio::spawn(async move {
                        let count = publisher.subjects.len() as u64;
                        let acked = publisher.run(count, false).await?;
                        match acked.first_error {
                            Some(first) => Err(BenchError::AckErrors {
                                errors: acked.errors,
                                answered: count,
                                first: format!("while priming: {first}"),
                            }),
                            None => Ok(publisher),
                        }
                    })
                })
                .collect(),
        );
        publishers = priming.join().await?;
    }
    let start = now_ns();
    let running = Tasks(
        publishers
            .into_iter()
            .enumerate()
            .map(|(p, mut publisher)| {
                let count = share(msgs, n, p);
                tokio::spawn(async move { publisher.run(count, expect).await })
            })
            .collect(),
    );
    Ok(Load {
        acked: running.join().await?,
        start,
    })
}

fn durable_report(
    options: &Options,
    info: ServerInfo,
    kind: Kind,
    expect: bool,
    load: &Load,
) -> Result<Report, BenchError> {
    let args = &options.durable;
    Acked::check(&load.acked)?;
    let measured = Measured::new(options.msgs, options.size, args.publishers, 0)
        .received(load.start, load.acked.iter().map(|a| &a.acks));
    Ok(Report {
        durable: Some(DurableInfo {
            server_kind: kind.name(),
            acks: kind.acks(args),
            subjects: args.subjects,
            ack_window: args.ack_window,
            expect,
            errors: load.acked.iter().map(|a| a.errors).sum(),
            max_ack_gap_ns: load.acked.iter().map(|a| a.max_gap_ns).max().unwrap_or(0),
        }),
        ..Report::new(options, info, measured)
    })
}

/// `--shape durable`.
pub async fn durable(addr: &str, options: &Options) -> Result<Report, BenchError> {
    let expect = options.durable.expect;
    check(&options.durable, expect)?;
    let (_api, kind, info) = setup(addr, options).await?;
    let load = load(addr, options, options.msgs, expect).await?;
    durable_report(options, info, kind, expect, &load)
}

/// `--shape replay`: loads `--msgs` (0: nothing, read what is there), then times
/// reading the first `--replay-max` messages of `--replay-samples` subjects.
pub async fn replay(addr: &str, options: &Options) -> Result<Report, BenchError> {
    let args = &options.durable;
    check(args, false)?;
    if args.replay_samples == 0 || args.replay_max == 0 {
        return Err(BenchError::Config(
            "--replay-samples and --replay-max must be at least 1".into(),
        ));
    }
    let (mut api, kind, info) = setup(addr, options).await?;
    let load = if options.msgs > 0 {
        load(addr, options, options.msgs, false).await?
    } else {
        Load {
            acked: Vec::new(),
            start: now_ns(),
        }
    };
    let mut report = durable_report(options, info, kind, false, &load)?;
    let stride = (args.subjects / args.replay_samples).max(1);
    let mut times = Vec::with_capacity(args.replay_samples);
    let mut min_count = usize::MAX;
    for j in 0..args.replay_samples {
        let subject = format!(
            "{}.{}",
            args.prefix,
            (j * stride + stride / 2) % args.subjects
        );
        let (ns, count) = match kind {
            Kind::Canopy => replay_canopy(&mut api, &subject, args.replay_max).await?,
            Kind::Nats => replay_jetstream(&mut api, args, &subject).await?,
        };
        times.push(ns);
        min_count = min_count.min(count);
    }
    let mut sorted = times.clone();
    sorted.sort_unstable();
    let at = |q: f64| {
        let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
        sorted.get(i).copied().unwrap_or(0)
    };
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 0 && mid > 0 {
        (sorted[mid - 1] + sorted[mid]) / 2
    } else {
        at(0.5)
    };
    report.replay = Some(ReplayStats {
        method: match kind {
            Kind::Canopy => "$CANOPY.replay request {subject, max}, until Canopy-Done".into(),
            Kind::Nats => "ephemeral push consumer (filter_subject, deliver all, ack none, \
                           mem_storage) created per read, until the last message"
                .into(),
        },
        samples: args.replay_samples,
        max: args.replay_max,
        min_count,
        median_ns: median,
        min_ns: at(0.0),
        p90_ns: at(0.9),
        max_ns: at(1.0),
        times_ns: times,
    });
    Ok(report)
}

/// Times one `$CANOPY.replay` page: request sent to `Canopy-Done` received.
async fn replay_canopy(
    api: &mut Api,
    subject: &str,
    max: usize,
) -> Result<(u64, usize), BenchError> {
    const ROLE: &str = "replay reader";
    let reply = api.reply("r");
    let body = json!({"subject": subject, "max": max}).to_string();
    let start = now_ns();
    encode_pub(
        api.conn.wbuf(),
        b"$CANOPY.replay",
        Some(reply.as_bytes()),
        body.as_bytes(),
    );
    api.conn.send().await?;
    let mut count = 0;
    loop {
        let answer = api.next_answer(ROLE).await?;
        if answer.subject != reply.as_bytes() {
            continue;
        }
        let Some(block) = answer.headers else {
            return Err(BenchError::Api {
                role: ROLE,
                text: String::from_utf8_lossy(&answer.payload).into_owned(),
            });
        };
        if let Some(status) = status_of(&block) {
            return Err(BenchError::Api {
                role: ROLE,
                text: format!("$CANOPY.replay answered with status {status}"),
            });
        }
        let headers = HeaderMap::parse(&block).unwrap_or_default();
        if headers.get("Canopy-Status").is_some() {
            return Err(BenchError::Api {
                role: ROLE,
                text: String::from_utf8_lossy(&answer.payload).into_owned(),
            });
        }
        if headers.get("Canopy-Done").is_some() {
            let end = now_ns();
            if count == 0 {
                return Err(BenchError::Api {
                    role: ROLE,
                    text: format!("{subject} has no stored messages"),
                });
            }
            return Ok((end.saturating_sub(start), count));
        }
        count += 1;
    }
}

/// Times one read through an ephemeral push consumer: create request sent to the last
/// message received (`--replay-max`, or fewer if the consumer says the subject has
/// fewer). JetStream delivers with the stored subject, to subscriptions of the exact
/// deliver subject (not wildcards), so the deliver subject gets its own subscription
/// (made before the clock starts) and deliveries are told by its sid. The consumer is
/// deleted afterwards, untimed.
async fn replay_jetstream(
    api: &mut Api,
    args: &DurableArgs,
    subject: &str,
) -> Result<(u64, usize), BenchError> {
    const ROLE: &str = "JetStream replay reader";
    let reply = api.reply("r");
    let deliver = format!("{}.deliver", api.reply("c"));
    let sid = format!("c{}", api.next);
    encode_sub(api.conn.wbuf(), deliver.as_bytes(), None, sid.as_bytes());
    api.conn.ping_pong(api.timeout).await?;
    let body = json!({
        "stream_name": args.stream,
        "config": {
            "deliver_subject": deliver,
            "filter_subject": subject,
            "deliver_policy": "all",
            "ack_policy": "none",
            "replay_policy": "instant",
            "mem_storage": true,
        },
    })
    .to_string();
    let start = now_ns();
    encode_pub(
        api.conn.wbuf(),
        format!("$JS.API.CONSUMER.CREATE.{}", args.stream).as_bytes(),
        Some(reply.as_bytes()),
        body.as_bytes(),
    );
    api.conn.send().await?;
    let mut count = 0;
    let mut target = args.replay_max;
    let mut name = None;
    let mut end = start;
    while name.is_none() || count < target {
        let answer = api.next_answer(ROLE).await?;
        if answer.sid == sid.as_bytes() {
            count += 1;
            end = now_ns();
        } else if answer.subject == reply.as_bytes() {
            end = end.max(now_ns());
            let created: Value = serde_json::from_slice(&answer.payload).unwrap_or_default();
            if let Some((_, text)) = js_error(&created) {
                return Err(BenchError::Api { role: ROLE, text });
            }
            let pending = created["num_pending"].as_u64().unwrap_or(u64::MAX);
            let delivered = created["delivered"]["consumer_seq"].as_u64().unwrap_or(0);
            let total = usize::try_from(pending.saturating_add(delivered)).unwrap_or(usize::MAX);
            target = target.min(total);
            name = Some(created["name"].as_str().unwrap_or_default().to_owned());
        }
    }
    let elapsed = end.saturating_sub(start);
    encode_unsub(api.conn.wbuf(), sid.as_bytes(), None);
    if let Some(name) = name.filter(|n| !n.is_empty()) {
        let deleted = api
            .request(
                ROLE,
                &format!("$JS.API.CONSUMER.DELETE.{}.{name}", args.stream),
                &json!({}),
            )
            .await?;
        if let Some((_, text)) = js_error(&deleted) {
            return Err(BenchError::Api { role: ROLE, text });
        }
    }
    if count == 0 {
        return Err(BenchError::Api {
            role: ROLE,
            text: format!("{subject} has no stored messages"),
        });
    }
    Ok((elapsed, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_are_read_for_both_servers() {
        let canopy = br#"{"stream":"default","seq":10,"subject":"a.b","version":3}"#;
        assert_eq!(read_ack(Kind::Canopy, None, canopy), Ok(3));
        assert_eq!(
            read_ack(Kind::Nats, None, br#"{"stream":"B","seq":7}"#),
            Ok(7)
        );
        let conflict = br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 9"},"stream":"B"}"#;
        assert!(
            read_ack(Kind::Nats, None, conflict)
                .expect_err("refused")
                .contains("wrong last sequence")
        );
        let no_responders = b"NATS/1.0 503\r\n\r\n";
        assert_eq!(
            read_ack(Kind::Nats, Some(no_responders), b""),
            Err("status 503".into())
        );
        assert!(read_ack(Kind::Canopy, None, b"hello").is_err());
    }

    #[test]
    fn status_lines_are_found() {
        assert_eq!(status_of(b"NATS/1.0\r\nA: b\r\n\r\n"), None);
        assert_eq!(status_of(b"NATS/1.0 503\r\n\r\n").as_deref(), Some("503"));
    }
}
