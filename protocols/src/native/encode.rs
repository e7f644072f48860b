//! Encoders of every native operation, both directions, appending to a caller's `BytesMut`.
//!
//! Owns: the exact byte layout written on the wire, including sizes computed from the slices
//! given (so they always match).
//!
//! Must never: allocate besides growing `out`, validate subjects (callers pass what they
//! parsed or checked), or panic.

use bytes::{BufMut, BytesMut};
use serde::Serialize;

use super::client_ops::ClientOp;
use super::info::{ConnectOptions, ServerInfo};
use super::server_ops::ServerOp;

/// Writes `n` in decimal without allocating.
pub(crate) fn put_decimal(out: &mut BytesMut, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        if let Some(d) = digits.get_mut(i) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    out.put_slice(digits.get(i..).unwrap_or_default());
}

fn put_usize(out: &mut BytesMut, n: usize) {
    put_decimal(out, u64::try_from(n).unwrap_or(u64::MAX));
}

fn put_json<T: Serialize>(out: &mut BytesMut, verb: &[u8], value: &T) {
    let start = out.len();
    out.put_slice(verb);
    out.put_u8(b' ');
    // Serializing these structs cannot fail (string keys, no custom Serialize); if it ever did,
    // send an empty object rather than half a line.
    if serde_json::to_writer(out.writer(), value).is_err() {
        out.truncate(start);
        out.put_slice(verb);
        out.put_slice(b" {}");
    }
    out.put_slice(b"\r\n");
}

/// `INFO {json}\r\n`
pub fn encode_info(out: &mut BytesMut, info: &ServerInfo) {
    put_json(out, b"INFO", info);
}

/// `CONNECT {json}\r\n`
pub fn encode_connect(out: &mut BytesMut, opts: &ConnectOptions) {
    put_json(out, b"CONNECT", opts);
}

/// Writes ` <a>` for each present part.
fn put_args(out: &mut BytesMut, parts: &[Option<&[u8]>]) {
    for part in parts.iter().flatten() {
        out.put_u8(b' ');
        out.put_slice(part);
    }
}

fn put_sized(
    out: &mut BytesMut,
    verb: &[u8],
    args: &[Option<&[u8]>],
    headers: Option<&[u8]>,
    payload: &[u8],
) {
    let hdr_len = headers.map_or(0, <[u8]>::len);
    let arg_len = args.iter().flatten().fold(0usize, |acc, a| {
        acc.saturating_add(a.len()).saturating_add(1)
    });
    out.reserve(
        verb.len()
            .saturating_add(arg_len)
            .saturating_add(48)
            .saturating_add(hdr_len)
            .saturating_add(payload.len()),
    );
    out.put_slice(verb);
    put_args(out, args);
    if headers.is_some() {
        out.put_u8(b' ');
        put_usize(out, hdr_len);
    }
    out.put_u8(b' ');
    put_usize(out, hdr_len.saturating_add(payload.len()));
    out.put_slice(b"\r\n");
    if let Some(headers) = headers {
        out.put_slice(headers);
    }
    out.put_slice(payload);
    out.put_slice(b"\r\n");
}

/// `MSG <subject> <sid> [reply] <#bytes>\r\n<payload>\r\n`
pub fn encode_msg(
    out: &mut BytesMut,
    subject: &[u8],
    sid: &[u8],
    reply: Option<&[u8]>,
    payload: &[u8],
) {
    put_sized(
        out,
        b"MSG",
        &[Some(subject), Some(sid), reply],
        None,
        payload,
    );
}

/// `HMSG <subject> <sid> [reply] <#hdr bytes> <#total bytes>\r\n<headers><payload>\r\n`
pub fn encode_hmsg(
    out: &mut BytesMut,
    subject: &[u8],
    sid: &[u8],
    reply: Option<&[u8]>,
    headers: &[u8],
    payload: &[u8],
) {
    put_sized(
        out,
        b"HMSG",
        &[Some(subject), Some(sid), reply],
        Some(headers),
        payload,
    );
}

/// `PUB <subject> [reply] <#bytes>\r\n<payload>\r\n`
pub fn encode_pub(out: &mut BytesMut, subject: &[u8], reply: Option<&[u8]>, payload: &[u8]) {
    put_sized(out, b"PUB", &[Some(subject), reply], None, payload);
}

/// `HPUB <subject> [reply] <#hdr bytes> <#total bytes>\r\n<headers><payload>\r\n`
pub fn encode_hpub(
    out: &mut BytesMut,
    subject: &[u8],
    reply: Option<&[u8]>,
    headers: &[u8],
    payload: &[u8],
) {
    put_sized(
        out,
        b"HPUB",
        &[Some(subject), reply],
        Some(headers),
        payload,
    );
}

/// `SUB <subject> [queue] <sid>\r\n`
pub fn encode_sub(out: &mut BytesMut, subject: &[u8], queue: Option<&[u8]>, sid: &[u8]) {
    out.put_slice(b"SUB");
    put_args(out, &[Some(subject), queue, Some(sid)]);
    out.put_slice(b"\r\n");
}

/// `UNSUB <sid> [max_msgs]\r\n`
pub fn encode_unsub(out: &mut BytesMut, sid: &[u8], max_msgs: Option<u64>) {
    out.put_slice(b"UNSUB ");
    out.put_slice(sid);
    if let Some(max) = max_msgs {
        out.put_u8(b' ');
        put_decimal(out, max);
    }
    out.put_slice(b"\r\n");
}

