//! Starting servers for tests and talking raw bytes to them.

use std::net::SocketAddr;
use std::time::Duration;

use canopy::config::Config;
use canopy::server::{RunningServer, Server};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Long enough for a loaded 2-core CI machine, short enough to fail a hung test.
pub const WAIT: Duration = Duration::from_secs(10);

/// Runs `check` until it gives a value, sleeping a little between tries, and returns
/// that value; panics naming `what` if `deadline` passes first. For what the server
/// does in its own time (a flush, an expiry, a closed connection noticed): a test
/// waits for what it can observe, never a fixed guess of how long that takes.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{what}: not within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `canopy serve --listen <listen>` with its MQTT listener on a free loopback port,
/// `RUST_LOG` unset (the log lines tests read are the binary's defaults), stdin closed,
/// killed if dropped: add flags, environment and output handling, then spawn.
pub fn canopy_serve(listen: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_canopy"));
    command
        .args([
            "serve",
            "--listen",
            listen,
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    command
}

/// A config on a free loopback port.
/// The store backend the durable tests run on: `CANOPY_TEST_BACKEND` = `memory`
/// (the default), `file` or `s3` (then `CANOPY_TEST_S3_ENDPOINT` names a running
/// S3-compatible server with a bucket `canopy-tests`; scripts/test-all.sh starts
/// moto's for it and runs the durable tests once per backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    File,
    S3,
}

pub fn backend() -> Backend {
    match std::env::var("CANOPY_TEST_BACKEND").as_deref() {
        Ok("file") => Backend::File,
        Ok("s3") => Backend::S3,
        Ok("memory") | Err(_) => Backend::Memory,
        Ok(other) => panic!("CANOPY_TEST_BACKEND={other}: use memory, file or s3"),
    }
}

/// A fresh, unique name for a store location.
fn unique() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// Points `config` at the test S3 server, under `prefix`.
pub fn use_s3(config: &mut Config, prefix: &str) {
    let endpoint = std::env::var("CANOPY_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "CANOPY_TEST_S3_ENDPOINT is not set: run ./scripts/test-all.sh, which starts an \
             S3-compatible server (moto) for the S3 tests"
        )
    });
    config.store.url = format!("s3://canopy-tests/{prefix}");
    config.store.s3.endpoint = Some(endpoint);
    config.store.s3.region = Some("us-east-1".into());
    config.store.s3.access_key_id = Some("test".into());
    config.store.s3.secret_access_key = Some("test".into());
    config.store.s3.allow_http = true;
    config.store.s3.path_style = true;
}

