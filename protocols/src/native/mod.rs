//! The NATS-compatible native protocol: decoders for both directions, encoders, header blocks
//! and the JSON bodies of `CONNECT` and `INFO`.
//!
//! Owns: framing (`\r\n`-terminated control lines, sized payloads), argument syntax, the limits
//! on control lines and payloads, and the exact `-ERR` texts of protocol errors.
//!
//! Must never: do I/O, judge subjects beyond "UTF-8 without control characters" (the server
//! validates subjects and wildcards), decide authorization, or panic on any input.
//!
//! ```text
//! PUB   <subject> [reply] <#bytes>\r\n<payload>\r\n
//! HPUB  <subject> [reply] <#hdr> <#total>\r\nNATS/1.0\r\nK: V\r\n\r\n<payload>\r\n
//! MSG   <subject> <sid> [reply] <#bytes>\r\n<payload>\r\n
//! HMSG  <subject> <sid> [reply] <#hdr> <#total>\r\n<headers><payload>\r\n
//! SUB   <subject> [queue] <sid>\r\n          UNSUB <sid> [max]\r\n
//! CONNECT {json}\r\n   INFO {json}\r\n   PING\r\n   PONG\r\n   +OK\r\n   -ERR '<text>'\r\n
//! ```
//!
//! An HPUB or HMSG with `<#hdr>` 0 carries no header block and decodes as PUB or MSG, as
//! nats-server reads it (nats.js sends one for a JetStream publish without options).

mod client_ops;
mod encode;
mod error;
mod headers;
mod info;
mod line;
mod server_ops;

pub use client_ops::{ClientDecoder, ClientOp};
pub use encode::{
    encode_client_op, encode_connect, encode_err, encode_hmsg, encode_hpub, encode_info,
    encode_msg, encode_ok, encode_ping, encode_pong, encode_pub, encode_server_op, encode_sub,
    encode_unsub,
};
pub use error::ProtocolError;
pub use headers::{HeaderError, HeaderMap, no_responders_block};
pub use info::{ConnectOptions, ServerInfo};
pub use line::Limits;
pub use server_ops::{ServerDecoder, ServerOp};
