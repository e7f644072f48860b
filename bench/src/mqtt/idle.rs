//! `mqtt-idle`: opens `--conns` MQTT connections that then say nothing, measures the
//! connect rate, and holds them for `--hold-secs` so a script can read the server's
//! memory (it prints `mqtt-idle: holding N connections` on stderr once all are open).
//!
//! Against a loopback server each connection is bound first to a source address
//! 127.0.0.2, 127.0.0.3, … (`--conns-per-source` per address), so the ephemeral ports of
//! one address do not run out.
//!
//! Owns: the connect concurrency (`--connect-parallel` handshakes at once), the source
//! addresses, the hold, and checking after the hold that the server closed none.
//!
//! Must never: keep per-connection buffers while holding (only the sockets), start more
//! connections than the open-files limit allows without saying so, or report a run in
//! which the server closed a connection.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::task::JoinSet;

use super::super::BenchError;
use super::super::Options;
use super::super::clock::now_ns;
use super::super::histogram::Histogram;
use super::super::measured::secs_between;
use super::conn::{Dial, MqttConn, disconnect_bytes};
use super::report::{IdleStats, MqttReport};

/// File descriptors this process needs besides the connections.
const SPARE_FDS: usize = 64;
/// 127.0.0.2 as a number: the first source address.
const FIRST_SOURCE: u32 = 0x7f00_0002;
/// 127.255.255.254: the last usable source address.
const LAST_SOURCE: u32 = 0x7fff_fffe;

/// The soft open-files limit of this process, where the system says (Linux).
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Source address of connection `i` against `server`: spread over loopback when the
/// server is on IPv4 loopback, otherwise left to the system.
fn source_of(server: SocketAddr, i: usize, per_source: usize) -> Option<IpAddr> {
    match server.ip() {
        IpAddr::V4(ip) if ip.is_loopback() => {
            let offset = u32::try_from(i / per_source.max(1)).ok()?;
            let n = FIRST_SOURCE
                .checked_add(offset)
                .filter(|&n| n <= LAST_SOURCE)?;
            Some(IpAddr::V4(Ipv4Addr::from(n)))
        }
        _ => None,
    }
}

pub async fn idle(addr: SocketAddr, options: &Options) -> Result<MqttReport, BenchError> {
    let n = options.mqtt.conns;
    if n == 0 {
        return Err(BenchError::Config("--conns must be at least 1".into()));
    }
    if let Some(limit) = open_files_limit()
        && n + SPARE_FDS > limit
    {
        return Err(BenchError::Config(format!(
            "--conns {n} needs about {} open files, and this process may open {limit} \
             (ulimit -n); the server needs as many: use --conns {}",
            n + SPARE_FDS,
            limit.saturating_sub(1000).max(1)
        )));
    }
    let per_source = options.mqtt.conns_per_source.max(1);
    let parallel = options.mqtt.connect_parallel.max(1);
    let sources = if source_of(addr, 0, per_source).is_some() {
        if source_of(addr, n - 1, per_source).is_none() {
            return Err(BenchError::Config(format!(
                "--conns {n} at --conns-per-source {per_source} needs more loopback \
                 source addresses than 127.0.0.2..127.255.255.254"
            )));
        }
        n.div_ceil(per_source)
    } else {
        0
    };
    let dial = Dial::new(addr, options);
    let mut connecting = JoinSet::new();
    let mut streams = Vec::with_capacity(n);
    let mut latency = Histogram::new();
    let start = now_ns();
    let mut last = start;
    let mut next = 0usize;
    while streams.len() < n {
        while next < n && connecting.len() < parallel {
            let dial = dial.clone();
            let source = source_of(addr, next, per_source);
            connecting.spawn(async move {
                let began = now_ns();
                let conn = MqttConn::connect_small(&dial, "idle connection", source).await?;
                let done = now_ns();
                Ok::<_, BenchError>((conn.into_stream(), done.saturating_sub(began), done))
            });
            next += 1;
        }
        // Dropping the set on an error aborts the handshakes still running.
        let Some(joined) = connecting.join_next().await else {
            break;
        };
        let (stream, took, done) = joined??;
        latency.record(took);
        last = last.max(done);
        streams.push(stream);
    }
    let connect_secs = secs_between(start, last);
    let hold_secs = options.mqtt.hold_secs;
    eprintln!(
        "mqtt-idle: holding {} connections for {hold_secs} s ({:.0} connects/s)",
        streams.len(),
        streams.len() as f64 / connect_secs
    );
    tokio::time::sleep(Duration::from_secs(hold_secs)).await;

    let mut closed = 0usize;
    let mut got_data = 0usize;
    let mut probe = [0u8; 64];
    for stream in &streams {
        match stream.try_read(&mut probe) {
            Ok(0) => closed += 1,
            Ok(_) => got_data += 1,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => closed += 1,
        }
    }
    if closed > 0 {
        return Err(BenchError::Unexpected {
            role: "idle connections",
            what: format!(
                "closed by the server during the {hold_secs} s hold: {closed} of {n} \
                 (keep-alive {} s)",
                options.mqtt.keep_alive
            ),
        });
    }
    // Polite ends; a full socket buffer is no reason to wait.
    let bye = disconnect_bytes(dial.level);
    for stream in &streams {
        let _ = stream.try_write(&bye);
    }
    drop(streams);
    let stats = IdleStats {
        conns: n,
        sources,
        parallel,
        keep_alive: options.mqtt.keep_alive,
        connect_secs,
        connects_per_sec: n as f64 / connect_secs,
        hold_secs,
        got_data,
    };
    Ok(MqttReport::idle(options, &latency, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_spread_over_loopback_only() {
        let local: SocketAddr = "127.0.0.1:1883".parse().unwrap_or_else(|_| unreachable!());
        let remote: SocketAddr = "10.0.0.1:1883".parse().unwrap_or_else(|_| unreachable!());
        assert_eq!(
            source_of(local, 0, 1000),
            Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)))
        );
        assert_eq!(
            source_of(local, 19_999, 1000),
            Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 21)))
        );
        assert_eq!(
            source_of(local, 1000 * 300, 1000),
            Some(IpAddr::V4(Ipv4Addr::new(127, 0, 1, 46)))
        );
        assert_eq!(source_of(remote, 0, 1000), None);
    }
}
