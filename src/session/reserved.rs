//! The server's namespaces: the one rule every front end applies to a publish.
//!
//! A subject whose first token is `$CANOPY`, `$SYS`, `$JS` or `$DLQ` belongs to the
//! server: `$CANOPY.` is the request/reply API, `$SYS` its events, `$JS` the
//! JetStream API and `$DLQ` dead letters. No client publishes a message into them on
//! any front end; on the native protocol a publish to `$CANOPY.<op>` is an API call.
//! Other `$`-subjects are ordinary subjects (MQTT's rule that a leading wildcard
//! never matches them lives in the trie).

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

/// The API operation a native publish to `$CANOPY.<op>` calls.
pub fn is_api_call(subject: &str) -> Option<&str> {
    subject.strip_prefix(crate::api::PREFIX)
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
    }
}
