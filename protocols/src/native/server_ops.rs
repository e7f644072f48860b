//! Decoder of what NATS servers send: `INFO`, `MSG`, `HMSG`, `+OK`, `-ERR`, `PING`, `PONG`.
//! Canopy's CLI and tests use [`ServerDecoder`] when they act as a client.
//!
//! Owns: the syntax of server operations and the payload limit on messages received.
//!
//! Must never: interpret `-ERR` texts (the caller decides what they mean), buffer more than
//! `max_control_line + max_payload + 2` bytes, or panic on any input.

use bytes::{Bytes, BytesMut};

use super::client_ops::{header_sizes, split_headers};
use super::error::ProtocolError;
use super::info::ServerInfo;
use super::line::{Args, Limits, LineReader, check_payload, rest_of, split_op, take_payload};

/// One operation sent by a server.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerOp {
    /// `INFO {json}`.
    Info(Box<ServerInfo>),
    /// `MSG <subject> <sid> [reply] <#bytes>` and its payload.
    Msg {
        subject: Bytes,
        sid: Bytes,
        reply: Option<Bytes>,
        payload: Bytes,
    },
    /// `HMSG <subject> <sid> [reply] <#hdr> <#total>`, its header block and payload. An
    /// HMSG whose header block is empty (`<#hdr>` 0) decodes as [`ServerOp::Msg`].
    HMsg {
        subject: Bytes,
        sid: Bytes,
        reply: Option<Bytes>,
        /// Raw header block, from `NATS/1.0` through the blank line.
        headers: Bytes,
        /// The payload without the headers.
        payload: Bytes,
    },
    /// `+OK`.
    Ok,
    /// `-ERR '<text>'`: the text between the quotes.
    Err(String),
    /// `PING`.
    Ping,
    /// `PONG`.
    Pong,
}

/// A parsed `MSG`/`HMSG` control line waiting for its payload.
#[derive(Debug, Clone)]
struct Pending {
    subject: Bytes,
    sid: Bytes,
    reply: Option<Bytes>,
    /// Header bytes, `None` for `MSG`.
    hdr: Option<usize>,
    total: usize,
}

impl Pending {
    fn finish(self, mut body: Bytes) -> Result<ServerOp, ProtocolError> {
        let Self {
            subject,
            sid,
            reply,
            hdr,
            ..
        } = self;
        match hdr {
            None => Ok(ServerOp::Msg {
                subject,
                sid,
                reply,
                payload: body,
            }),
            Some(hdr) => Ok(match split_headers(&mut body, hdr)? {
                Some(headers) => ServerOp::HMsg {
                    subject,
                    sid,
                    reply,
                    headers,
                    payload: body,
                },
                None => ServerOp::Msg {
                    subject,
                    sid,
                    reply,
                    payload: body,
                },
            }),
        }
    }
}

enum Parsed {
    Op(ServerOp),
    Pending(Pending),
}

/// Streaming decoder of server operations.
///
/// Keeps a parsed `MSG`/`HMSG` control line while its payload arrives: after `Ok(None)` the
/// caller must append to the same buffer and call again.
#[derive(Debug, Clone)]
pub struct ServerDecoder {
    limits: Limits,
    line: LineReader,
    pending: Option<Pending>,
}

impl ServerDecoder {
    /// A decoder enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            line: LineReader::default(),
            pending: None,
        }
    }

    /// The limits this decoder enforces.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Changes the payload limit, e.g. to the `max_payload` a server announced in `INFO`.
    pub fn set_max_payload(&mut self, max_payload: usize) {
        self.limits.max_payload = max_payload;
    }

    /// Decodes one operation from the front of `buf`; same contract as
    /// [`ClientDecoder::decode`](super::ClientDecoder::decode).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<ServerOp>, ProtocolError> {
        let result = self.decode_inner(buf);
        if result.is_err() {
            self.pending = None;
            self.line.reset();
        }
        result
    }

    fn decode_inner(&mut self, buf: &mut BytesMut) -> Result<Option<ServerOp>, ProtocolError> {
        let pending = match self.pending.take() {
            Some(pending) => pending,
            None => {
                let Some(line) = self.line.next_line(buf, &self.limits)? else {
                    return Ok(None);
                };
                match self.parse_line(&line)? {
                    Parsed::Op(op) => return Ok(Some(op)),
                    Parsed::Pending(pending) => pending,
                }
            }
        };
        match take_payload(buf, pending.total)? {
            Some(body) => pending.finish(body).map(Some),
            None => {
                self.pending = Some(pending);
                Ok(None)
            }
        }
    }

    fn parse_line(&self, line: &Bytes) -> Result<Parsed, ProtocolError> {
        let (op, from) = split_op(line);
        let is = |name: &[u8]| op.eq_ignore_ascii_case(name);
        if is(b"MSG") {
            let args = Args::split(line, from);
            let (reply, at) = match args.len() {
                3 => (None, 2),
                4 => (Some(args.token(2, "reply subject")?), 3),
                n => {
                    return Err(ProtocolError::parser(format!(
                        "MSG expects <subject> <sid> [reply] <#bytes>, got {n} arguments"
                    )));
                }
            };
            let subject = args.token(0, "subject")?;
            let sid = args.token(1, "sid")?;
            let total = check_payload(args.size(at, "payload size")?, &self.limits)?;
            Ok(Parsed::Pending(Pending {
                subject,
                sid,
                reply,
                hdr: None,
                total,
            }))
        } else if is(b"HMSG") {
            let args = Args::split(line, from);
            let (reply, at) = match args.len() {
                4 => (None, 2),
                5 => (Some(args.token(2, "reply subject")?), 3),
                n => {
                    return Err(ProtocolError::parser(format!(
                        "HMSG expects <subject> <sid> [reply] <#hdr> <#total>, got {n} arguments"
                    )));
                }
            };
            let subject = args.token(0, "subject")?;
            let sid = args.token(1, "sid")?;
            let (hdr, total) = header_sizes(&args, at, &self.limits)?;
            Ok(Parsed::Pending(Pending {
                subject,
                sid,
                reply,
                hdr: Some(hdr),
                total,
            }))
        } else if is(b"PING") || is(b"PONG") || is(b"+OK") {
            if Args::split(line, from).len() != 0 {
                return Err(ProtocolError::parser(
                    "PING, PONG and +OK take no arguments",
                ));
            }
            Ok(Parsed::Op(if is(b"PING") {
                ServerOp::Ping
            } else if is(b"PONG") {
                ServerOp::Pong
            } else {
                ServerOp::Ok
            }))
        } else if is(b"-ERR") {
            let rest = rest_of(line, from);
            let text = rest
                .strip_prefix(b"'")
                .and_then(|r| r.strip_suffix(b"'"))
                .unwrap_or(&rest);
            Ok(Parsed::Op(ServerOp::Err(
                String::from_utf8_lossy(text).into_owned(),
            )))
        } else if is(b"INFO") {
            let json = rest_of(line, from);
            let info: ServerInfo = serde_json::from_slice(&json)
                .map_err(|e| ProtocolError::parser(format!("invalid INFO JSON: {e}")))?;
            Ok(Parsed::Op(ServerOp::Info(Box::new(info))))
        } else {
            Err(ProtocolError::UnknownOperation)
        }
    }
}

