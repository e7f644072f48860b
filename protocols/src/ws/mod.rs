//! The JSON messages of the `/ws` WebSocket API (docs/websocket.md): requests from clients
//! decoded into typed ops, and every answer and delivery the server sends, encoded.
//!
//! Owns: the fields of each op and their types, the error codes and sentences for requests
//! that cannot be read, the size limits on a request and on the message it carries, the
//! header block a publish is stored with, and the exact text of every server frame (key
//! order included), which the browser client (`/canopy.js`) and the console read.
//!
//! Must never: do I/O, judge subjects or patterns beyond "a string" (the server parses them
//! with its subject limits), decide authorization, change the bytes of inline JSON, or panic
//! on any input.
//!
//! ```text
//! client: {"op":"pub","id":"p1","subject":"a.b","data":{"t":21.5},"expect_version":3}
//! server: {"id":"p1","offset":9,"op":"ok","stored":true,"subject":"a.b","version":4}
//!         {"op":"msg","sid":1,"subject":"a.b","version":4,"offset":9,"headers":{…},"data":{"t":21.5}}
//!         {"code":"conflict","current_version":4,"id":"p2","message":"a.b is at version 4","op":"error","subject":"a.b"}
//! ```

mod client;
mod error;
mod json;
mod server;

pub use client::{
    AckKind, ClientOp, DEFAULT_PAGE, Data, Get, GroupAck, GroupNext, MAX_PAGE, OPS, Publish,
    Replay, SnapshotGet, SnapshotPut, Start, Subjects, Subscribe, Target, Unsubscribe, WsLimits,
    decode_client, encode_client,
};
pub use error::{ErrorCode, WsDecodeError, WsErrorKind};
pub use serde_json::value::RawValue;
pub use server::{
    Delivery, GroupDelivery, MSG_HEAD, ServerFrame, SnapshotBody, StoredMessage, SubjectHead,
    encode_conflict, encode_error, encode_group_done, encode_group_msg, encode_message, encode_msg,
    encode_msg_tail, encode_msg_with_tail, encode_ok, encode_page, encode_published, encode_server,
    encode_snapshot, encode_snapshot_first, encode_snapshot_stored, encode_stored, encode_subjects,
    encode_subscribed,
};

#[cfg(test)]
mod tests;
