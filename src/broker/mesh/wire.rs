//! How a node's appends, expectations and outcomes travel on a link
//! (`canopy_protocols::link`), and back into what the store takes and answers.
//!
//! Must never: lose a field on the way (an append forwarded is stored as the entry
//! node would have stored it).

use std::sync::Arc;

use canopy_protocols::link;

use crate::groups::awaiting::{Await, AwaitOutcome, Missed};

use crate::store::reduce::ReducerKind;
use crate::store::{
    AckCargo, AckTo, AppendOutcome, AppendRequest, Compaction, Durability, Expectation, NewMessage,
    RouteTag,
};

/// A reducer's number on the wire.
const REDUCER_LAST: u8 = 0;
const REDUCER_JSON_MERGE: u8 = 1;

/// The append node `from` forwarded, as this node's store takes it: its ack, when
/// wanted, goes back to `from` (`ACK_REMOTE`), a JetStream ack keeping its shape.
pub fn append_from_wire(from: &str, append: &link::Append<'_>) -> AppendRequest {
    use crate::broker::{ACK_JETSTREAM, ACK_REMOTE};
    let copy = bytes::Bytes::copy_from_slice;
    AppendRequest {
        tenant: Arc::from(append.tenant),
        subject: Arc::from(append.subject),
        messages: append
            .messages
            .iter()
            .map(|m| NewMessage {
                headers: copy(m.headers),
                payload: copy(m.payload),
                flags: m.flags,
            })
            .collect(),
        expect: append.expect.map(expect_from_wire),
        msg_id: append.msg_id.map(Box::from),
        durability: if append.durable {
            Durability::Durable
        } else {
            Durability::Received
        },
        ack: append.ack.map(|flags| AckTo {
            address: bytes::Bytes::from(format!("{from} {}", append.id)),
            flags: ACK_REMOTE | (flags & ACK_JETSTREAM),
            cargo: None,
        }),
        route: RouteTag {
            origin: append.origin,
            flags: append.route_flags,
            reply: append.reply.map(copy),
            publisher: None,
        },
        compaction: append.compaction.map(|c| Compaction {
            every: c.every,
            reducer: if c.reducer == REDUCER_JSON_MERGE {
                ReducerKind::JsonMerge
            } else {
                ReducerKind::Last
            },
            keep_history: c.keep_history,
        }),
        max_versions: append.max_versions,
        retain: append.retain,
    }
}

pub(super) fn parse_remote_ack(address: &[u8]) -> Option<(&str, u64)> {
    let text = std::str::from_utf8(address).ok()?;
    let (node, id) = text.split_once(' ')?;
    Some((node, id.parse().ok()?))
}

pub fn expect_to_wire(expect: Expectation) -> link::Expect {
    match expect {
        Expectation::Version(v) => link::Expect::Version(v),
        Expectation::LastOffset(v) => link::Expect::LastOffset(v),
        Expectation::StreamOffset(v) => link::Expect::StreamOffset(v),
    }
}

pub fn expect_from_wire(expect: link::Expect) -> Expectation {
    match expect {
        link::Expect::Version(v) => Expectation::Version(v),
        link::Expect::LastOffset(v) => Expectation::LastOffset(v),
        link::Expect::StreamOffset(v) => Expectation::StreamOffset(v),
    }
}

pub fn outcome_to_wire(outcome: &AppendOutcome) -> link::Outcome<'_> {
    match outcome {
        AppendOutcome::Stored {
            subject,
            version,
            offset,
            count,
        } => link::Outcome::Stored {
            subject,
            version: *version,
            offset: *offset,
            count: *count as u64,
        },
        AppendOutcome::Duplicate {
            subject,
            version,
            offset,
        } => link::Outcome::Duplicate {
            subject,
            version: *version,
            offset: *offset,
        },
        AppendOutcome::Conflict {
            subject,
            expected,
            current_version,
            current_offset,
        } => link::Outcome::Conflict {
            subject,
            expected: expect_to_wire(*expected),
            current_version: *current_version,
            current_offset: *current_offset,
        },
        AppendOutcome::Failed { reason } => link::Outcome::Failed { reason },
        AppendOutcome::QuotaExceeded { reason } => link::Outcome::QuotaExceeded { reason },
    }
}

