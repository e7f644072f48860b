//! Decoder of what NATS clients send: `CONNECT`, `PUB`, `HPUB`, `SUB`, `UNSUB`, `PING`, `PONG`.
//! The server runs one [`ClientDecoder`] per connection.
//!
//! Owns: the syntax of client operations, the payload limit checked from the control line
//! (before the payload arrives), and zero-copy payloads.
//!
//! Must never: validate subjects beyond UTF-8 without control characters (the server does),
//! decide authorization, buffer more than `max_control_line + max_payload + 2` bytes, or
//! panic on any input.

use bytes::{Bytes, BytesMut};

use super::error::ProtocolError;
use super::info::ConnectOptions;
use super::line::{Args, Limits, LineReader, check_payload, rest_of, split_op, take_payload};

/// One operation sent by a client.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientOp {
    /// `CONNECT {json}`.
    Connect(Box<ConnectOptions>),
    /// `PUB <subject> [reply] <#bytes>` and its payload.
    Pub {
        subject: Bytes,
        reply: Option<Bytes>,
        payload: Bytes,
    },
    /// `HPUB <subject> [reply] <#hdr> <#total>`, its header block and payload. An HPUB
    /// whose header block is empty (`<#hdr>` 0) decodes as [`ClientOp::Pub`].
    HPub {
        subject: Bytes,
        reply: Option<Bytes>,
        /// Raw header block, from `NATS/1.0` through the blank line.
        headers: Bytes,
        /// The payload without the headers.
        payload: Bytes,
    },
    /// `SUB <subject> [queue] <sid>`.
    Sub {
        subject: Bytes,
        queue: Option<Bytes>,
        sid: Bytes,
    },
    /// `UNSUB <sid> [max_msgs]`.
    Unsub { sid: Bytes, max_msgs: Option<u64> },
    /// `PING`.
    Ping,
    /// `PONG`.
    Pong,
}

/// A parsed `PUB`/`HPUB` control line waiting for its payload.
#[derive(Debug, Clone)]
enum Pending {
    Pub {
        subject: Bytes,
        reply: Option<Bytes>,
        size: usize,
    },
    HPub {
        subject: Bytes,
        reply: Option<Bytes>,
        hdr: usize,
        total: usize,
    },
}

impl Pending {
    fn total(&self) -> usize {
        match self {
            Self::Pub { size, .. } => *size,
            Self::HPub { total, .. } => *total,
        }
    }

    fn finish(self, mut body: Bytes) -> Result<ClientOp, ProtocolError> {
        match self {
            Self::Pub { subject, reply, .. } => Ok(ClientOp::Pub {
                subject,
                reply,
                payload: body,
            }),
            Self::HPub {
                subject,
                reply,
                hdr,
                ..
            } => Ok(match split_headers(&mut body, hdr)? {
                Some(headers) => ClientOp::HPub {
                    subject,
                    reply,
                    headers,
                    payload: body,
                },
                None => ClientOp::Pub {
                    subject,
                    reply,
                    payload: body,
                },
            }),
        }
    }
}

/// Splits the header block off the front of a message body and checks it starts `NATS/1.0`.
///
/// An empty block gives `None`: nats-server takes `<#hdr>` 0 as a message without headers
/// (and delivers it as MSG), and nats.js sends one for every JetStream publish without
/// options.
pub(crate) fn split_headers(body: &mut Bytes, hdr: usize) -> Result<Option<Bytes>, ProtocolError> {
    if hdr == 0 {
        return Ok(None);
    }
    if hdr > body.len() {
        return Err(ProtocolError::parser("header size exceeds total size"));
    }
    let headers = body.split_to(hdr);
    if !headers.starts_with(b"NATS/1.0") {
        return Err(ProtocolError::parser(
            "header block must start with NATS/1.0",
        ));
    }
    Ok(Some(headers))
}

/// Checks `<#hdr> <#total>` of HPUB/HMSG and returns them as `usize`.
pub(crate) fn header_sizes(
    args: &Args<'_>,
    at: usize,
    limits: &Limits,
) -> Result<(usize, usize), ProtocolError> {
    let hdr = args.size(at, "header size")?;
    let total = args.size(at + 1, "total size")?;
    if hdr > total {
        return Err(ProtocolError::parser(
            "header size must not exceed total size",
        ));
    }
    if hdr != 0 && hdr < b"NATS/1.0".len() as u64 {
        return Err(ProtocolError::parser(
            "header size is too small for a NATS/1.0 header block (0 means no headers)",
        ));
    }
    let total = check_payload(total, limits)?;
    let hdr = usize::try_from(hdr).unwrap_or(usize::MAX).min(total);
    Ok((hdr, total))
}

