//! Every acknowledged message survives `kill -9`: the real `canopy` binary, publishers
//! at full speed, a SIGKILL mid-stream, a restart on the same folder, and a replay of
//! everything.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

use crate::common::{WAIT, canopy_serve, header, list_subjects, replay_subject};

const PUBLISHERS: usize = 4;
const IN_FLIGHT: usize = 32;
const SUBJECTS: usize = 16;
/// Acks after which the server is killed, publishers still going.
const KILL_AFTER_ACKS: usize = 5_000;

/// Kills the process by PID when dropped (a failing test leaves no server behind).
struct KillGuard(Option<u32>);

impl KillGuard {
    fn kill(&mut self) {
        if let Some(pid) = self.0.take() {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
    }
}

impl Drop for KillGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `canopy serve` on a free port with its store in `data`.
pub(crate) struct Serve {
    child: Child,
    guard: KillGuard,
    pub(crate) url: String,
    log: tokio::task::JoinHandle<Vec<String>>,
    /// What it logged before it listened.
    pub(crate) startup: Vec<String>,
}

impl Serve {
    pub(crate) async fn start(data: &Path) -> Serve {
        Serve::start_with(data, None).await
    }

    /// [`Serve::start`] with a configuration file too.
    pub(crate) async fn start_with(data: &Path, config: Option<&Path>) -> Serve {
        let mut command = canopy_serve("127.0.0.1:0");
        if let Some(config) = config {
            command.arg("--config").arg(config);
        }
        let mut child = command
            .env("CANOPY_STORE__URL", format!("file://{}", data.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("canopy serve starts");
        let guard = KillGuard(child.id());
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let mut seen = Vec::new();
        let url = tokio::time::timeout(WAIT, async {
            while let Some(line) = lines.next_line().await.expect("read log") {
                if line.contains("listening") && line.contains("native") {
                    let addr = line
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("addr="))
                        .expect("addr in the listening line");
                    return format!("nats://{addr}");
                }
                seen.push(line);
            }
            panic!("canopy serve exited before listening: {seen:#?}");
        })
        .await
        .expect("canopy serve listens");
        // Keep draining the log so the server never blocks on a full pipe.
        let log = tokio::spawn(async move {
            let mut rest = Vec::new();
            while let Ok(Some(line)) = lines.next_line().await {
                rest.push(line);
            }
            rest
        });
        Serve {
            child,
            guard,
            url,
            log,
            startup: seen,
        }
    }

    /// SIGKILL, and wait until the process is gone (its folder lock with it).
    pub(crate) async fn kill_9(mut self) {
        let pid = self.guard.0.expect("running");
        let status = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -9 {pid}");
        self.guard.0 = None;
        let exit = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the killed server exits")
            .expect("wait");
        assert!(!exit.success(), "killed, not exited: {exit}");
        self.log.abort();
    }
}

/// What the store acknowledged for one publish.
#[derive(Debug, Clone)]
struct Acked {
    subject: String,
    version: u64,
    offset: u64,
    payload: String,
}

/// Publishes with `Canopy-Ack: durable` from one connection, `IN_FLIGHT` at a time,
/// recording every ack, until the task is aborted or the connection fails.
async fn publisher(
    url: String,
    id: usize,
    acked: Arc<Mutex<Vec<Acked>>>,
    total: Arc<AtomicUsize>,
    threshold: Arc<tokio::sync::Notify>,
) {
    let client = async_nats::ConnectOptions::new()
        .max_reconnects(Some(0))
        .connect(url)
        .await
        .expect("connect");
    let mut pending = FuturesUnordered::new();
    let mut next = 0usize;
    loop {
        while pending.len() < IN_FLIGHT {
            let subject = format!("crash.s{:02}", (next * 7 + id) % SUBJECTS);
            let payload = format!("p{id}-{next}");
            next += 1;
            let client = client.clone();
            pending.push(async move {
                let reply = client
                    .request_with_headers(
                        subject.clone(),
                        header("Canopy-Ack", "durable"),
                        payload.clone().into(),
                    )
                    .await;
                (subject, payload, reply)
            });
        }
        let Some((subject, payload, reply)) = pending.next().await else {
            return;
        };
        let Ok(reply) = reply else {
            // The server is gone: what was not acked does not count.
            return;
        };
        let ack: serde_json::Value = serde_json::from_slice(&reply.payload)
            .unwrap_or_else(|e| panic!("ack is JSON ({e}): {:?}", reply.payload));
        assert!(ack.get("error").is_none(), "error ack: {ack}");
        assert_eq!(ack["subject"], subject.as_str(), "{ack}");
        acked.lock().expect("ack log").push(Acked {
            subject,
            version: ack["version"].as_u64().expect("version"),
            offset: ack["seq"].as_u64().expect("seq"),
            payload,
        });
        if total.fetch_add(1, Ordering::SeqCst) + 1 == KILL_AFTER_ACKS {
            threshold.notify_one();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acked_message_survives_kill_9() {
    let folder = tempfile::tempdir().expect("tempdir");
    acked_messages_survive_kill_9(folder.path(), None).await;
}

/// The engine's own log is flushed only when a journal file fills (1 MiB here, so
/// often): what the last files hold is only in the journal when the server dies, and
/// the restarted server must write it to the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acked_message_survives_kill_9_when_only_the_journal_holds_it() {
    let folder = tempfile::tempdir().expect("tempdir");
    let config = folder.path().join("canopy.toml");
    std::fs::write(
        &config,
        "[store]\nflush_interval_ms = 600000\njournal_mb = 1\n",
    )
    .expect("config");
    let restarted = acked_messages_survive_kill_9(folder.path(), Some(&config)).await;
    assert!(
        restarted
            .iter()
            .any(|line| line.contains("wrote the journal's rounds the engine did not hold")),
        "the restarted server replayed the journal: {restarted:#?}"
    );
}

/// Publishes until `KILL_AFTER_ACKS` acks, kills the server, restarts it and checks
/// every acked message; returns what the restarted server logged as it started.
async fn acked_messages_survive_kill_9(folder: &Path, config: Option<&Path>) -> Vec<String> {
    let data = folder.join("data");
    let server = Serve::start_with(&data, config).await;

    let acked = Arc::new(Mutex::new(Vec::new()));
    let total = Arc::new(AtomicUsize::new(0));
    let threshold = Arc::new(tokio::sync::Notify::new());
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|id| {
            tokio::spawn(publisher(
                server.url.clone(),
                id,
                Arc::clone(&acked),
                Arc::clone(&total),
                Arc::clone(&threshold),
            ))
        })
        .collect();
    tokio::time::timeout(WAIT * 3, threshold.notified())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{KILL_AFTER_ACKS} acks within the wait (got {})",
                total.load(Ordering::SeqCst)
            )
        });
    for p in &publishers {
        assert!(
            !p.is_finished(),
            "publishers are still going when the server is killed"
        );
    }
    server.kill_9().await;
    for p in publishers {
        p.abort();
        if let Err(e) = p.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let acked = std::mem::take(&mut *acked.lock().expect("ack log"));
    assert!(acked.len() >= KILL_AFTER_ACKS, "{} acks", acked.len());

    let server = Serve::start_with(&data, config).await;
    let client = async_nats::connect(&server.url).await.expect("connect");
    let heads = list_subjects(&client, "crash.>").await;
    let mut stored: BTreeMap<String, Vec<crate::common::Stored>> = BTreeMap::new();
    for head in &heads {
        let subject = head["subject"].as_str().expect("subject").to_owned();
        let messages = replay_subject(&client, &subject).await;
        assert_eq!(
            head["version"].as_u64(),
            messages.last().map(|m| m.version),
            "the listed head of {subject} is its last replayed version"
        );
        stored.insert(subject, messages);
    }

    // Versions contiguous from 1, offsets increasing with versions, each offset and
    // each payload once in the whole store.
    let mut offsets = HashSet::new();
    let mut payloads = HashSet::new();
    for (subject, messages) in &stored {
        for (i, m) in messages.iter().enumerate() {
            assert_eq!(m.subject, *subject);
            assert_eq!(
                m.version,
                i as u64 + 1,
                "{subject}: versions contiguous from 1"
            );
            assert!(offsets.insert(m.offset), "offset {} stored twice", m.offset);
            assert!(
                payloads.insert(m.text()),
                "payload {} stored twice",
                m.text()
            );
        }
        assert!(
            messages.windows(2).all(|w| w[0].offset < w[1].offset),
            "{subject}: offsets increase in version order"
        );
    }

    // Every acked message is there with its acked version, offset and payload.
    let mut by_subject: HashMap<&str, usize> = HashMap::new();
    for a in &acked {
        let messages = stored
            .get(&a.subject)
            .unwrap_or_else(|| panic!("acked subject {} lost", a.subject));
        let m = messages
            .get(a.version as usize - 1)
            .unwrap_or_else(|| panic!("acked {a:?} lost: {} versions stored", messages.len()));
        assert_eq!(
            (m.version, m.offset, m.text()),
            (a.version, a.offset, a.payload.clone()),
            "acked {a:?}"
        );
        *by_subject.entry(a.subject.as_str()).or_default() += 1;
    }
    assert_eq!(
        by_subject.len(),
        SUBJECTS,
        "every subject got acked messages"
    );

    // The restarted server carries on where the store ended.
    let last = stored
        .values()
        .flatten()
        .map(|m| m.offset)
        .max()
        .expect("stored");
    let subject = "crash.s00";
    let ack = crate::common::publish_acked(&client, subject, "after restart").await;
    assert_eq!(
        ack["version"].as_u64(),
        Some(stored[subject].len() as u64 + 1),
        "{ack}"
    );
    assert!(ack["seq"].as_u64().expect("seq") > last, "{ack}");
    drop(client);
    let startup = server.startup.clone();
    server.kill_9().await;
    startup
}

#[tokio::test]
async fn a_second_canopy_serve_on_the_same_folder_refuses_and_says_why() {
    let folder = tempfile::tempdir().expect("tempdir");
    let data = folder.path().join("data");
    let first = Serve::start(&data).await;
    let client = async_nats::connect(&first.url).await.expect("connect");
    let before = crate::common::publish_acked(&client, "lock.x", "before").await;

    let second = tokio::time::timeout(
        WAIT,
        canopy_serve("127.0.0.1:0")
            .env("CANOPY_STORE__URL", format!("file://{}", data.display()))
            .output(),
    )
    .await
    .expect("the second server exits on its own")
    .expect("runs");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "second server: {stderr}");
    assert!(stderr.contains("another canopy process"), "{stderr}");

    let after = crate::common::publish_acked(&client, "lock.x", "after").await;
    assert_eq!(
        after["version"].as_u64(),
        before["version"].as_u64().map(|v| v + 1)
    );
    drop(client);
    first.kill_9().await;
}