/// The environment of a `canopy serve` process on the test S3 server, under `prefix`.
pub fn s3_env(prefix: &str) -> Vec<(String, String)> {
    let endpoint = std::env::var("CANOPY_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "CANOPY_TEST_S3_ENDPOINT is not set: run ./scripts/test-all.sh, which starts an \
             S3-compatible server (moto) for the S3 tests"
        )
    });
    [
        ("CANOPY_STORE__URL", format!("s3://canopy-tests/{prefix}")),
        ("CANOPY_STORE__S3__ENDPOINT", endpoint),
        ("CANOPY_STORE__S3__REGION", "us-east-1".into()),
        ("CANOPY_STORE__S3__ACCESS_KEY_ID", "test".into()),
        ("CANOPY_STORE__S3__SECRET_ACCESS_KEY", "test".into()),
        ("CANOPY_STORE__S3__ALLOW_HTTP", "true".into()),
        ("CANOPY_STORE__S3__PATH_STYLE", "true".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// A config on a free loopback port, with a fresh store on the test backend.
pub fn test_config() -> Config {
    let mut config = Config::default();
    config.native.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.mqtt.listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    config.http.listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    match backend() {
        Backend::Memory => config.store.url = "memory://".into(),
        Backend::File => {
            // Under target/, which scripts/test-all.sh clears.
            let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("target/test-stores")
                .join(unique());
            config.store.url = format!("file://{}", folder.display());
        }
        Backend::S3 => use_s3(&mut config, &unique()),
    }
    config
}

pub async fn start(config: Config) -> RunningServer {
    Server::bind(config).await.expect("server binds").spawn()
}

pub async fn start_default() -> RunningServer {
    start(test_config()).await
}

/// A raw protocol connection that reads line by line.
pub struct Raw {
    reader: BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
}

impl Raw {
    /// Connects and consumes the INFO line.
    pub async fn connect(addr: SocketAddr) -> Raw {
        Self::with_stream(TcpStream::connect(addr).await.expect("connect")).await
    }

    /// Connects with a tiny receive buffer, so the kernel absorbs little of what the
    /// server sends while the test does not read.
    pub async fn connect_small_buffer(addr: SocketAddr) -> Raw {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("rcvbuf");
        Self::with_stream(socket.connect(addr).await.expect("connect")).await
    }

    async fn with_stream(stream: TcpStream) -> Raw {
        let (read, writer) = stream.into_split();
        let mut raw = Raw {
            reader: BufReader::new(read),
            writer,
        };
        let info = raw.line().await;
        assert!(info.starts_with("INFO {"), "first line: {info}");
        raw
    }

    pub async fn send(&mut self, bytes: &str) {
        self.writer
            .write_all(bytes.as_bytes())
            .await
            .expect("write");
    }

    /// The next line without its line ending; panics on EOF or timeout.
    pub async fn line(&mut self) -> String {
        self.try_line().await.expect("a line before EOF")
    }

    /// The next line, or `None` at EOF.
    pub async fn try_line(&mut self) -> Option<String> {
        let mut line = String::new();
        let n = tokio::time::timeout(WAIT, self.reader.read_line(&mut line))
            .await
            .expect("line within the wait")
            .ok()?;
        if n == 0 {
            return None;
        }
        Some(line.trim_end_matches(['\r', '\n']).to_owned())
    }

    /// Reads exactly `n` bytes (a payload and its CRLF).
    pub async fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        tokio::time::timeout(WAIT, self.reader.read_exact(&mut buf))
            .await
            .expect("bytes within the wait")
            .expect("read");
        buf
    }

    /// Sends PING and expects PONG: the connection is open and caught up.
    pub async fn ping_pong(&mut self) {
        self.send("PING\r\n").await;
        assert_eq!(self.line().await, "PONG");
    }

    /// Sends PING and expects exactly `lines`, then PONG.
    pub async fn ping_pong_after_msgs(&mut self, lines: &[&str]) {
        self.send("PING\r\n").await;
        for expected in lines {
            assert_eq!(self.line().await, *expected);
        }
        assert_eq!(self.line().await, "PONG");
    }

    /// Asserts the server closes the connection next.
    pub async fn expect_eof(&mut self) {
        assert_eq!(self.try_line().await, None, "expected the server to close");
    }
}

// ---------------------------------------------------------------------------------
// Durable key streams: helpers shared by `durable.rs` and `crash.rs`.

/// [`test_config`] with the store in a local folder (for restart tests).
/// A config whose store outlives the server, for restart tests: the folder itself,
/// or on the S3 backend a prefix named after it.
pub fn file_config(folder: &std::path::Path) -> Config {
    let mut config = test_config();
    match backend() {
        Backend::S3 => {
            let name = folder
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(unique);
            use_s3(&mut config, &name);
        }
        Backend::Memory | Backend::File => {
            config.store.url = format!("file://{}", folder.display());
        }
    }
    config
}

/// A config on a local folder whatever the backend: for what only folders have.
pub fn local_folder_config(folder: &std::path::Path) -> Config {
    let mut config = test_config();
    config.store.url = format!("file://{}", folder.display());
    config
}

/// Headers with one entry.
pub fn header(name: &str, value: &str) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(name, value);
    headers
}

/// Publishes with a reply subject and `headers` and parses the store's JSON answer.
pub async fn store_request(
    client: &async_nats::Client,
    subject: &str,
    headers: async_nats::HeaderMap,
    payload: impl Into<bytes::Bytes>,
) -> serde_json::Value {
    let reply = tokio::time::timeout(
        WAIT,
        client.request_with_headers(subject.to_owned(), headers, payload.into()),
    )
    .await
    .unwrap_or_else(|_| panic!("an ack for {subject} within the wait"))
    .unwrap_or_else(|e| panic!("request to {subject}: {e}"));
    serde_json::from_slice(&reply.payload).unwrap_or_else(|e| {
        panic!(
            "ack for {subject} is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&reply.payload)
        )
    })
}

