//! How far an Iceberg table (`[[tables]]`) trails its stream under a sustained load,
//! and what the table writer costs the server:
//!
//!     cargo bench --bench table_lag
//!     RATE=50000 SECS=60 COMMIT_SECS=10 cargo bench --bench table_lag
//!
//! Starts the release `canopy` binary on a fresh folder twice with its default
//! config: once with a table over `bench.t.*` committing every COMMIT_SECS, once
//! without. Each run, 4 async-nats connections publish RATE msgs/s in all (JetStream
//! publishes, each acked after it is durable; 1,000 subjects, 10-field JSON
//! documents) for SECS seconds, and every 250 ms the bench opens the table's catalog
//! (the iceberg crate, as a reader would) and reads the committed offset. The lag of
//! a sample is the time since the newest message the table holds was acked. Prints
//! the lag's median, p99 and maximum after the first commit, when the table held
//! every message after the load, and server CPU per message with and without it.
//!
//! `TABLE_ONLY=1` skips the run without the table; `KEEP=1` keeps the table's folder
//! (its path is printed) for `benches/table_query.py` to query.

mod support;

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use iceberg::{Catalog, TableIdent};
use parking_lot::Mutex;
use serde_json::json;
use support::{cpu_secs, env_u64, free_port};

const SUBJECTS: u64 = 1_000;
const PUBLISHERS: u64 = 4;

fn payload(seq: u64) -> bytes::Bytes {
    json!({
        "device": format!("sensor-{}", seq % SUBJECTS), "seq": seq,
        "temp": 20.0 + (seq % 100) as f64 / 10.0, "humidity": 40.5, "unit": "C",
        "ok": true, "battery": seq % 100, "firmware": "1.12.3", "site": "north-hall-2",
        "tags": ["roof", "east"]
    })
    .to_string()
    .into()
}

/// Offset → when its ack came, for the lag.
type Acked = Arc<Mutex<Vec<(u64, Instant)>>>;

async fn publisher(url: String, index: u64, rate: u64, secs: u64, acked: Acked) {
    let client = async_nats::connect(&url).await.expect("connects");
    let js = jetstream::new(client);
    let per_tick = (rate / PUBLISHERS / 100).max(1);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut pending = FuturesUnordered::new();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut seq = index;
    while Instant::now() < end {
        tick.tick().await;
        for _ in 0..per_tick {
            // async-nats holds a publish until earlier acks are taken: keep a bound.
            while pending.len() >= 512 {
                if let Some(ack) = pending.next().await {
                    let ack: Result<jetstream::publish::PublishAck, _> = ack;
                    acked
                        .lock()
                        .push((ack.expect("acked").sequence, Instant::now()));
                }
            }
            let future = js
                .publish(format!("bench.t.{}", seq % SUBJECTS), payload(seq))
                .await
                .expect("published");
            pending.push(future.into_future());
            seq += PUBLISHERS;
        }
        while let Some(Some(ack)) = futures::FutureExt::now_or_never(pending.next()) {
            let ack = ack.expect("acked");
            acked.lock().push((ack.sequence, Instant::now()));
        }
    }
    while let Some(ack) = pending.next().await {
        acked
            .lock()
            .push((ack.expect("acked").sequence, Instant::now()));
    }
}

