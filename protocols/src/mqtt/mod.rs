//! MQTT 3.1 (`MQIsdp`), 3.1.1 and 5.0 framing: a decoder for both directions and an
//! encoder, written with nom, free of I/O.
//!
//! Owns: fixed headers and remaining lengths, every control packet of the three
//! levels (v5 AUTH included), v5 properties and which packet may carry which, the
//! reserved-flag and well-formedness rules of the specification, and the packet size
//! limit (checked from the fixed header, before the body is buffered).
//!
//! Must never: do I/O, keep session state beyond the negotiated level, judge topic
//! names beyond what the specification makes a malformed packet (the server maps and
//! authorizes them), or panic on any input.

mod decode;
mod encode;
mod error;
mod packet;
mod properties;
mod wire;

pub use decode::Decoder;
pub use encode::{encode, encode_publish, encoded_len};
pub use error::{DecodeError, EncodeError};
pub use packet::{
    Ack, Auth, ByteStr, ConnAck, Connect, Disconnect, Level, Packet, Properties, Publish, QoS,
    SubAck, Subscribe, SubscribeFilter, UnsubAck, Unsubscribe, Will, reason,
};
