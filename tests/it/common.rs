//! Starting servers for tests and talking raw bytes to them.

use std::net::SocketAddr;
use std::time::Duration;

use canopy::config::Config;
use canopy::server::{RunningServer, Server};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Long enough for a loaded 2-core CI machine, short enough to fail a hung test.
pub const WAIT: Duration = Duration::from_secs(10);

/// A config on a free loopback port.
pub fn test_config() -> Config {
    let mut config = Config::default();
    config.native.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.store.url = "memory://".into();
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