/// Publishes with `Canopy-Ack: durable` and returns the ack; panics on an error ack.
pub async fn publish_acked(
    client: &async_nats::Client,
    subject: &str,
    payload: impl Into<bytes::Bytes>,
) -> serde_json::Value {
    let ack = store_request(client, subject, header("Canopy-Ack", "durable"), payload).await;
    assert!(ack.get("error").is_none(), "error ack for {subject}: {ack}");
    ack
}

/// The value of header `name`, if the message has it.
pub fn header_of<'a>(message: &'a async_nats::Message, name: &str) -> Option<&'a str> {
    message
        .headers
        .as_ref()
        .and_then(|h| h.get(name))
        .map(|v| v.as_str())
}

fn number_header(message: &async_nats::Message, name: &str) -> u64 {
    let value = header_of(message, name)
        .unwrap_or_else(|| panic!("header {name} missing: {:?}", message.headers));
    value
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("header {name} is not a number: {value:?}"))
}

/// Panics with the API's error if `message` is one (no responders, or `Canopy-Status`).
pub fn assert_not_api_error(api: &str, message: &async_nats::Message) {
    assert_ne!(
        message.status,
        Some(async_nats::StatusCode::NO_RESPONDERS),
        "no responders for {api}: the $CANOPY. API is not answering"
    );
    if let Some(status) = header_of(message, "Canopy-Status") {
        panic!(
            "{api} answered status {status}: {}",
            String::from_utf8_lossy(&message.payload)
        );
    }
}

/// One stored message as `$CANOPY.get` and `$CANOPY.replay` return it.
#[derive(Debug, Clone)]
pub struct Stored {
    pub subject: String,
    pub version: u64,
    pub offset: u64,
    pub time_ms: u64,
    pub payload: bytes::Bytes,
    pub headers: Option<async_nats::HeaderMap>,
}

impl Stored {
    pub fn from_message(message: &async_nats::Message) -> Stored {
        Stored {
            subject: header_of(message, "Canopy-Subject")
                .unwrap_or_else(|| panic!("Canopy-Subject missing: {:?}", message.headers))
                .to_owned(),
            version: number_header(message, "Canopy-Version"),
            offset: number_header(message, "Canopy-Offset"),
            time_ms: number_header(message, "Canopy-Time"),
            payload: message.payload.clone(),
            headers: message.headers.clone(),
        }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.payload).into_owned()
    }
}

/// One answer of `$CANOPY.replay`: its messages and the final `Canopy-Done` message.
#[derive(Debug)]
pub struct ReplayPage {
    pub messages: Vec<Stored>,
    pub cursor: u64,
    pub caught_up: bool,
    pub count: u64,
}

/// Sends a `$CANOPY.replay` request; the answer arrives on the returned subscription
/// (read it with [`replay_collect`]). The request has reached the server when this
/// returns (flush).
pub async fn replay_start(
    client: &async_nats::Client,
    body: &serde_json::Value,
) -> async_nats::Subscriber {
    let inbox = client.new_inbox();
    let sub = client
        .subscribe(inbox.clone())
        .await
        .expect("subscribe inbox");
    client
        .publish_with_reply("$CANOPY.replay", inbox, body.to_string().into())
        .await
        .expect("publish replay request");
    client.flush().await.expect("flush");
    sub
}

/// Reads one replay answer up to its `Canopy-Done` message.
pub async fn replay_collect(sub: &mut async_nats::Subscriber) -> ReplayPage {
    use futures::StreamExt;
    let mut messages = Vec::new();
    loop {
        let message = tokio::time::timeout(WAIT, sub.next())
            .await
            .expect("replay answers within the wait")
            .expect("inbox open");
        assert_not_api_error("$CANOPY.replay", &message);
        if header_of(&message, "Canopy-Done") == Some("true") {
            let page = ReplayPage {
                cursor: number_header(&message, "Canopy-Cursor"),
                caught_up: match header_of(&message, "Canopy-Caught-Up") {
                    Some("true") => true,
                    Some("false") => false,
                    other => panic!("Canopy-Caught-Up must be true or false, got {other:?}"),
                },
                count: number_header(&message, "Canopy-Count"),
                messages,
            };
            assert_eq!(
                page.count,
                page.messages.len() as u64,
                "Canopy-Count matches the messages sent"
            );
            return page;
        }
        messages.push(Stored::from_message(&message));
    }
}

