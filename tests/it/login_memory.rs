//! Failed logins leave no memory behind: the real `canopy serve` binary (its own
//! allocator state, its own blocking threads), 100 refused logins at once, and its
//! resident memory read from `/proc/<pid>/status` before and after.
//!
//! Each password check needs 19 MiB for argon2id; memory the allocator keeps after a
//! check adds up over threads and arenas (hundreds of MiB once a flood of failures
//! has passed through), so a stranger could grow the server just by guessing.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::cli::ServeProcess;

/// How far resident memory may move over the flood: connections' buffers and
/// tasks, nowhere near one 19 MiB hash block.
const SLACK_KIB: u64 = 8 * 1024;

/// Long enough for 100 checks two at a time on a loaded 2-core machine.
const FLOOD_WAIT: Duration = Duration::from_secs(120);

fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status:\n{status}"))
}

/// A raw native CONNECT with a user and password, then PING: the server's answer
/// (`PONG` once logged in, the refusal otherwise).
async fn log_in(addr: SocketAddr, user: &str, password: &str) -> String {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let info = lines.next_line().await.expect("read").expect("INFO");
    assert!(info.starts_with("INFO {"), "first line: {info}");
    let connect = serde_json::json!({"user": user, "pass": password, "verbose": false});
    write
        .write_all(format!("CONNECT {connect}\r\nPING\r\n").as_bytes())
        .await
        .expect("write");
    tokio::time::timeout(FLOOD_WAIT, lines.next_line())
        .await
        .expect("an answer within the wait")
        .expect("read")
        .unwrap_or_else(|| "closed without an answer".into())
}

#[tokio::test]
async fn a_hundred_failed_logins_leave_resident_memory_where_it_was() {
    let env = [
        ("CANOPY_AUTHZ__REQUIRE_LOGIN".to_owned(), "true".to_owned()),
        (
            "CANOPY_AUTHZ__BOOTSTRAP_ADMIN_PASSWORD".to_owned(),
            "admin-pw".to_owned(),
        ),
    ];
    let server = ServeProcess::start_with_env(&[], &env).await;
    let pid = server.child.id().expect("the server runs");
    let addr: SocketAddr = server
        .url
        .strip_prefix("nats://")
        .and_then(|a| a.parse().ok())
        .expect("the native address");

    // One successful login first, so one-time costs (the store's first user read,
    // the first blocking thread) are in "before". No hash memory is meant to stay
    // after it: each check maps its own and unmaps it when done.
    assert_eq!(log_in(addr, "admin", "admin-pw").await, "PONG");
    let before = resident_kib(pid);

    let attempts = (0..100).map(|i| async move {
        // Half for a user that does not exist (the dummy hash), half a wrong password.
        let (user, password) = match i % 2 {
            0 => (format!("nobody-{i}"), "guess"),
            _ => ("admin".to_owned(), "not-the-password"),
        };
        log_in(addr, &user, password).await
    });
    let answers = futures::future::join_all(attempts).await;
    for answer in &answers {
        assert_eq!(answer, "-ERR 'Authorization Violation'");
    }

    let after = resident_kib(pid);
    assert!(
        after <= before + SLACK_KIB,
        "resident memory grew from {before} KiB to {after} KiB over 100 failed logins"
    );
    // Still answering, and the right password still works.
    assert_eq!(log_in(addr, "admin", "admin-pw").await, "PONG");
}