pub fn outcome_from_wire(outcome: &link::Outcome<'_>) -> AppendOutcome {
    match *outcome {
        link::Outcome::Stored {
            subject,
            version,
            offset,
            count,
        } => AppendOutcome::Stored {
            subject: Arc::from(subject),
            version,
            offset,
            count: count as usize,
        },
        link::Outcome::Duplicate {
            subject,
            version,
            offset,
        } => AppendOutcome::Duplicate {
            subject: Arc::from(subject),
            version,
            offset,
        },
        link::Outcome::Conflict {
            subject,
            expected,
            current_version,
            current_offset,
        } => AppendOutcome::Conflict {
            subject: Arc::from(subject),
            expected: expect_from_wire(expected),
            current_version,
            current_offset,
        },
        link::Outcome::Failed { reason } => AppendOutcome::Failed {
            reason: reason.to_owned(),
        },
        link::Outcome::QuotaExceeded { reason } => AppendOutcome::QuotaExceeded {
            reason: reason.to_owned(),
        },
    }
}

/// What awaited groups did, on the wire.
pub fn awaited_to_wire(awaited: &AwaitOutcome) -> link::Awaited<'_> {
    link::Awaited {
        passed: awaited.passed.iter().map(|g| &**g).collect(),
        pending: awaited
            .pending
            .iter()
            .map(|(group, why)| {
                let code = Missed::ALL.iter().position(|m| m == why).unwrap_or(0);
                (&**group, code as u8)
            })
            .collect(),
    }
}

/// What awaited groups did, from the wire (an unknown reason reads as a timeout).
pub fn awaited_from_wire(awaited: &link::Awaited<'_>) -> AwaitOutcome {
    AwaitOutcome {
        passed: awaited.passed.iter().map(|g| Box::from(*g)).collect(),
        pending: awaited
            .pending
            .iter()
            .map(|(group, code)| {
                let why = Missed::ALL
                    .get(usize::from(*code))
                    .copied()
                    .unwrap_or(Missed::TimedOut);
                (Box::from(*group), why)
            })
            .collect(),
    }
}

/// Encodes `request` as the `Append` frame `id` for its shard's owner, with the
/// groups a `Canopy-Await` waits for (they run on the owner) and who waits.
pub(super) fn encode_append(id: u64, request: &AppendRequest, frame: &mut Vec<u8>) {
    let awaiting = request
        .ack
        .as_ref()
        .and_then(|ack| ack.cargo.clone().and_then(AckCargo::get::<Await>));
    let groups = awaiting
        .as_deref()
        .map(|awaiting| awaiting.groups.join(","))
        .unwrap_or_default();
    let caller = awaiting.as_deref().and_then(|a| a.caller.as_ref());
    let messages = request
        .messages
        .iter()
        .map(|m| link::AppendMessage {
            headers: &m.headers,
            payload: &m.payload,
            flags: m.flags,
        })
        .collect();
    link::encode(
        &link::Frame::Append(link::Append {
            id,
            tenant: &request.tenant,
            subject: &request.subject,
            expect: request.expect.map(expect_to_wire),
            msg_id: request.msg_id.as_deref(),
            durable: request.durability == Durability::Durable,
            ack: request.ack.as_ref().map(|a| a.flags),
            origin: request.route.origin,
            route_flags: request.route.flags,
            reply: request.route.reply.as_deref(),
            compaction: request.compaction.map(|c| link::Compaction {
                every: c.every,
                reducer: match c.reducer {
                    ReducerKind::Last => REDUCER_LAST,
                    ReducerKind::JsonMerge => REDUCER_JSON_MERGE,
                },
                keep_history: c.keep_history,
            }),
            max_versions: request.max_versions,
            retain: request.retain,
            messages,
            awaits: awaiting.as_deref().map(|awaiting| link::AwaitGroups {
                groups: &groups,
                timeout_ms: awaiting.timeout.as_millis() as u64,
                user: caller.and_then(|c| c.principal().user.as_deref()),
                guest: caller.is_none_or(|c| c.principal().is_guest()),
                client: caller.map_or("", |c| &*c.principal().client),
            }),
        }),
        frame,
    );
}
