//! The server's namespaces: the one rule every front end applies to a publish.
//!
//! A subject whose first token is `$CANOPY`, `$SYS`, `$JS` or `$DLQ` belongs to the
//! server: `$CANOPY.` is the request/reply API, `$SYS` its events, `$JS` the
//! JetStream API and `$DLQ` dead letters. No client publishes a message into them on
//! any front end; on the native protocol a publish to `$CANOPY.<op>` is an API call,
//! and so is one to `$JS.API.…` or `$JS.ACK.…` (the JetStream subset, `api::jetstream`).
//! Other `$`-subjects are ordinary subjects (MQTT's rule that a leading wildcard
//! never matches them lives in the trie).

/// The request/reply API's prefix: `$CANOPY.<op>`.
pub const API_PREFIX: &str = "$CANOPY.";
/// JetStream's API calls: `$JS.API.<call>`.
pub const JS_API_PREFIX: &str = "$JS.API.";
pub use crate::broker::groups::jetstream::JS_ACK_PREFIX;

/// First tokens of the server's namespaces.
const RESERVED: [&str; 4] = ["$CANOPY", "$SYS", "$JS", "$DLQ"];

/// Whether `subject` (native rendering) is in a namespace of the server's.
#[inline]
pub fn is_reserved(subject: &str) -> bool {
    // Nearly every subject answers at the first byte.
    if !subject.starts_with('$') {
        return false;
    }
    let first = subject.split('.').next().unwrap_or(subject);
    RESERVED.contains(&first)
}

/// The API operation a native publish calls: `<op>` of `$CANOPY.<op>`, or the whole
/// subject of a JetStream API call or ack (`$JS.API.…`, `$JS.ACK.…`).
pub fn is_api_call(subject: &str) -> Option<&str> {
    if is_jetstream_call(subject) {
        return Some(subject);
    }
    subject.strip_prefix(API_PREFIX)
}

/// Whether a native publish to `subject` is a JetStream API call or ack.
pub fn is_jetstream_call(subject: &str) -> bool {
    subject.starts_with(JS_API_PREFIX) || subject.starts_with(JS_ACK_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_servers_first_tokens_are_reserved() {
        for subject in ["$CANOPY.get", "$SYS", "$SYS.x", "$JS.API.x", "$DLQ.g.s"] {
            assert!(is_reserved(subject), "{subject}");
        }
        for subject in [
            "$foo.bar",
            "$SYSTEM.x",
            "a.$SYS",
            "_INBOX.x",
            "orders.1",
            "$CANOPYX",
        ] {
            assert!(!is_reserved(subject), "{subject}");
        }
        assert_eq!(is_api_call("$CANOPY.get"), Some("get"));
        assert_eq!(is_api_call("$SYS.x"), None);
        assert_eq!(is_api_call("$JS.API.INFO"), Some("$JS.API.INFO"));
        assert_eq!(
            is_api_call("$JS.ACK.default.c.1.2.3.4.5"),
            Some("$JS.ACK.default.c.1.2.3.4.5")
        );
        assert_eq!(is_api_call("$JS.EVENT.x"), None);
    }
}
