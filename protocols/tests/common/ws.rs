//! Checks one `/ws` request text the way the fuzzer and the corpus test both do: the decoder
//! must not panic; an op must encode back to a text that decodes to the same op, and respect
//! the limits; an error must be typed (a kind, the code it maps to, a bounded sentence).
//!
//! Shared by `tests/ws_corpus.rs` (as `common::ws`) and the `ws_client` fuzz target
//! (included by path), so it uses nothing but `std` and `canopy_protocols`.
//!
//! Must never: use randomness (a failure must replay), or accept an error without a kind.

use canopy_protocols::native::HeaderMap;
use canopy_protocols::ws::{
    ClientOp, ErrorCode, WsDecodeError, WsErrorKind, WsLimits, decode_client, encode_client,
};

/// Small limits so mutations reach them: the `*_too_large` seeds are just past them.
pub const LIMITS: WsLimits = WsLimits {
    max_text: 512,
    max_payload: 256,
};

/// An error's sentence is at most this long, whatever the text.
pub const MAX_MESSAGE: usize = 1024;

/// Decodes `text` with [`LIMITS`] and checks the outcome (panics when a check fails).
pub fn check(text: &str) -> Result<ClientOp<'_>, WsDecodeError> {
    let outcome = decode_client(text, &LIMITS);
    match &outcome {
        Ok(op) => check_op(op),
        Err(error) => check_error(text, error),
    }
    outcome
}

fn check_op(op: &ClientOp<'_>) {
    let mut again = String::new();
    encode_client(&mut again, op);
    // The text written may be longer than the one read (escapes, base64 for bytes): only
    // the text limit is lifted.
    let roomy = WsLimits {
        max_text: usize::MAX,
        ..LIMITS
    };
    assert_eq!(
        decode_client(&again, &roomy).as_ref(),
        Ok(op),
        "re-encoded as {again}"
    );
    match op {
        ClientOp::Publish(publish) => {
            assert!(publish.size() <= LIMITS.max_payload, "{publish:?}");
            let block = publish.header_block();
            if !block.is_empty() {
                let parsed = HeaderMap::parse(block)
                    .unwrap_or_else(|e| panic!("{e}: {:?}", block.escape_ascii().to_string()));
                assert!(!publish.data.is_json() || parsed.get("Content-Type").is_some());
            }
        }
        ClientOp::SnapshotPut(put) => assert!(put.data.len() <= LIMITS.max_payload),
        _ => {}
    }
}

fn check_error(text: &str, error: &WsDecodeError) {
    assert!(!error.message.is_empty(), "{error:?}");
    assert!(
        error.message.len() <= MAX_MESSAGE,
        "{}",
        error.message.len()
    );
    match error.kind {
        WsErrorKind::TooLarge { size, max } => {
            assert_eq!((size, max), (text.len(), LIMITS.max_text));
            assert_eq!(error.id, None);
        }
        WsErrorKind::PayloadTooLarge { size, max } => {
            assert!(size > max && max == LIMITS.max_payload, "{error:?}");
        }
        WsErrorKind::NotText => panic!("a text is never binary: {error:?}"),
        _ => assert!(text.len() <= LIMITS.max_text),
    }
    let expected = match error.kind {
        WsErrorKind::TooLarge { .. } | WsErrorKind::PayloadTooLarge { .. } => ErrorCode::TooLarge,
        _ => ErrorCode::BadRequest,
    };
    assert_eq!(error.code(), expected);
}