impl Default for ServerDecoder {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(input: &[u8]) -> Result<ServerOp, ProtocolError> {
        let mut d = ServerDecoder::default();
        let mut buf = BytesMut::from(input);
        let op = d.decode(&mut buf).map(|o| o.expect("complete frame"));
        if op.is_ok() {
            assert!(buf.is_empty(), "left over: {buf:?}");
        }
        op
    }

    #[test]
    fn msg_forms() {
        assert_eq!(
            one(b"MSG foo 1 3\r\nabc\r\n"),
            Ok(ServerOp::Msg {
                subject: "foo".into(),
                sid: "1".into(),
                reply: None,
                payload: "abc".into()
            })
        );
        assert_eq!(
            one(b"msg foo 1 _INBOX.x 0\r\n\r\n"),
            Ok(ServerOp::Msg {
                subject: "foo".into(),
                sid: "1".into(),
                reply: Some("_INBOX.x".into()),
                payload: Bytes::new()
            })
        );
    }

    #[test]
    fn hmsg_forms() {
        assert_eq!(
            one(b"HMSG foo 9 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"),
            Ok(ServerOp::HMsg {
                subject: "foo".into(),
                sid: "9".into(),
                reply: None,
                headers: "NATS/1.0 503\r\n\r\n".into(),
                payload: Bytes::new()
            })
        );
        assert!(matches!(
            one(b"HMSG foo 9 r 17 16\r\n"),
            Err(ProtocolError::Parser(_))
        ));
    }

    /// As nats-server reads HPUB: a header block of 0 bytes is no headers.
    #[test]
    fn hmsg_with_an_empty_header_block_is_a_msg() {
        assert_eq!(
            one(b"HMSG foo 9 r 0 2\r\nhi\r\n"),
            Ok(ServerOp::Msg {
                subject: "foo".into(),
                sid: "9".into(),
                reply: Some("r".into()),
                payload: "hi".into()
            })
        );
        assert_eq!(
            one(b"HMSG foo 9 0 0\r\n\r\n"),
            Ok(ServerOp::Msg {
                subject: "foo".into(),
                sid: "9".into(),
                reply: None,
                payload: Bytes::new()
            })
        );
        assert!(matches!(
            one(b"HMSG foo 9 4 4\r\nNATS\r\n"),
            Err(ProtocolError::Parser(_))
        ));
    }

    #[test]
    fn small_ops() {
        assert_eq!(one(b"+OK\r\n"), Ok(ServerOp::Ok));
        assert_eq!(one(b"+ok\n"), Ok(ServerOp::Ok));
        assert_eq!(one(b"PING\r\n"), Ok(ServerOp::Ping));
        assert_eq!(one(b"pong\r\n"), Ok(ServerOp::Pong));
        assert_eq!(
            one(b"-ERR 'Unknown Protocol Operation'\r\n"),
            Ok(ServerOp::Err("Unknown Protocol Operation".into()))
        );
        assert_eq!(one(b"-ERR bare\r\n"), Ok(ServerOp::Err("bare".into())));
        assert_eq!(one(b"PUB a 1\r\n"), Err(ProtocolError::UnknownOperation));
    }

    #[test]
    fn info() {
        let Ok(ServerOp::Info(info)) = one(
            b"INFO {\"server_id\":\"S\",\"version\":\"2.10.0\",\"proto\":1,\"max_payload\":1048576,\"headers\":true,\"extra\":[1]}\r\n",
        ) else {
            panic!("not info")
        };
        assert_eq!(info.server_id, "S");
        assert_eq!(info.max_payload, 1_048_576);
        assert!(info.headers);
        assert!(matches!(
            one(b"INFO nope\r\n"),
            Err(ProtocolError::Parser(_))
        ));
    }

    #[test]
    fn msg_payload_limit() {
        let mut d = ServerDecoder::default();
        d.set_max_payload(2);
        let mut buf = BytesMut::from(&b"MSG a 1 3\r\n"[..]);
        assert_eq!(
            d.decode(&mut buf),
            Err(ProtocolError::MaxPayloadViolation { size: 3, max: 2 })
        );
    }
}
