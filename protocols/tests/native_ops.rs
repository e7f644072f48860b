//! Wire-level tests of the native codec: every operation both ways, case-insensitivity,
//! limits, each error, split-anywhere equivalence, and encode/decode round trips.

mod common;

use bytes::{Bytes, BytesMut};
use canopy_protocols::native::*;
use common::stream::{OutcomeOf, assert_every_split, bytewise, run, whole};
use proptest::prelude::*;

fn small() -> Limits {
    Limits {
        max_control_line: 64,
        max_payload: 32,
    }
}

fn client(input: &[u8]) -> OutcomeOf<ClientDecoder> {
    whole(&ClientDecoder::new(Limits::default()), input)
}

fn server(input: &[u8]) -> OutcomeOf<ServerDecoder> {
    whole(&ServerDecoder::new(Limits::default()), input)
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

const MIXED_CLIENT: &[u8] = b"CONNECT {\"verbose\":false,\"headers\":true,\"name\":\"t\"}\r\n\
PING\r\npong\nsub foo.* 1\r\nSUB foo q 2\r\nPUB foo 5\r\nhello\r\nPuB foo r 0\r\n\r\n\
HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\nhpub foo r 19 21\r\nNATS/1.0\r\nA: bc\r\n\r\nhi\r\n\
UNSUB 1\r\nunsub 2 10\r\nPUB a 4\r\n\r\n\r\n\r\n";

const MIXED_SERVER: &[u8] = b"INFO {\"server_id\":\"S\",\"version\":\"2.10.0\",\"proto\":1,\"headers\":true,\"max_payload\":1048576}\r\n\
+OK\r\nPING\r\npong\nMSG foo 1 5\r\nhello\r\nmsg foo 2 r 0\r\n\r\n\
HMSG foo 3 12 14\r\nNATS/1.0\r\n\r\nhi\r\nHMSG foo 3 r 16 16\r\nNATS/1.0 503\r\n\r\n\r\n\
-ERR 'Slow Consumer'\r\n";

#[test]
fn mixed_client_stream_decodes_every_op() {
    let out = client(MIXED_CLIENT);
    assert_eq!(out.error, None);
    assert_eq!(out.left, 0);
    let ops = out.frames;
    assert_eq!(ops.len(), 12);
    assert!(matches!(&ops[0], ClientOp::Connect(c) if c.headers && c.name.as_deref() == Some("t")));
    assert_eq!(ops[1], ClientOp::Ping);
    assert_eq!(ops[2], ClientOp::Pong);
    assert_eq!(
        ops[4],
        ClientOp::Sub {
            subject: b("foo"),
            queue: Some(b("q")),
            sid: b("2")
        }
    );
    assert_eq!(
        ops[6],
        ClientOp::Pub {
            subject: b("foo"),
            reply: Some(b("r")),
            payload: Bytes::new()
        }
    );
    assert_eq!(
        ops[8],
        ClientOp::HPub {
            subject: b("foo"),
            reply: Some(b("r")),
            headers: b("NATS/1.0\r\nA: bc\r\n\r\n"),
            payload: b("hi")
        }
    );
    assert_eq!(
        ops[10],
        ClientOp::Unsub {
            sid: b("2"),
            max_msgs: Some(10)
        }
    );
    assert_eq!(
        ops[11],
        ClientOp::Pub {
            subject: b("a"),
            reply: None,
            payload: b("\r\n\r\n")
        }
    );
}

#[test]
fn mixed_server_stream_decodes_every_op() {
    let out = server(MIXED_SERVER);
    assert_eq!(out.error, None);
    assert_eq!(out.left, 0);
    let ops = out.frames;
    assert_eq!(ops.len(), 9);
    assert!(matches!(&ops[0], ServerOp::Info(i) if i.server_id == "S" && i.proto == 1));
    assert_eq!(ops[1], ServerOp::Ok);
    assert_eq!(ops[2], ServerOp::Ping);
    assert_eq!(ops[3], ServerOp::Pong);
    assert_eq!(
        ops[7],
        ServerOp::HMsg {
            subject: b("foo"),
            sid: b("3"),
            reply: Some(b("r")),
            headers: Bytes::from_static(no_responders_block()),
            payload: Bytes::new()
        }
    );
    assert_eq!(ops[8], ServerOp::Err("Slow Consumer".into()));
}

#[test]
fn split_anywhere_gives_the_same_frames() {
    let decoder = ClientDecoder::new(Limits::default());
    assert_every_split(&decoder, MIXED_CLIENT, &client(MIXED_CLIENT));
    let decoder = ServerDecoder::new(Limits::default());
    assert_every_split(&decoder, MIXED_SERVER, &server(MIXED_SERVER));
}

#[test]
fn split_anywhere_gives_the_same_error() {
    let cases: &[&[u8]] = &[
        b"PING\r\nPUB a 1\r\nxy\r\n",
        b"PING\r\nPUB a 40\r\n",
        b"PING\r\nSUB aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa 1\r\n",
        b"PING\r\nSUB aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        b"PING\r\nHPUB a 12 12\r\nNOTS/1.0\r\n\r\n\r\n",
        b"PING\r\nBOGUS\r\n",
        b"PING\r\nCONNECT {]\r\n",
    ];
    let decoder = ClientDecoder::new(small());
    for case in cases {
        let expected = whole(&decoder, case);
        assert!(expected.error.is_some(), "{case:?}");
        assert_every_split(&decoder, case, &expected);
    }
}

#[test]
fn control_line_limit_is_exact() {
    let decoder = ClientDecoder::new(small());
    // "SUB " + subject + " 1" = 64 bytes: allowed; 65: rejected.
    let ok = format!("SUB {} 1\r\n", "a".repeat(58));
    let out = whole(&decoder, ok.as_bytes());
    assert_eq!(out.error, None);
    assert_eq!(out.frames.len(), 1);
    let long = format!("SUB {} 1\r\n", "a".repeat(59));
    let out = whole(&decoder, long.as_bytes());
    assert_eq!(out.error, Some(ProtocolError::MaxControlLineExceeded));
    // Without any terminator yet, 66 buffered bytes are already too many.
    let out = whole(&decoder, &[b'a'; 66]);
    assert_eq!(out.error, Some(ProtocolError::MaxControlLineExceeded));
    let out = whole(&decoder, &[b'a'; 65]);
    assert_eq!(out.error, None);
    assert_eq!(out.left, 65);
}

#[test]
fn payload_limit_is_checked_before_the_payload() {
    let decoder = ClientDecoder::new(small());
    let out = whole(&decoder, b"PUB a 33\r\n");
    assert_eq!(
        out.error,
        Some(ProtocolError::MaxPayloadViolation { size: 33, max: 32 })
    );
    let out = whole(&decoder, b"HPUB a 12 33\r\n");
    assert_eq!(
        out.error,
        Some(ProtocolError::MaxPayloadViolation { size: 33, max: 32 })
    );
    let out = whole(&ServerDecoder::new(small()), b"MSG a 1 33\r\n");
    assert_eq!(
        out.error,
        Some(ProtocolError::MaxPayloadViolation { size: 33, max: 32 })
    );
    let payload = [b'x'; 32];
    let mut frame = BytesMut::new();
    encode_pub(&mut frame, b"a", None, &payload);
    let out = bytewise(&decoder, &frame);
    assert_eq!(out.error, None);
    assert_eq!(out.frames.len(), 1);
}

#[test]
fn each_error_and_its_nats_text() {
    let parser = |input: &[u8]| {
        let out = client(input);
        match out.error {
            Some(e @ ProtocolError::Parser(_)) => assert_eq!(e.nats_text(), "Parser Error"),
            other => panic!("{:?}: expected a parser error, got {other:?}", input),
        }
    };
    parser(b"PUB a -1\r\n");
    parser(b"PUB a +1\r\n");
    parser(b"PUB a 1x\r\n");
    parser(b"PUB a 99999999999999999999999\r\n");
    parser(b"PUB a\r\n");
    parser(b"PUB a b c 1\r\n");
    parser(b"PUB a 1\r\nxy\r\n");
    parser(b"PUB a\x01 1\r\nx\r\n");
    parser(b"PUB \xc3\x28 1\r\nx\r\n");
    parser(b"HPUB a 13 12\r\n");
    parser(b"HPUB a 5 12\r\n");
    parser(b"HPUB a 12 12\r\nNATS/2.0\r\n\r\n\r\n");
    parser(b"SUB a\r\n");
    parser(b"SUB a b c d\r\n");
    parser(b"UNSUB\r\n");
    parser(b"UNSUB 1 -5\r\n");
    parser(b"CONNECT\r\n");
    parser(b"CONNECT {\"verbose\":1}\r\n");
    parser(b"CONNECT not json\r\n");
    parser(b"PING now\r\n");

    for input in [
        &b"XPUB a 1\r\n"[..],
        b"\r\n",
        b"\tPING\r\n",
        b"INFO {}\r\n",
        b"+OK\r\n",
    ] {
        let e = client(input).error.expect("error");
        assert_eq!(e, ProtocolError::UnknownOperation);
        assert_eq!(e.nats_text(), "Unknown Protocol Operation");
    }
    for input in [&b"SUB a 1\r\n"[..], b"CONNECT {}\r\n"] {
        assert_eq!(server(input).error, Some(ProtocolError::UnknownOperation));
    }
    assert!(matches!(
        server(b"INFO {]\r\n").error,
        Some(ProtocolError::Parser(_))
    ));
    assert!(matches!(
        server(b"MSG a 1 r x 1\r\n").error,
        Some(ProtocolError::Parser(_))
    ));
}

#[test]
fn operation_names_are_case_insensitive() {
    for verb in ["PING", "ping", "PiNg", "pINGs"] {
        let out = client(format!("{verb}\r\n").as_bytes());
        if verb == "pINGs" {
            assert_eq!(out.error, Some(ProtocolError::UnknownOperation));
        } else {
            assert_eq!(out.frames, [ClientOp::Ping]);
        }
    }
    for verb in ["pub", "PUB", "Pub", "pUB"] {
        let out = client(format!("{verb} s 1\r\nx\r\n").as_bytes());
        assert_eq!(out.frames.len(), 1, "{verb}");
    }
    for verb in ["hmsg", "HMsg"] {
        let out = server(format!("{verb} s 1 12 12\r\nNATS/1.0\r\n\r\n\r\n").as_bytes());
        assert_eq!(out.frames.len(), 1, "{verb}");
    }
}

#[test]
fn payload_bytes_are_zero_copy() {
    let mut d = ClientDecoder::default();
    let mut buf = BytesMut::with_capacity(64);
    buf.extend_from_slice(b"PUB a 5\r\nhello\r\n");
    let base = buf.as_ptr() as usize;
    let Some(ClientOp::Pub { payload, .. }) = d.decode(&mut buf).unwrap() else {
        panic!("no pub")
    };
    assert_eq!(payload.as_ptr() as usize, base + 9);
}

#[test]
fn header_map_reads_what_hpub_carried() {
    let mut h = HeaderMap::new();
    h.append("Nats-Msg-Id", "42");
    h.append("X", "1");
    let mut headers = BytesMut::new();
    h.encode(&mut headers);
    let mut wire = BytesMut::new();
    encode_hpub(&mut wire, b"a", None, &headers, b"body");
    let out = client(&wire);
    let Some(ClientOp::HPub {
        headers, payload, ..
    }) = out.frames.first()
    else {
        panic!("{out:?}")
    };
    assert_eq!(payload, "body");
    assert_eq!(
        HeaderMap::parse(headers).unwrap().get("Nats-Msg-Id"),
        Some("42")
    );
}

fn token() -> impl Strategy<Value = Bytes> {
    "[a-zA-Z0-9_.*>$-]{1,12}".prop_map(|s| Bytes::from(s.into_bytes()))
}

fn header_block() -> impl Strategy<Value = Bytes> {
    prop::collection::vec(("[A-Za-z-]{1,8}", "[ -~]{0,8}"), 0..3).prop_map(|entries| {
        let mut h = HeaderMap::new();
        for (k, v) in entries {
            h.append(k, v.trim());
        }
        let mut out = BytesMut::new();
        h.encode(&mut out);
        out.freeze()
    })
}

fn client_op() -> impl Strategy<Value = ClientOp> {
    let payload = prop::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from);
    prop_oneof![
        Just(ClientOp::Ping),
        Just(ClientOp::Pong),
        ("[a-z]{0,6}", any::<bool>(), any::<bool>()).prop_map(|(name, verbose, echo)| {
            ClientOp::Connect(Box::new(ConnectOptions {
                name: (!name.is_empty()).then_some(name),
                verbose,
                echo,
                ..ConnectOptions::default()
            }))
        }),
        (token(), prop::option::of(token()), payload.clone()).prop_map(
            |(subject, reply, payload)| {
                ClientOp::Pub {
                    subject,
                    reply,
                    payload,
                }
            }
        ),
        (token(), prop::option::of(token()), header_block(), payload).prop_map(
            |(subject, reply, headers, payload)| ClientOp::HPub {
                subject,
                reply,
                headers,
                payload
            }
        ),
        (token(), prop::option::of(token()), token()).prop_map(|(subject, queue, sid)| {
            ClientOp::Sub {
                subject,
                queue,
                sid,
            }
        }),
        (token(), prop::option::of(any::<u64>()))
            .prop_map(|(sid, max_msgs)| ClientOp::Unsub { sid, max_msgs }),
    ]
}

