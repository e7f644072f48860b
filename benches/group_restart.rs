//! A restart with thousands of idle consumer groups over a long history (issue 26):
//! what does it cost the machine, and does another tenant notice?
//!
//!     cargo bench --bench group_restart
//!     GROUP_COUNT=3000 SUBJECTS=20000 SECS=60 cargo bench --bench group_restart
//!     CANOPY_BIN=/path/to/an/older/canopy cargo bench --bench group_restart
//!
//! It starts the release `canopy` binary on free loopback ports (logins required, the
//! store on a fresh folder), creates tenants `acme` (room for GROUP_COUNT groups) and
//! `beta`, stores one message on each of SUBJECTS subjects of acme, creates GROUP_COUNT
//! groups over them (`start: new`, the default), stops the server with SIGTERM and
//! starts it again on the same folder. Then, with no client asking anything of the
//! groups, it measures for SECS seconds the server's CPU time (from /proc) and beta's
//! round trips (a `$CANOPY.get` every 100 ms), and at the end how long acme's first
//! `group.info` of one group takes. Prints one line of figures.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use support::{api, cpu_secs, env_u64, free_port};

async fn log_in(url: &str, user: &str, password: &str) -> async_nats::Client {
    for _ in 0..200 {
        let connected =
            async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
                .request_timeout(Some(Duration::from_secs(60)))
                .connect(url)
                .await;
        if let Ok(client) = connected {
            return client;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{user} could not log in to {url}");
}

/// The server's resident memory, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn serve(folder: &std::path::Path, native: u16) -> tokio::process::Child {
    // CANOPY_BIN runs another build (an older one, for comparison).
    let bin = std::env::var("CANOPY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_canopy").into());
    tokio::process::Command::new(bin)
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{native}"),
            "--http-listen",
            &format!("127.0.0.1:{}", free_port()),
            "--mqtt-listen",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .env("CANOPY_STORE__URL", format!("file://{}", folder.display()))
        .env("CANOPY_AUTHZ__REQUIRE_LOGIN", "true")
        .env("CANOPY_AUTHZ__BOOTSTRAP_ADMIN_PASSWORD", "admin-pw")
        .env_remove("CANOPY_CONFIG")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("canopy starts")
}

async fn stop(mut server: tokio::process::Child) {
    if let Some(pid) = server.id() {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    let _ = tokio::time::timeout(Duration::from_secs(60), server.wait()).await;
}

fn percentile(mut samples: Vec<f64>, p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let at = ((samples.len() - 1) as f64 * p).round() as usize;
    samples[at]
}

#[tokio::main]
async fn main() {
    let groups = env_u64("GROUP_COUNT", 3_000);
    let subjects = env_u64("SUBJECTS", 20_000);
    let secs = env_u64("SECS", 60);
    let dir = tempfile::tempdir().expect("tempdir");
    let native = free_port();
    let url = format!("127.0.0.1:{native}");

    let server = serve(dir.path(), native);
    let admin = log_in(&url, "admin", "admin-pw").await;
    let limits = json!({"name": "acme", "limits": {"max_groups": groups}});
    let created = admin
        .request("$CANOPY.tenant.create", limits.to_string().into())
        .await
        .expect("answered");
    if created.headers.is_some() {
        // A build from before per-tenant group limits: no limit to raise.
        api(&admin, "tenant.create", json!({"name": "acme"})).await;
    }
    api(&admin, "tenant.create", json!({"name": "beta"})).await;
    for tenant in ["acme", "beta"] {
        api(
            &admin,
            "user.create",
            json!({"tenant": tenant, "name": "app", "password": "pw"}),
        )
        .await;
    }
    let acme = log_in(&url, "app@acme", "pw").await;
    let beta = log_in(&url, "app@beta", "pw").await;
    for i in 0..subjects {
        acme.publish(format!("orders.{i}"), "x".into())
            .await
            .expect("publish");
        if i % 1_000 == 999 {
            // Bounded in flight: a request is answered after what came before it.
            api(&acme, "subjects", json!({"max": 1})).await;
        }
    }
    api(&beta, "subjects", json!({"max": 1})).await;
    beta.publish("beta.x", "1".into()).await.expect("publish");
    let created = Instant::now();
    for g in 0..groups {
        api(
            &acme,
            "group.create",
            json!({"name": format!("g{g}"), "pattern": "orders.>"}),
        )
        .await;
    }
    eprintln!(
        "{groups} groups created in {:.1} s over {subjects} subjects",
        created.elapsed().as_secs_f64()
    );
    drop((admin, acme, beta));
    stop(server).await;

    let restarted = Instant::now();
    let server = serve(dir.path(), native);
    let pid = server.id().expect("a pid");
    let beta = log_in(&url, "app@beta", "pw").await;
    let up = restarted.elapsed();
    let cpu_at_start = cpu_secs(pid);
    let watched = Instant::now();
    let mut round_trips = Vec::new();
    let mut slowest = Duration::ZERO;
    while watched.elapsed() < Duration::from_secs(secs) {
        let asked = Instant::now();
        let answered = tokio::time::timeout(
            Duration::from_secs(30),
            beta.request(
                "$CANOPY.get",
                json!({"subject": "beta.x"}).to_string().into(),
            ),
        )
        .await;
        let took = asked.elapsed();
        slowest = slowest.max(took);
        if answered.is_ok() {
            round_trips.push(took.as_secs_f64() * 1e3);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cpu = cpu_secs(pid) - cpu_at_start;
    let rss = rss_mib(pid);
    let acme = log_in(&url, "app@acme", "pw").await;
    let asked = Instant::now();
    api(&acme, "group.info", json!({"name": "g7"})).await;
    let info = asked.elapsed();
    println!(
        "restart with {groups} idle groups over {subjects} subjects: up and beta logged in \
         after {:.2} s; over the next {secs} s the server used {cpu:.2} s of CPU ({:.0}% of \
         one core), RSS {rss:.0} MiB; beta's get p50 {:.2} ms, p99 {:.2} ms, slowest {:.1} ms \
         ({} answered); acme's first group.info {:.1} ms",
        up.as_secs_f64(),
        cpu / secs as f64 * 100.0,
        percentile(round_trips.clone(), 0.5),
        percentile(round_trips.clone(), 0.99),
        slowest.as_secs_f64() * 1e3,
        round_trips.len(),
        info.as_secs_f64() * 1e3,
    );
    stop(server).await;
}