/// Streaming decoder of client operations.
///
/// Keeps a parsed `PUB`/`HPUB` control line while its payload arrives: after `Ok(None)` the
/// caller must append to the same buffer and call again.
#[derive(Debug, Clone)]
pub struct ClientDecoder {
    limits: Limits,
    line: LineReader,
    pending: Option<Pending>,
}

enum Parsed {
    Op(ClientOp),
    Pending(Pending),
}

impl ClientDecoder {
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

    /// Decodes one operation from the front of `buf`.
    ///
    /// `Ok(None)` means more bytes are needed (not an error). On success exactly one
    /// operation's bytes have left `buf` (the control line may leave earlier, while the payload
    /// is awaited). Payloads are zero-copy slices of `buf`. Every error is fatal.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<ClientOp>, ProtocolError> {
        let result = self.decode_inner(buf);
        if result.is_err() {
            self.pending = None;
            self.line.reset();
        }
        result
    }

    fn decode_inner(&mut self, buf: &mut BytesMut) -> Result<Option<ClientOp>, ProtocolError> {
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
        match take_payload(buf, pending.total())? {
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
        if is(b"PUB") {
            let args = Args::split(line, from);
            let (reply, at) = match args.len() {
                2 => (None, 1),
                3 => (Some(args.token(1, "reply subject")?), 2),
                n => {
                    return Err(ProtocolError::parser(format!(
                        "PUB expects <subject> [reply] <#bytes>, got {n} arguments"
                    )));
                }
            };
            let subject = args.token(0, "subject")?;
            let size = check_payload(args.size(at, "payload size")?, &self.limits)?;
            Ok(Parsed::Pending(Pending::Pub {
                subject,
                reply,
                size,
            }))
        } else if is(b"HPUB") {
            let args = Args::split(line, from);
            let (reply, at) = match args.len() {
                3 => (None, 1),
                4 => (Some(args.token(1, "reply subject")?), 2),
                n => {
                    return Err(ProtocolError::parser(format!(
                        "HPUB expects <subject> [reply] <#hdr> <#total>, got {n} arguments"
                    )));
                }
            };
            let subject = args.token(0, "subject")?;
            let (hdr, total) = header_sizes(&args, at, &self.limits)?;
            Ok(Parsed::Pending(Pending::HPub {
                subject,
                reply,
                hdr,
                total,
            }))
        } else if is(b"SUB") {
            let args = Args::split(line, from);
            let (queue, at) = match args.len() {
                2 => (None, 1),
                3 => (Some(args.token(1, "queue group")?), 2),
                n => {
                    return Err(ProtocolError::parser(format!(
                        "SUB expects <subject> [queue] <sid>, got {n} arguments"
                    )));
                }
            };
            Ok(Parsed::Op(ClientOp::Sub {
                subject: args.token(0, "subject")?,
                queue,
                sid: args.token(at, "sid")?,
            }))
        } else if is(b"UNSUB") {
            let args = Args::split(line, from);
            let max_msgs = match args.len() {
                1 => None,
                2 => Some(args.size(1, "max_msgs")?),
                n => {
                    return Err(ProtocolError::parser(format!(
                        "UNSUB expects <sid> [max_msgs], got {n} arguments"
                    )));
                }
            };
            Ok(Parsed::Op(ClientOp::Unsub {
                sid: args.token(0, "sid")?,
                max_msgs,
            }))
        } else if is(b"PING") || is(b"PONG") {
            if Args::split(line, from).len() != 0 {
                return Err(ProtocolError::parser("PING and PONG take no arguments"));
            }
            Ok(Parsed::Op(if is(b"PING") {
                ClientOp::Ping
            } else {
                ClientOp::Pong
            }))
        } else if is(b"CONNECT") {
            let json = rest_of(line, from);
            let opts: ConnectOptions = serde_json::from_slice(&json)
                .map_err(|e| ProtocolError::parser(format!("invalid CONNECT JSON: {e}")))?;
            Ok(Parsed::Op(ClientOp::Connect(Box::new(opts))))
        } else {
            Err(ProtocolError::UnknownOperation)
        }
    }
}

