//! Server addresses as users write them: `scheme://host:port`, `host:port` or `host`,
//! read into `host:port` for a client to resolve. Shared by the `canopy` CLI's
//! client and the `canopy-bench` load tool, which depends on the codecs only.
//!
//! Must never resolve names or touch the network (callers resolve the result).

/// `nats://host:port`, `host:port` or `host` (then port 4222) → `host:port`.
pub fn address_of(url: &str) -> String {
    host_port(url, 4222)
}

/// `scheme://host:port`, `host:port` or `host` (then `default_port`) → `host:port`. Any
/// scheme is dropped, so `mqtt://` URLs read the same way.
pub fn host_port(url: &str, default_port: u16) -> String {
    let rest = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .trim_end_matches('/');
    if rest
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
    {
        rest.to_owned()
    } else {
        format!("{rest}:{default_port}")
    }
}

#[cfg(test)]
mod tests {
    use super::{address_of, host_port};

    #[test]
    fn urls_become_host_and_port() {
        assert_eq!(address_of("nats://127.0.0.1:4333"), "127.0.0.1:4333");
        assert_eq!(address_of("127.0.0.1:4333"), "127.0.0.1:4333");
        assert_eq!(address_of("localhost"), "localhost:4222");
        assert_eq!(address_of("nats://localhost/"), "localhost:4222");
        assert_eq!(host_port("mqtt://127.0.0.1:1884", 1883), "127.0.0.1:1884");
        assert_eq!(host_port("mqtt://localhost", 1883), "localhost:1883");
        assert_eq!(host_port("127.0.0.1", 1883), "127.0.0.1:1883");
        assert_eq!(host_port("tcp://[::1]:9/", 1883), "[::1]:9");
    }
}