/// One `$CANOPY.replay` request and its answer.
pub async fn replay_page(client: &async_nats::Client, body: &serde_json::Value) -> ReplayPage {
    let mut sub = replay_start(client, body).await;
    replay_collect(&mut sub).await
}

/// Every message `body` selects, following cursors until caught up.
pub async fn replay_all(client: &async_nats::Client, body: serde_json::Value) -> Vec<Stored> {
    let mut body = body;
    let mut all = Vec::new();
    for _ in 0..100_000 {
        let page = replay_page(client, &body).await;
        let progressed = !page.messages.is_empty();
        all.extend(page.messages);
        if page.caught_up {
            return all;
        }
        assert!(progressed, "a page that is not caught up returned nothing");
        if let Some(map) = body.as_object_mut() {
            map.remove("from");
            map.insert("cursor".into(), page.cursor.into());
        }
    }
    panic!("replay never caught up");
}

/// Every stored message of one subject, in version order.
pub async fn replay_subject(client: &async_nats::Client, subject: &str) -> Vec<Stored> {
    replay_all(client, serde_json::json!({"subject": subject, "max": 1000})).await
}

/// The payloads of every stored message of one subject, as text, in version order.
pub async fn replay_texts(client: &async_nats::Client, subject: &str) -> Vec<String> {
    replay_subject(client, subject)
        .await
        .iter()
        .map(Stored::text)
        .collect()
}

/// One `$CANOPY.subjects` page: the parsed JSON reply.
pub async fn subjects_page(
    client: &async_nats::Client,
    body: &serde_json::Value,
) -> serde_json::Value {
    let reply = tokio::time::timeout(
        WAIT,
        client.request("$CANOPY.subjects", body.to_string().into()),
    )
    .await
    .expect("$CANOPY.subjects answers within the wait")
    .unwrap_or_else(|e| panic!("$CANOPY.subjects: {e}"));
    assert_not_api_error("$CANOPY.subjects", &reply);
    serde_json::from_slice(&reply.payload).unwrap_or_else(|e| {
        panic!(
            "$CANOPY.subjects reply is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&reply.payload)
        )
    })
}

/// Every subject matching `pattern` (as the `subjects` entries), following `next`.
pub async fn list_subjects(client: &async_nats::Client, pattern: &str) -> Vec<serde_json::Value> {
    let mut body = serde_json::json!({"pattern": pattern, "max": 1000});
    let mut all = Vec::new();
    for _ in 0..100_000 {
        let page = subjects_page(client, &body).await;
        all.extend(
            page["subjects"]
                .as_array()
                .unwrap_or_else(|| panic!("`subjects` is a list: {page}"))
                .iter()
                .cloned(),
        );
        match &page["next"] {
            serde_json::Value::Null => return all,
            next => body["after"] = next.clone(),
        }
    }
    panic!("subject listing never ended");
}

/// An API answer's `Canopy-Status`, 200 when it has none.
pub fn status_of(answer: &async_nats::Message) -> u16 {
    answer
        .headers
        .as_ref()
        .and_then(|h| h.get("Canopy-Status"))
        .and_then(|v| v.as_str().parse().ok())
        .unwrap_or(200)
}

/// Calls `$CANOPY.<api>`; returns the status (200 when the answer has none) and the
/// body, which must never hold a password hash.
pub async fn api(
    client: &async_nats::Client,
    api: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let answer = tokio::time::timeout(
        WAIT,
        client.request(format!("$CANOPY.{api}"), body.to_string().into()),
    )
    .await
    .expect("answered in time")
    .expect("answered");
    let status = status_of(&answer);
    let text = String::from_utf8_lossy(&answer.payload).into_owned();
    assert!(
        !text.contains("$argon2"),
        "a password hash was answered: {text}"
    );
    (status, serde_json::from_str(&text).expect("JSON answer"))
}

/// Issues a bearer token for user `name` of `tenant` through `$CANOPY.user.token.create`.
pub async fn issue_token(client: &async_nats::Client, tenant: &str, name: &str) -> String {
    let (status, issued) = api(
        client,
        "user.token.create",
        serde_json::json!({"tenant": tenant, "name": name}),
    )
    .await;
    assert_eq!(status, 200, "{issued}");
    issued["token"]
        .as_str()
        .unwrap_or_else(|| panic!("a token in {issued}"))
        .to_owned()
}