impl Default for ClientDecoder {
    fn default() -> Self {
        Self::new(Limits::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8]) -> Vec<Result<ClientOp, ProtocolError>> {
        let mut d = ClientDecoder::default();
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        loop {
            match d.decode(&mut buf) {
                Ok(Some(op)) => out.push(Ok(op)),
                Ok(None) => return out,
                Err(e) => {
                    out.push(Err(e));
                    return out;
                }
            }
        }
    }

    fn one(input: &[u8]) -> Result<ClientOp, ProtocolError> {
        let mut all = decode_all(input);
        assert_eq!(all.len(), 1, "{all:?}");
        all.remove(0)
    }

    #[test]
    fn pub_with_and_without_reply() {
        assert_eq!(
            one(b"PUB foo 5\r\nhello\r\n"),
            Ok(ClientOp::Pub {
                subject: "foo".into(),
                reply: None,
                payload: "hello".into()
            })
        );
        assert_eq!(
            one(b"pub foo bar 0\r\n\r\n"),
            Ok(ClientOp::Pub {
                subject: "foo".into(),
                reply: Some("bar".into()),
                payload: Bytes::new()
            })
        );
    }

    #[test]
    fn payload_may_contain_crlf() {
        assert_eq!(
            one(b"PUB a 4\r\n\r\n\r\n\r\n"),
            Ok(ClientOp::Pub {
                subject: "a".into(),
                reply: None,
                payload: "\r\n\r\n".into()
            })
        );
    }

    #[test]
    fn hpub_splits_headers() {
        let op = one(b"HPUB s r 12 14\r\nNATS/1.0\r\n\r\nhi\r\n").unwrap();
        assert_eq!(
            op,
            ClientOp::HPub {
                subject: "s".into(),
                reply: Some("r".into()),
                headers: "NATS/1.0\r\n\r\n".into(),
                payload: "hi".into()
            }
        );
    }

    #[test]
    fn hpub_errors() {
        assert!(matches!(
            one(b"HPUB s 13 12\r\n"),
            Err(ProtocolError::Parser(_))
        ));
        assert!(matches!(
            one(b"HPUB s 12 12\r\nXATS/1.0\r\n\r\n\r\n"),
            Err(ProtocolError::Parser(_))
        ));
    }

    /// nats.js sends a JetStream publish without options as `HPUB <subject> <reply> 0 <n>`;
    /// nats-server takes a header block of 0 bytes as no headers at all.
    #[test]
    fn hpub_with_an_empty_header_block_is_a_pub() {
        assert_eq!(
            one(b"HPUB subj reply 0 1\r\nx\r\n"),
            Ok(ClientOp::Pub {
                subject: "subj".into(),
                reply: Some("reply".into()),
                payload: "x".into()
            })
        );
        assert_eq!(
            one(b"HPUB subj 0 0\r\n\r\n"),
            Ok(ClientOp::Pub {
                subject: "subj".into(),
                reply: None,
                payload: Bytes::new()
            })
        );
        // The payload is taken as is, even when it looks like a header block.
        assert_eq!(
            one(b"hpub subj 0 12\r\nNATS/1.0\r\n\r\n\r\n"),
            Ok(ClientOp::Pub {
                subject: "subj".into(),
                reply: None,
                payload: "NATS/1.0\r\n\r\n".into()
            })
        );
        // Split anywhere, it decodes the same, and what follows it is decoded too.
        let wire = b"HPUB subj reply 0 1\r\nx\r\nPING\r\n";
        for at in 1..wire.len() {
            let mut d = ClientDecoder::default();
            let mut buf = BytesMut::from(&wire[..at]);
            let mut ops = Vec::new();
            while let Some(op) = d.decode(&mut buf).expect("valid") {
                ops.push(op);
            }
            buf.extend_from_slice(&wire[at..]);
            while let Some(op) = d.decode(&mut buf).expect("valid") {
                ops.push(op);
            }
            assert!(
                matches!(ops.as_slice(), [ClientOp::Pub { .. }, ClientOp::Ping]),
                "split at {at}: {ops:?}"
            );
        }
    }

