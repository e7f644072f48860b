//! The protocol between Canopy nodes of one cluster: length-prefixed binary frames
//! over TCP, one connection per direction between two nodes.
//!
//! A node says who it is (`Hello`), tells every other node the interest its clients'
//! subscriptions make (`Interest`, added or removed, per tenant, pattern and queue
//! group: like NATS routes' RS+ and RS-), forwards a publish for a shard it does not
//! own to the shard's owner (`Append`) and gets its outcome back (`Ack`), and sends
//! each message once to every node with matching interest (`Msg`), which delivers it
//! to its own subscribers and never passes it on. A connection that starts with
//! `Relay` instead of `Hello` is no link: after that one frame it carries the bytes
//! of one MQTT client's connection, which the entry node relays to the owner of the
//! client's tenant.
//!
//! ```text
//! frame   := length:u32 kind:u8 body          (length counts kind and body)
//! str     := length:u16 UTF-8 bytes
//! bytes   := length:u32 bytes
//! opt(x)  := 0 | 1 x
//! ```
//! Integers are big-endian.
//!
//! Must never: allocate for a frame before its length is checked against the
//! decoder's bound, or panic on any input.

use thiserror::Error;

/// The version a node speaks, sent in `Hello`.
pub const VERSION: u8 = 4;

const HELLO: u8 = 1;
const INTEREST_ADD: u8 = 2;
const INTEREST_REMOVE: u8 = 3;
const MSG: u8 = 4;
const APPEND: u8 = 5;
const ACK: u8 = 6;
const CALL: u8 = 7;
const RELAY: u8 = 8;
const BARRIER: u8 = 9;
const PASSED: u8 = 10;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LinkError {
    #[error("a frame of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("a frame ends inside its {0}")]
    Truncated(&'static str),
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
    #[error("a frame has {0} bytes after its last field")]
    Trailing(usize),
    #[error("bad value for {0}")]
    BadValue(&'static str),
}

/// A message for the receiving node's own subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg<'a> {
    pub tenant: &'a str,
    pub subject: &'a str,
    /// The subject receivers are shown, when it is not the one routed on.
    pub shown_as: Option<&'a str>,
    pub reply: Option<&'a [u8]>,
    pub headers: Option<&'a [u8]>,
    pub payload: &'a [u8],
    /// The publishing connection (cluster-wide unique), for no-echo and no-local.
    pub origin: u64,
    /// The publishing connection does not get its own messages (NATS `echo: false`).
    pub no_echo: bool,
    pub flags: u8,
    /// Version and offset of a stored message (0 when live).
    pub version: u64,
    pub offset: u64,
    /// Deliver to the receiver's subscriptions outside queue groups.
    pub plain: bool,
    /// The queue groups the sender chose the receiver for: each gives the message to
    /// one of its members there.
    pub queues: Vec<&'a str>,
}

/// One message of an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendMessage<'a> {
    pub headers: &'a [u8],
    pub payload: &'a [u8],
    pub flags: u8,
}

/// An expectation on an append: which head must hold, and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Version(u64),
    LastOffset(u64),
    StreamOffset(u64),
}

/// Folding into snapshots, as the entry node's policy says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    pub every: u64,
    /// 0: last, 1: JSON merge.
    pub reducer: u8,
    pub keep_history: bool,
}

/// A publish the entry node decided and the shard's owner is to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Append<'a> {
    /// The entry node's handle for the ack.
    pub id: u64,
    pub tenant: &'a str,
    pub subject: &'a str,
    pub expect: Option<Expect>,
    pub msg_id: Option<&'a str>,
    pub durable: bool,
    /// Set when the publisher wants the outcome: the ack's flags.
    pub ack: Option<u32>,
    pub origin: u64,
    pub route_flags: u32,
    pub reply: Option<&'a [u8]>,
    pub compaction: Option<Compaction>,
    pub max_versions: u64,
    pub retain: bool,
    pub messages: Vec<AppendMessage<'a>>,
    /// `Canopy-Await`: the ack waits for these groups on the owner.
    pub awaits: Option<AwaitGroups<'a>>,
}