fn server_op() -> impl Strategy<Value = ServerOp> {
    let payload = prop::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from);
    prop_oneof![
        Just(ServerOp::Ping),
        Just(ServerOp::Pong),
        Just(ServerOp::Ok),
        "[ -&(-~]{0,20}".prop_map(|t| ServerOp::Err(t.trim_matches([' ', '\t']).to_owned())),
        (
            "[a-zA-Z0-9]{0,8}",
            any::<u16>(),
            any::<u64>(),
            prop::option::of("[a-z]{1,4}")
        )
            .prop_map(
                |(server_id, port, client_id, nonce)| ServerOp::Info(Box::new(ServerInfo {
                    server_id,
                    port,
                    client_id,
                    nonce,
                    max_payload: 1024,
                    ..ServerInfo::default()
                }))
            ),
        (token(), token(), prop::option::of(token()), payload.clone()).prop_map(
            |(subject, sid, reply, payload)| ServerOp::Msg {
                subject,
                sid,
                reply,
                payload
            }
        ),
        (
            token(),
            token(),
            prop::option::of(token()),
            header_block(),
            payload
        )
            .prop_map(|(subject, sid, reply, headers, payload)| ServerOp::HMsg {
                subject,
                sid,
                reply,
                headers,
                payload
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn client_ops_round_trip(ops in prop::collection::vec(client_op(), 1..6), cut in any::<prop::sample::Index>()) {
        let mut wire = BytesMut::new();
        for op in &ops {
            encode_client_op(&mut wire, op);
        }
        let decoder = ClientDecoder::new(Limits::default());
        let out = whole(&decoder, &wire);
        prop_assert_eq!(out.error, None);
        prop_assert_eq!(&out.frames, &ops);
        let at = cut.index(wire.len()).max(1);
        let split = run(&decoder, &wire, &mut [at].into_iter());
        prop_assert_eq!(split.frames, ops);
    }

    #[test]
    fn server_ops_round_trip(ops in prop::collection::vec(server_op(), 1..6), cut in any::<prop::sample::Index>()) {
        let mut wire = BytesMut::new();
        for op in &ops {
            encode_server_op(&mut wire, op);
        }
        let decoder = ServerDecoder::new(Limits::default());
        let out = whole(&decoder, &wire);
        prop_assert_eq!(out.error, None);
        prop_assert_eq!(&out.frames, &ops);
        let at = cut.index(wire.len()).max(1);
        let split = run(&decoder, &wire, &mut [at].into_iter());
        prop_assert_eq!(split.frames, ops);
    }
}
