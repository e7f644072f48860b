//! What the load runs that start the `canopy` binary share: settings from the
//! environment, free loopback ports, API calls, and the server's CPU time.
//!
//! Each bench is its own crate and uses a part of this, hence no dead-code warnings.
#![allow(dead_code)]

/// A whole number from the environment, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Calls `$CANOPY.<name>`; panics on an error answer.
pub async fn api(client: &async_nats::Client, name: &str, body: serde_json::Value) {
    let answer = client
        .request(format!("$CANOPY.{name}"), body.to_string().into())
        .await
        .expect("answered");
    let failed = answer
        .headers
        .as_ref()
        .is_some_and(|h| h.get("Canopy-Status").is_some());
    assert!(
        !failed,
        "{name}: {}",
        String::from_utf8_lossy(&answer.payload)
    );
}

/// A process's user plus system CPU time so far, in seconds.
pub fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // /proc counts in clock ticks of 1/100 s on Linux.
    (ticks(11) + ticks(12)) / 100.0
}