/// The groups a publish's ack waits for, and who waits (a group the publisher may
/// not read is answered as one that does not exist, so its rights are made again on
/// the owner from its user or its tenant's anonymous rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwaitGroups<'a> {
    /// Group names, comma-separated.
    pub groups: &'a str,
    pub timeout_ms: u64,
    pub user: Option<&'a str>,
    pub guest: bool,
    pub client: &'a str,
}

/// What the awaited groups did: those that passed the message, and those that did
/// not with why (a code the server's groups give meaning to).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Awaited<'a> {
    pub passed: Vec<&'a str>,
    pub pending: Vec<(&'a str, u8)>,
}

/// What came of an append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<'a> {
    Stored {
        subject: &'a str,
        version: u64,
        offset: u64,
        count: u64,
    },
    Duplicate {
        subject: &'a str,
        version: u64,
        offset: u64,
    },
    Conflict {
        subject: &'a str,
        expected: Expect,
        current_version: u64,
        current_offset: u64,
    },
    Failed {
        reason: &'a str,
    },
    QuotaExceeded {
        reason: &'a str,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    Hello {
        version: u8,
        cluster: &'a str,
        node: &'a str,
        proof: Proof,
    },
    Interest {
        add: bool,
        tenant: &'a str,
        /// Native syntax.
        pattern: &'a str,
        queue: Option<&'a str>,
    },
    Msg(Msg<'a>),
    Append(Append<'a>),
    Ack {
        id: u64,
        outcome: Outcome<'a>,
        /// For an append that waited for groups.
        awaited: Option<Awaited<'a>>,
    },
    /// An API call (`$CANOPY.…`, `$JS.…`) for the owner of its tenant's shard, which
    /// answers on the reply subject like any call.
    Call(Call<'a>),
    /// The first and only frame of a relayed MQTT connection: who the client logged
    /// in as at the entry node. Its MQTT bytes follow, CONNECT first.
    Relay(Relay<'a>),
    /// Asks the owner of `tenant`'s shard to answer `Passed` once every append this
    /// link carried before it has been stored and routed (a client's PING after
    /// its publishes, NATS's flush).
    Barrier {
        id: u64,
        tenant: &'a str,
    },
    /// The answer to `Barrier` `id`.
    Passed {
        id: u64,
    },
}

/// What proves a connection's first frame (`Hello`, `Relay`) was made by a node
/// that knows the cluster's secret: when it was made, a nonce, and a MAC over the
/// frame's fields with both (computed and checked outside this codec). All zeros
/// from a node without a secret.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Proof {
    pub time_ms: u64,
    pub nonce: [u8; 16],
    pub mac: [u8; 32],
}

/// A relayed MQTT client: its bytes follow, CONNECT first.
pub const RELAY_MQTT: u8 = 1;
/// A relayed `/ws` client: its WebSocket messages follow, each a length-prefixed
/// frame (`length:u32 kind:u8 body`: text, binary, or close with a code).
pub const RELAY_WS: u8 = 2;

/// A client another node let in, relayed to the owner of its tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relay<'a> {
    /// [`RELAY_MQTT`] or [`RELAY_WS`].
    pub kind: u8,
    pub cluster: &'a str,
    pub tenant: &'a str,
    pub user: Option<&'a str>,
    /// Let in under the tenant's anonymous rules.
    pub guest: bool,
    /// The client's name as it logged in (for `{client_id}` rules); MQTT's is
    /// its CONNECT's.
    pub client: &'a str,
    /// The client's address as the entry node saw it.
    pub peer: &'a str,
    pub proof: Proof,
}

/// An API call another node took from its client, with who made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call<'a> {
    pub tenant: &'a str,
    pub user: Option<&'a str>,
    /// A caller without a user let in under the tenant's anonymous rules.
    pub guest: bool,
    pub client: &'a str,
    pub origin: u64,
    pub operation: &'a str,
    pub reply: Option<&'a str>,
    pub body: &'a [u8],
    /// The calling connection's limits: subject length and tokens, payload bytes,
    /// subscriptions.
    pub limits: [u64; 4],
}