/// `+OK\r\n`
pub fn encode_ok(out: &mut BytesMut) {
    out.put_slice(b"+OK\r\n");
}

/// `-ERR '<text>'\r\n`
pub fn encode_err(out: &mut BytesMut, text: &str) {
    out.put_slice(b"-ERR '");
    out.put_slice(text.as_bytes());
    out.put_slice(b"'\r\n");
}

/// `PING\r\n`
pub fn encode_ping(out: &mut BytesMut) {
    out.put_slice(b"PING\r\n");
}

/// `PONG\r\n`
pub fn encode_pong(out: &mut BytesMut) {
    out.put_slice(b"PONG\r\n");
}

/// Encodes any client operation (what [`ClientDecoder`](super::ClientDecoder) decodes).
pub fn encode_client_op(out: &mut BytesMut, op: &ClientOp) {
    match op {
        ClientOp::Connect(opts) => encode_connect(out, opts),
        ClientOp::Pub {
            subject,
            reply,
            payload,
        } => encode_pub(out, subject, reply.as_deref(), payload),
        ClientOp::HPub {
            subject,
            reply,
            headers,
            payload,
        } => encode_hpub(out, subject, reply.as_deref(), headers, payload),
        ClientOp::Sub {
            subject,
            queue,
            sid,
        } => encode_sub(out, subject, queue.as_deref(), sid),
        ClientOp::Unsub { sid, max_msgs } => encode_unsub(out, sid, *max_msgs),
        ClientOp::Ping => encode_ping(out),
        ClientOp::Pong => encode_pong(out),
    }
}

/// Encodes any server operation (what [`ServerDecoder`](super::ServerDecoder) decodes).
pub fn encode_server_op(out: &mut BytesMut, op: &ServerOp) {
    match op {
        ServerOp::Info(info) => encode_info(out, info),
        ServerOp::Msg {
            subject,
            sid,
            reply,
            payload,
        } => encode_msg(out, subject, sid, reply.as_deref(), payload),
        ServerOp::HMsg {
            subject,
            sid,
            reply,
            headers,
            payload,
        } => encode_hmsg(out, subject, sid, reply.as_deref(), headers, payload),
        ServerOp::Ok => encode_ok(out),
        ServerOp::Err(text) => encode_err(out, text),
        ServerOp::Ping => encode_ping(out),
        ServerOp::Pong => encode_pong(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(f: impl FnOnce(&mut BytesMut)) -> Vec<u8> {
        let mut out = BytesMut::new();
        f(&mut out);
        out.to_vec()
    }

    #[test]
    fn decimals() {
        for n in [0u64, 7, 10, 99, 1_048_576, u64::MAX] {
            assert_eq!(bytes(|o| put_decimal(o, n)), n.to_string().into_bytes());
        }
    }

    #[test]
    fn layouts() {
        assert_eq!(
            bytes(|o| encode_msg(o, b"a.b", b"1", None, b"hi")),
            b"MSG a.b 1 2\r\nhi\r\n"
        );
        assert_eq!(
            bytes(|o| encode_msg(o, b"a", b"1", Some(b"r"), b"")),
            b"MSG a 1 r 0\r\n\r\n"
        );
        assert_eq!(
            bytes(|o| encode_hmsg(o, b"a", b"1", Some(b"r"), b"NATS/1.0\r\n\r\n", b"x")),
            b"HMSG a 1 r 12 13\r\nNATS/1.0\r\n\r\nx\r\n"
        );
        assert_eq!(
            bytes(|o| encode_pub(o, b"a", Some(b"r"), b"xy")),
            b"PUB a r 2\r\nxy\r\n"
        );
        assert_eq!(
            bytes(|o| encode_hpub(o, b"a", None, b"NATS/1.0\r\n\r\n", b"")),
            b"HPUB a 12 12\r\nNATS/1.0\r\n\r\n\r\n"
        );
        assert_eq!(
            bytes(|o| encode_sub(o, b"a.*", Some(b"q"), b"9")),
            b"SUB a.* q 9\r\n"
        );
        assert_eq!(bytes(|o| encode_unsub(o, b"9", Some(3))), b"UNSUB 9 3\r\n");
        assert_eq!(bytes(|o| encode_unsub(o, b"9", None)), b"UNSUB 9\r\n");
        assert_eq!(bytes(encode_ok), b"+OK\r\n");
        assert_eq!(
            bytes(|o| encode_err(o, "Parser Error")),
            b"-ERR 'Parser Error'\r\n"
        );
        assert_eq!(bytes(encode_ping), b"PING\r\n");
        assert_eq!(bytes(encode_pong), b"PONG\r\n");
    }

    #[test]
    fn json_lines() {
        let info = bytes(|o| {
            encode_info(
                o,
                &ServerInfo {
                    server_id: "X".into(),
                    ..ServerInfo::default()
                },
            )
        });
        assert!(info.starts_with(b"INFO {\"server_id\":\"X\""));
        assert!(info.ends_with(b"}\r\n"));
        let connect = bytes(|o| encode_connect(o, &ConnectOptions::default()));
        assert!(connect.starts_with(b"CONNECT {"));
        assert!(connect.ends_with(b"}\r\n"));
    }
}