/// Sends one HTTP/1.1 request with a (JSON) body; returns the status code and the body.
pub async fn http_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut response),
    )
    .await
    .expect("answered in time")
    .expect("read");
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Publishes a request without store headers to `subject` and then an acked marker to
/// `marker`, both with one inbox as their reply subject, and returns what arrived there
/// until an answer (`pong:…`, from a service) and an ack came: the answers and the
/// acks. Acks leave in sequence order, so an ack for the request would come before the
/// marker's.
pub async fn request_then_marker(
    client: &async_nats::Client,
    subject: &str,
    payload: &str,
    marker: &str,
) -> (Vec<String>, Vec<String>) {
    use futures::StreamExt;
    let inbox = client.new_inbox();
    let mut replies = client.subscribe(inbox.clone()).await.expect("sub");
    client
        .publish_with_reply(subject.to_owned(), inbox.clone(), payload.to_owned().into())
        .await
        .expect("publish");
    client
        .publish_with_reply_and_headers(
            marker.to_owned(),
            inbox,
            header("Canopy-Ack", "durable"),
            "marker".into(),
        )
        .await
        .expect("publish");
    client.flush().await.expect("flush");
    let (mut answers, mut acks) = (Vec::new(), Vec::new());
    while answers.is_empty() || acks.is_empty() {
        let message = tokio::time::timeout(WAIT, replies.next())
            .await
            .expect("replies within the wait")
            .expect("inbox open");
        let text = String::from_utf8_lossy(&message.payload).into_owned();
        if text.starts_with("pong:") {
            answers.push(text);
        } else {
            acks.push(text);
        }
    }
    // Nothing else comes: a second answer or ack would show here.
    let late = tokio::time::timeout(std::time::Duration::from_millis(300), replies.next()).await;
    assert!(late.is_err(), "a further reply arrived: {late:?}");
    (answers, acks)
}

/// Every `.rs` file under `dir`, for the tests that read the source.
pub fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The value of one sample line (`name{labels} value`) in a metrics page.
pub fn metric_sample(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// A JetStream publish into the tenant's own stream, which it names
/// (`Nats-Expected-Stream`): a plain request to a subject no declared stream holds is
/// answered "no responders", as in NATS. Returns the PubAck or the error ack.
pub async fn js_publish_to_tenant(
    js: &async_nats::jetstream::Context,
    tenant: &str,
    subject: impl Into<String>,
    payload: impl Into<bytes::Bytes>,
) -> Result<async_nats::jetstream::publish::PublishAck, async_nats::jetstream::context::PublishError>
{
    let subject = subject.into();
    let pending = tokio::time::timeout(
        WAIT,
        js.publish_with_headers(
            subject.clone(),
            header("Nats-Expected-Stream", tenant),
            payload.into(),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("{subject} sent within the wait"))?;
    tokio::time::timeout(WAIT, pending)
        .await
        .unwrap_or_else(|_| panic!("an ack for {subject} within the wait"))
}

/// Declares the stream `name` over one subject filter.
pub async fn declare_stream(
    js: &async_nats::jetstream::Context,
    name: &str,
    filter: &str,
) -> async_nats::jetstream::stream::Stream {
    let config = async_nats::jetstream::stream::Config {
        name: name.into(),
        subjects: vec![filter.into()],
        ..Default::default()
    };
    tokio::time::timeout(WAIT, js.create_stream(config))
        .await
        .unwrap_or_else(|_| panic!("stream {name} declared within the wait"))
        .unwrap_or_else(|e| panic!("stream {name}: {e}"))
}

/// A JetStream publish to a subject a declared stream holds, acked.
pub async fn js_publish(js: &async_nats::jetstream::Context, subject: &str, payload: String) {
    let pending = js
        .publish(subject.to_owned(), payload.into())
        .await
        .unwrap_or_else(|e| panic!("{subject}: {e}"));
    tokio::time::timeout(WAIT, pending)
        .await
        .unwrap_or_else(|_| panic!("an ack for {subject} within the wait"))
        .unwrap_or_else(|e| panic!("{subject}: {e}"));
}