/// Appends `frame`'s bytes to `out`.
pub fn encode(frame: &Frame<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    match frame {
        Frame::Hello {
            version,
            cluster,
            node,
            proof,
        } => {
            out.push(HELLO);
            out.push(*version);
            put_str(out, cluster);
            put_str(out, node);
            put_proof(out, proof);
        }
        Frame::Interest {
            add,
            tenant,
            pattern,
            queue,
        } => {
            out.push(if *add { INTEREST_ADD } else { INTEREST_REMOVE });
            put_str(out, tenant);
            put_str(out, pattern);
            put_opt(out, *queue, put_str);
        }
        Frame::Msg(msg) => {
            out.push(MSG);
            put_str(out, msg.tenant);
            put_str(out, msg.subject);
            put_opt(out, msg.shown_as, put_str);
            put_opt(out, msg.reply, put_bytes);
            put_opt(out, msg.headers, put_bytes);
            put_bytes(out, msg.payload);
            out.extend_from_slice(&msg.origin.to_be_bytes());
            out.push(u8::from(msg.no_echo));
            out.push(msg.flags);
            out.extend_from_slice(&msg.version.to_be_bytes());
            out.extend_from_slice(&msg.offset.to_be_bytes());
            out.push(u8::from(msg.plain));
            out.extend_from_slice(&(msg.queues.len() as u16).to_be_bytes());
            for queue in &msg.queues {
                put_str(out, queue);
            }
        }
        Frame::Append(append) => {
            out.push(APPEND);
            encode_append(append, out);
        }
        Frame::Ack {
            id,
            outcome,
            awaited,
        } => {
            out.push(ACK);
            out.extend_from_slice(&id.to_be_bytes());
            encode_outcome(outcome, out);
            put_opt(out, awaited.as_ref(), |out, awaited| {
                out.extend_from_slice(&(awaited.passed.len() as u32).to_be_bytes());
                for group in &awaited.passed {
                    put_str(out, group);
                }
                out.extend_from_slice(&(awaited.pending.len() as u32).to_be_bytes());
                for (group, why) in &awaited.pending {
                    put_str(out, group);
                    out.push(*why);
                }
            });
        }
        Frame::Call(call) => {
            out.push(CALL);
            put_str(out, call.tenant);
            put_opt(out, call.user, put_str);
            out.push(u8::from(call.guest));
            put_str(out, call.client);
            out.extend_from_slice(&call.origin.to_be_bytes());
            put_str(out, call.operation);
            put_opt(out, call.reply, put_str);
            put_bytes(out, call.body);
            for n in call.limits {
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
        Frame::Relay(relay) => {
            out.push(RELAY);
            out.push(relay.kind);
            put_str(out, relay.cluster);
            put_str(out, relay.tenant);
            put_opt(out, relay.user, put_str);
            out.push(u8::from(relay.guest));
            put_str(out, relay.client);
            put_str(out, relay.peer);
            put_proof(out, &relay.proof);
        }
        Frame::Barrier { id, tenant } => {
            out.push(BARRIER);
            out.extend_from_slice(&id.to_be_bytes());
            put_str(out, tenant);
        }
        Frame::Passed { id } => {
            out.push(PASSED);
            out.extend_from_slice(&id.to_be_bytes());
        }
    }
    let length = (out.len() - start - 4) as u32;
    if let Some(prefix) = out.get_mut(start..start + 4) {
        prefix.copy_from_slice(&length.to_be_bytes());
    }
}

fn encode_append(append: &Append<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(&append.id.to_be_bytes());
    put_str(out, append.tenant);
    put_str(out, append.subject);
    put_opt(out, append.expect.as_ref(), |out, e| put_expect(out, *e));
    put_opt(out, append.msg_id, put_str);
    out.push(u8::from(append.durable));
    put_opt(out, append.ack, |out, flags| {
        out.extend_from_slice(&flags.to_be_bytes())
    });
    out.extend_from_slice(&append.origin.to_be_bytes());
    out.extend_from_slice(&append.route_flags.to_be_bytes());
    put_opt(out, append.reply, put_bytes);
    put_opt(out, append.compaction.as_ref(), |out, c| {
        out.extend_from_slice(&c.every.to_be_bytes());
        out.push(c.reducer);
        out.push(u8::from(c.keep_history));
    });
    out.extend_from_slice(&append.max_versions.to_be_bytes());
    out.push(u8::from(append.retain));
    out.extend_from_slice(&(append.messages.len() as u32).to_be_bytes());
    for message in &append.messages {
        put_bytes(out, message.headers);
        put_bytes(out, message.payload);
        out.push(message.flags);
    }
    put_opt(out, append.awaits.as_ref(), |out, awaits| {
        put_str(out, awaits.groups);
        out.extend_from_slice(&awaits.timeout_ms.to_be_bytes());
        put_opt(out, awaits.user, put_str);
        out.push(u8::from(awaits.guest));
        put_str(out, awaits.client);
    });
}

fn encode_outcome(outcome: &Outcome<'_>, out: &mut Vec<u8>) {
    match outcome {
        Outcome::Stored {
            subject,
            version,
            offset,
            count,
        } => {
            out.push(0);
            put_str(out, subject);
            for n in [version, offset, count] {
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
        Outcome::Duplicate {
            subject,
            version,
            offset,
        } => {
            out.push(1);
            put_str(out, subject);
            for n in [version, offset] {
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
        Outcome::Conflict {
            subject,
            expected,
            current_version,
            current_offset,
        } => {
            out.push(2);
            put_str(out, subject);
            put_expect(out, *expected);
            for n in [current_version, current_offset] {
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
        Outcome::Failed { reason } => {
            out.push(3);
            put_str(out, reason);
        }
        Outcome::QuotaExceeded { reason } => {
            out.push(4);
            put_str(out, reason);
        }
    }
}

fn put_expect(out: &mut Vec<u8>, expect: Expect) {
    let (kind, value) = match expect {
        Expect::Version(v) => (0, v),
        Expect::LastOffset(v) => (1, v),
        Expect::StreamOffset(v) => (2, v),
    };
    out.push(kind);
    out.extend_from_slice(&value.to_be_bytes());
}

fn put_proof(out: &mut Vec<u8>, proof: &Proof) {
    out.extend_from_slice(&proof.time_ms.to_be_bytes());
    out.extend_from_slice(&proof.nonce);
    out.extend_from_slice(&proof.mac);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    // Strings here are names, subjects and reasons, all far below 64 KiB; a longer
    // one is cut at a character boundary rather than corrupting the frame.
    let mut end = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let bytes = s.as_bytes().get(..end).unwrap_or_default();
    out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

fn put_opt<T>(out: &mut Vec<u8>, value: Option<T>, put: impl FnOnce(&mut Vec<u8>, T)) {
    match value {
        None => out.push(0),
        Some(value) => {
            out.push(1);
            put(out, value);
        }
    }
}

/// Decodes the first frame of `buf`: `Ok(None)` until it is whole, else the frame
/// and the bytes it took. A frame longer than `max` is an error, told before its
/// body arrives.
pub fn decode(buf: &[u8], max: usize) -> Result<Option<(Frame<'_>, usize)>, LinkError> {
    let Some(head) = buf.get(..4).and_then(|h| <[u8; 4]>::try_from(h).ok()) else {
        return Ok(None);
    };
    let length = u32::from_be_bytes(head) as usize;
    if length > max {
        return Err(LinkError::TooLarge(length));
    }
    if length == 0 {
        return Err(LinkError::Truncated("kind"));
    }
    let Some(body) = buf.get(4..4 + length) else {
        return Ok(None);
    };
    let mut r = Reader { buf: body };
    let frame = match r.u8("kind")? {
        HELLO => Frame::Hello {
            version: r.u8("version")?,
            cluster: r.str("cluster")?,
            node: r.str("node")?,
            proof: r.proof()?,
        },
        kind @ (INTEREST_ADD | INTEREST_REMOVE) => Frame::Interest {
            add: kind == INTEREST_ADD,
            tenant: r.str("tenant")?,
            pattern: r.str("pattern")?,
            queue: r.opt(|r| r.str("queue"))?,
        },
        MSG => Frame::Msg(decode_msg(&mut r)?),
        APPEND => Frame::Append(decode_append(&mut r)?),
        ACK => Frame::Ack {
            id: r.u64("id")?,
            outcome: decode_outcome(&mut r)?,
            awaited: r.opt(Reader::awaited)?,
        },
        CALL => Frame::Call(Call {
            tenant: r.str("tenant")?,
            user: r.opt(|r| r.str("user"))?,
            guest: r.u8("guest")? != 0,
            client: r.str("client")?,
            origin: r.u64("origin")?,
            operation: r.str("operation")?,
            reply: r.opt(|r| r.str("reply"))?,
            body: r.bytes("body")?,
            limits: [
                r.u64("limits")?,
                r.u64("limits")?,
                r.u64("limits")?,
                r.u64("limits")?,
            ],
        }),
        RELAY => Frame::Relay(Relay {
            kind: r.u8("kind")?,
            cluster: r.str("cluster")?,
            tenant: r.str("tenant")?,
            user: r.opt(|r| r.str("user"))?,
            guest: r.u8("guest")? != 0,
            client: r.str("client")?,
            peer: r.str("peer")?,
            proof: r.proof()?,
        }),
        BARRIER => Frame::Barrier {
            id: r.u64("id")?,
            tenant: r.str("tenant")?,
        },
        PASSED => Frame::Passed { id: r.u64("id")? },
        other => return Err(LinkError::UnknownKind(other)),
    };
    if !r.buf.is_empty() {
        return Err(LinkError::Trailing(r.buf.len()));
    }
    Ok(Some((frame, 4 + length)))
}

fn decode_msg<'a>(r: &mut Reader<'a>) -> Result<Msg<'a>, LinkError> {
    let mut msg = Msg {
        tenant: r.str("tenant")?,
        subject: r.str("subject")?,
        shown_as: r.opt(|r| r.str("shown_as"))?,
        reply: r.opt(|r| r.bytes("reply"))?,
        headers: r.opt(|r| r.bytes("headers"))?,
        payload: r.bytes("payload")?,
        origin: r.u64("origin")?,
        no_echo: r.flag("no_echo")?,
        flags: r.u8("flags")?,
        version: r.u64("version")?,
        offset: r.u64("offset")?,
        plain: r.flag("plain")?,
        queues: Vec::new(),
    };
    let b = r.take(2, "queues")?;
    let count = u16::from_be_bytes(b.try_into().unwrap_or([0; 2])) as usize;
    // Each name takes at least two bytes.
    if count > r.buf.len() / 2 {
        return Err(LinkError::BadValue("queues"));
    }
    msg.queues.reserve(count);
    for _ in 0..count {
        msg.queues.push(r.str("queue")?);
    }
    Ok(msg)
}

fn decode_append<'a>(r: &mut Reader<'a>) -> Result<Append<'a>, LinkError> {
    let id = r.u64("id")?;
    let tenant = r.str("tenant")?;
    let subject = r.str("subject")?;
    let expect = r.opt(Reader::expect)?;
    let msg_id = r.opt(|r| r.str("msg_id"))?;
    let durable = r.flag("durable")?;
    let ack = r.opt(|r| r.u32("ack"))?;
    let origin = r.u64("origin")?;
    let route_flags = r.u32("route_flags")?;
    let reply = r.opt(|r| r.bytes("reply"))?;
    let compaction = r.opt(|r| {
        Ok(Compaction {
            every: r.u64("every")?,
            reducer: r.u8("reducer")?,
            keep_history: r.flag("keep_history")?,
        })
    })?;
    let max_versions = r.u64("max_versions")?;
    let retain = r.flag("retain")?;
    let count = r.u32("count")? as usize;
    // Each message takes at least nine bytes: a count beyond what is left is a lie,
    // and no allocation is made for it.
    if count > r.buf.len() / 9 {
        return Err(LinkError::BadValue("count"));
    }
    let mut messages = Vec::with_capacity(count);
    for _ in 0..count {
        messages.push(AppendMessage {
            headers: r.bytes("headers")?,
            payload: r.bytes("payload")?,
            flags: r.u8("flags")?,
        });
    }
    Ok(Append {
        id,
        tenant,
        subject,
        expect,
        msg_id,
        durable,
        ack,
        origin,
        route_flags,
        reply,
        compaction,
        max_versions,
        retain,
        messages,
        awaits: r.opt(|r| {
            Ok(AwaitGroups {
                groups: r.str("groups")?,
                timeout_ms: r.u64("timeout_ms")?,
                user: r.opt(|r| r.str("user"))?,
                guest: r.flag("guest")?,
                client: r.str("client")?,
            })
        })?,
    })
}

fn decode_outcome<'a>(r: &mut Reader<'a>) -> Result<Outcome<'a>, LinkError> {
    Ok(match r.u8("outcome")? {
        0 => Outcome::Stored {
            subject: r.str("subject")?,
            version: r.u64("version")?,
            offset: r.u64("offset")?,
            count: r.u64("count")?,
        },
        1 => Outcome::Duplicate {
            subject: r.str("subject")?,
            version: r.u64("version")?,
            offset: r.u64("offset")?,
        },
        2 => Outcome::Conflict {
            subject: r.str("subject")?,
            expected: r.expect()?,
            current_version: r.u64("current_version")?,
            current_offset: r.u64("current_offset")?,
        },
        3 => Outcome::Failed {
            reason: r.str("reason")?,
        },
        4 => Outcome::QuotaExceeded {
            reason: r.str("reason")?,
        },
        _ => return Err(LinkError::BadValue("outcome")),
    })
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], LinkError> {
        if self.buf.len() < n {
            return Err(LinkError::Truncated(what));
        }
        let (taken, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(taken)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, LinkError> {
        Ok(self.take(1, what)?.first().copied().unwrap_or(0))
    }

    fn flag(&mut self, what: &'static str) -> Result<bool, LinkError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(LinkError::BadValue(what)),
        }
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, LinkError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes(b.try_into().unwrap_or([0; 4])))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, LinkError> {
        let b = self.take(8, what)?;
        Ok(u64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
    }

    fn proof(&mut self) -> Result<Proof, LinkError> {
        let time_ms = self.u64("proof")?;
        let mut proof = Proof {
            time_ms,
            ..Proof::default()
        };
        proof.nonce.copy_from_slice(self.take(16, "proof")?);
        proof.mac.copy_from_slice(self.take(32, "proof")?);
        Ok(proof)
    }

    fn str(&mut self, what: &'static str) -> Result<&'a str, LinkError> {
        let b = self.take(2, what)?;
        let n = u16::from_be_bytes(b.try_into().unwrap_or([0; 2])) as usize;
        std::str::from_utf8(self.take(n, what)?).map_err(|_| LinkError::NotUtf8(what))
    }

    fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], LinkError> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }

    fn opt<T>(
        &mut self,
        read: impl FnOnce(&mut Self) -> Result<T, LinkError>,
    ) -> Result<Option<T>, LinkError> {
        match self.u8("option")? {
            0 => Ok(None),
            1 => read(self).map(Some),
            _ => Err(LinkError::BadValue("option")),
        }
    }

    fn expect(&mut self) -> Result<Expect, LinkError> {
        let kind = self.u8("expect")?;
        let value = self.u64("expect")?;
        match kind {
            0 => Ok(Expect::Version(value)),
            1 => Ok(Expect::LastOffset(value)),
            2 => Ok(Expect::StreamOffset(value)),
            _ => Err(LinkError::BadValue("expect")),
        }
    }

    fn awaited(&mut self) -> Result<Awaited<'a>, LinkError> {
        let mut awaited = Awaited::default();
        let passed = self.u32("passed")? as usize;
        // Each name takes at least four bytes: no allocation for a count that lies.
        if passed > self.buf.len() / 4 {
            return Err(LinkError::BadValue("passed"));
        }
        for _ in 0..passed {
            awaited.passed.push(self.str("passed")?);
        }
        let pending = self.u32("pending")? as usize;
        if pending > self.buf.len() / 5 {
            return Err(LinkError::BadValue("pending"));
        }
        for _ in 0..pending {
            awaited
                .pending
                .push((self.str("pending")?, self.u8("why")?));
        }
        Ok(awaited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> Vec<Frame<'static>> {
        vec![
            Frame::Hello {
                version: VERSION,
                cluster: "prod",
                node: "a",
                proof: Proof {
                    time_ms: 1_796_000_000_000,
                    nonce: [7; 16],
                    mac: [9; 32],
                },
            },
            Frame::Interest {
                add: true,
                tenant: "acme",
                pattern: "devices.*.temp",
                queue: Some("workers"),
            },
            Frame::Interest {
                add: false,
                tenant: "acme",
                pattern: ">",
                queue: None,
            },
            Frame::Msg(Msg {
                tenant: "acme",
                subject: "devices.1.temp",
                shown_as: None,
                reply: Some(b"_INBOX.x.1"),
                headers: Some(b"NATS/1.0\r\nA: b\r\n\r\n"),
                payload: b"21.5",
                origin: 1 << 40,
                no_echo: true,
                flags: 3,
                version: 7,
                offset: 99,
                plain: true,
                queues: vec!["workers", "audit"],
            }),
            Frame::Append(Append {
                id: 12,
                tenant: "acme",
                subject: "orders.1",
                expect: Some(Expect::Version(4)),
                msg_id: Some("m-1"),
                durable: true,
                ack: Some(1),
                origin: 5,
                route_flags: 2,
                reply: Some(b"_INBOX.r"),
                compaction: Some(Compaction {
                    every: 100,
                    reducer: 1,
                    keep_history: true,
                }),
                max_versions: 10,
                retain: false,
                messages: vec![
                    AppendMessage {
                        headers: b"",
                        payload: b"one",
                        flags: 0,
                    },
                    AppendMessage {
                        headers: b"NATS/1.0\r\n\r\n",
                        payload: b"",
                        flags: 1,
                    },
                ],
                awaits: Some(AwaitGroups {
                    groups: "billing,search",
                    timeout_ms: 2000,
                    user: Some("ana"),
                    guest: false,
                    client: "ana's laptop",
                }),
            }),
            Frame::Ack {
                id: 12,
                outcome: Outcome::Stored {
                    subject: "orders.1",
                    version: 5,
                    offset: 100,
                    count: 2,
                },
                awaited: Some(Awaited {
                    passed: vec!["billing"],
                    pending: vec![("search", 1)],
                }),
            },
            Frame::Ack {
                id: 13,
                awaited: None,
                outcome: Outcome::Conflict {
                    subject: "orders.1",
                    expected: Expect::StreamOffset(3),
                    current_version: 5,
                    current_offset: 100,
                },
            },
            Frame::Ack {
                id: 14,
                outcome: Outcome::Failed { reason: "fenced" },
                awaited: None,
            },
            Frame::Call(Call {
                tenant: "acme",
                user: Some("ana"),
                guest: false,
                client: "ana's laptop",
                origin: 77,
                operation: "replay",
                reply: Some("_INBOX.q.1"),
                body: br#"{"subject":"orders.1"}"#,
                limits: [4096, 128, 1 << 20, 0],
            }),
            Frame::Relay(Relay {
                kind: RELAY_WS,
                cluster: "prod",
                tenant: "acme",
                user: None,
                guest: true,
                client: "ws-17",
                peer: "10.0.0.9:51234",
                proof: Proof::default(),
            }),
            Frame::Barrier {
                id: 15,
                tenant: "acme",
            },
            Frame::Passed { id: 15 },
        ]
    }

    #[test]
    fn every_frame_comes_back_as_it_went() {
        let mut wire = Vec::new();
        for frame in frames() {
            encode(&frame, &mut wire);
        }
        let mut at = 0;
        for frame in frames() {
            let (decoded, used) = decode(&wire[at..], 1 << 20).unwrap().unwrap();
            assert_eq!(decoded, frame);
            at += used;
        }
        assert_eq!(at, wire.len());
    }

    #[test]
    fn a_partial_frame_waits_and_no_prefix_is_an_error() {
        let mut wire = Vec::new();
        for frame in frames() {
            wire.clear();
            encode(&frame, &mut wire);
            for cut in 0..wire.len() {
                assert_eq!(decode(&wire[..cut], 1 << 20), Ok(None), "cut at {cut}");
            }
        }
    }

    #[test]
    fn a_frame_over_the_bound_is_refused_before_its_body_comes() {
        let wire = (1u32 << 30).to_be_bytes();
        assert_eq!(decode(&wire, 1 << 20), Err(LinkError::TooLarge(1 << 30)));
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut wire = Vec::new();
        for frame in frames() {
            encode(&frame, &mut wire);
        }
        for _ in 0..20_000 {
            let mut copy = wire.clone();
            for _ in 0..4 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let at = (rng as usize) % copy.len();
                copy[at] = (rng >> 32) as u8;
            }
            let mut at = 0;
            while let Ok(Some((_, used))) = decode(&copy[at..], 1 << 20) {
                at += used;
            }
        }
    }
}