    #[test]
    fn hpub_with_an_empty_header_block_keeps_its_checks() {
        // Missing payload terminator, size mismatch, and a block too short for NATS/1.0.
        assert!(matches!(
            one(b"HPUB subj 0 1\r\nxy\r\n"),
            Err(ProtocolError::Parser(_))
        ));
        assert!(matches!(
            one(b"HPUB subj 0\r\n"),
            Err(ProtocolError::Parser(_))
        ));
        assert!(matches!(
            one(b"HPUB subj 0 -1\r\n"),
            Err(ProtocolError::Parser(_))
        ));
        for short in 1..8 {
            let wire = format!("HPUB subj {short} 8\r\nNATS/1.0\r\n");
            let Err(ProtocolError::Parser(why)) = one(wire.as_bytes()) else {
                panic!("a {short}-byte header block is refused");
            };
            assert!(why.contains("too small"), "{why}");
        }
        let mut d = ClientDecoder::new(Limits {
            max_control_line: 64,
            max_payload: 4,
        });
        let mut buf = BytesMut::from(&b"HPUB subj 0 5\r\n"[..]);
        assert_eq!(
            d.decode(&mut buf),
            Err(ProtocolError::MaxPayloadViolation { size: 5, max: 4 })
        );
    }

    #[test]
    fn sub_unsub() {
        assert_eq!(
            one(b"SUB foo.* 1\r\n"),
            Ok(ClientOp::Sub {
                subject: "foo.*".into(),
                queue: None,
                sid: "1".into()
            })
        );
        assert_eq!(
            one(b"sub foo q 22\n"),
            Ok(ClientOp::Sub {
                subject: "foo".into(),
                queue: Some("q".into()),
                sid: "22".into()
            })
        );
        assert_eq!(
            one(b"UNSUB 1\r\n"),
            Ok(ClientOp::Unsub {
                sid: "1".into(),
                max_msgs: None
            })
        );
        assert_eq!(
            one(b"UnSuB 1 5\r\n"),
            Ok(ClientOp::Unsub {
                sid: "1".into(),
                max_msgs: Some(5)
            })
        );
        assert!(matches!(
            one(b"UNSUB 1 x\r\n"),
            Err(ProtocolError::Parser(_))
        ));
        assert!(matches!(one(b"SUB foo\r\n"), Err(ProtocolError::Parser(_))));
    }

    #[test]
    fn ping_pong_connect() {
        assert_eq!(one(b"PING\r\n"), Ok(ClientOp::Ping));
        assert_eq!(one(b"pong \r\n"), Ok(ClientOp::Pong));
        let Ok(ClientOp::Connect(opts)) =
            one(b"CONNECT {\"verbose\":false,\"name\":\"x\",\"future\":1}\r\n")
        else {
            panic!("not a connect")
        };
        assert_eq!(opts.name.as_deref(), Some("x"));
        assert!(opts.echo);
        assert!(matches!(
            one(b"CONNECT {nope\r\n"),
            Err(ProtocolError::Parser(_))
        ));
    }

    #[test]
    fn unknown_and_empty_lines() {
        assert_eq!(one(b"FOO\r\n"), Err(ProtocolError::UnknownOperation));
        assert_eq!(one(b"\r\n"), Err(ProtocolError::UnknownOperation));
        assert_eq!(one(b" PING\r\n"), Err(ProtocolError::UnknownOperation));
        assert_eq!(one(b"MSG a 1 1\r\n"), Err(ProtocolError::UnknownOperation));
    }

    #[test]
    fn payload_limit_is_checked_from_the_control_line() {
        let mut d = ClientDecoder::new(Limits {
            max_control_line: 64,
            max_payload: 4,
        });
        let mut buf = BytesMut::from(&b"PUB a 5\r\n"[..]);
        assert_eq!(
            d.decode(&mut buf),
            Err(ProtocolError::MaxPayloadViolation { size: 5, max: 4 })
        );
        let mut buf = BytesMut::from(&b"HPUB a 10 99999999999999999999\r\n"[..]);
        assert!(matches!(d.decode(&mut buf), Err(ProtocolError::Parser(_))));
    }

    #[test]
    fn missing_crlf_after_payload() {
        assert!(matches!(
            one(b"PUB a 1\r\nxyz"),
            Err(ProtocolError::Parser(_))
        ));
    }

    #[test]
    fn waits_for_payload_without_rescanning() {
        let mut d = ClientDecoder::default();
        let mut buf = BytesMut::from(&b"PUB a 3\r\nx"[..]);
        assert_eq!(d.decode(&mut buf), Ok(None));
        assert_eq!(&buf[..], b"x");
        buf.extend_from_slice(b"yz\r\nPING\r\n");
        assert!(matches!(d.decode(&mut buf), Ok(Some(ClientOp::Pub { .. }))));
        assert_eq!(d.decode(&mut buf), Ok(Some(ClientOp::Ping)));
        assert!(buf.is_empty());
    }
}