async fn committed(catalog: &dyn Catalog, ident: &TableIdent) -> u64 {
    let Ok(table) = catalog.load_table(ident).await else {
        return 0;
    };
    table
        .metadata()
        .current_snapshot()
        .and_then(|s| {
            s.summary()
                .additional_properties
                .get("canopy.committed-offset")
                .cloned()
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

struct Outcome {
    cpu_per_msg_us: f64,
    lags: Vec<f64>,
    caught_up_after: Option<f64>,
    msgs: usize,
}

async fn run(with_table: bool, rate: u64, secs: u64, commit_secs: u64) -> Outcome {
    let dir = tempfile::tempdir().expect("tempdir");
    let tables = dir.path().join("tables");
    let dir = if with_table && env_u64("KEEP", 0) == 1 {
        let kept = dir.keep();
        println!(
            "the table's folder is kept: {}",
            kept.join("tables").display()
        );
        Kept::Path(kept)
    } else {
        Kept::Temp(dir)
    };
    let config = dir.path().join("canopy.toml");
    let text = if with_table {
        format!(
            "[[tables]]\npattern = \"bench.t.*\"\ntable = \"bench.t\"\ncolumns = [\"n\"]\n\
             commit_secs = {commit_secs}\nfolder = \"{}\"\n",
            tables.display()
        )
    } else {
        String::new()
    };
    std::fs::write(&config, text).expect("config");
    let native = free_port();
    let server = tokio::process::Command::new(env!("CARGO_BIN_EXE_canopy"))
        .args(["serve", "--listen", &format!("127.0.0.1:{native}")])
        .args([
            "--http-listen",
            "127.0.0.1:0",
            "--mqtt-listen",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(&config)
        .env(
            "CANOPY_STORE__URL",
            format!("file://{}", dir.path().join("store").display()),
        )
        .env_remove("CANOPY_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("canopy starts");
    let pid = server.id().expect("pid");
    let url = format!("127.0.0.1:{native}");
    for _ in 0..100 {
        if async_nats::connect(&url).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The documents' schema, bound in both runs, so the table has typed columns and
    // both pay the same check.
    let client = async_nats::connect(&url).await.expect("connects");
    let schema = json!({"type": "object", "properties": {
        "device": {"type": "string"}, "seq": {"type": "integer"}, "temp": {"type": "number"},
        "humidity": {"type": "number"}, "unit": {"enum": ["C", "F"]}, "ok": {"type": "boolean"},
        "battery": {"type": "integer"}, "firmware": {"type": "string"}, "site": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}}
    }, "required": ["device", "seq", "temp"]});
    let put = json!({"pattern": "bench.t.*", "schema": schema});
    client
        .request("$CANOPY.schema.put", put.to_string().into())
        .await
        .expect("schema bound");
    let acked: Acked = Arc::default();
    let cpu = cpu_secs(pid);
    let publishers: Vec<_> = (0..PUBLISHERS)
        .map(|i| tokio::spawn(publisher(url.clone(), i, rate, secs, Arc::clone(&acked))))
        .collect();
    let mut lags = Vec::new();
    let mut caught_up_after = None;
    let catalog = if with_table {
        // Made by the server at its first commit; opened here once it exists.
        let mut catalog = None;
        for _ in 0..(secs * 4 + 200) {
            if tables.join("catalog.db").exists() {
                catalog = canopy::tables::writer::open_catalog(&tables).await.ok();
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        catalog
    } else {
        None
    };
    let ident = TableIdent::from_strs(["bench", "t"]).expect("ident");
    let started = Instant::now();
    let mut done = false;
    while !done {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let finished = publishers.iter().all(|p| p.is_finished());
        let Some(catalog) = &catalog else {
            done = finished;
            continue;
        };
        let offset = committed(catalog, &ident).await;
        let now = Instant::now();
        let acks = acked.lock();
        if offset > 0
            && let Some((_, at)) = acks.iter().find(|(o, _)| *o == offset)
        {
            lags.push(now.duration_since(*at).as_secs_f64());
        }
        let newest = acks.iter().map(|(o, _)| *o).max().unwrap_or(0);
        if finished && offset >= newest && newest > 0 {
            caught_up_after = Some(started.elapsed().as_secs_f64() - secs as f64);
            done = true;
        }
        if started.elapsed() > Duration::from_secs(secs * 2 + 120) {
            done = true;
        }
    }
    for p in publishers {
        p.await.expect("publisher");
    }
    let msgs = acked.lock().len();
    let cpu = cpu_secs(pid) - cpu;
    drop(server);
    Outcome {
        cpu_per_msg_us: cpu * 1e6 / msgs as f64,
        lags,
        caught_up_after,
        msgs,
    }
}

/// The run's folder: removed afterwards, or kept for queries.
enum Kept {
    Temp(tempfile::TempDir),
    Path(std::path::PathBuf),
}

impl Kept {
    fn path(&self) -> &std::path::Path {
        match self {
            Kept::Temp(dir) => dir.path(),
            Kept::Path(path) => path,
        }
    }
}

fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let rate = env_u64("RATE", 50_000);
    let secs = env_u64("SECS", 30);
    let commit_secs = env_u64("COMMIT_SECS", 10);
    let without = if env_u64("TABLE_ONLY", 0) == 1 {
        Outcome {
            cpu_per_msg_us: f64::NAN,
            lags: Vec::new(),
            caught_up_after: None,
            msgs: 0,
        }
    } else {
        run(false, rate, secs, commit_secs).await
    };
    let with = run(true, rate, secs, commit_secs).await;
    println!(
        "{rate} msgs/s for {secs} s, commits every {commit_secs} s: {} and {} messages acked",
        without.msgs, with.msgs
    );
    println!(
        "table lag: median {:.2} s, p99 {:.2} s, max {:.2} s over {} samples; every message in the table {} after the load",
        quantile(&with.lags, 0.5),
        quantile(&with.lags, 0.99),
        quantile(&with.lags, 1.0),
        with.lags.len(),
        with.caught_up_after
            .map_or(format!("never (within {} s)", secs * 2 + 120), |s| format!(
                "{s:.1} s"
            )),
    );
    println!(
        "server CPU per message: {:.2} µs without the table, {:.2} µs with it ({:+.2} µs)",
        without.cpu_per_msg_us,
        with.cpu_per_msg_us,
        with.cpu_per_msg_us - without.cpu_per_msg_us
    );
}
