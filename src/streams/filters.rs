//! How two subject filters (native patterns) relate: whether some subject matches
//! both ([`overlap`]: two streams may not hold one subject), and whether every subject
//! one matches the other matches too ([`within`]: a consumer reads inside its
//! stream). Pure functions over tokens; they must never allocate per call beyond the
//! token split. As everywhere in Canopy, a leading wildcard never matches a subject
//! whose first token starts with `$` (`>` does not hold `$KV.cfg.a`).

/// Whether some subject matches both `a` and `b`.
pub fn overlap(a: &str, b: &str) -> bool {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.split('.').collect(), b.split('.').collect());
    if dollar_under_wildcard(&a, &b) || dollar_under_wildcard(&b, &a) {
        return false;
    }
    let mut i = 0;
    loop {
        match (a.get(i), b.get(i)) {
            // `>` takes one or more tokens: whatever the other has left, if anything.
            (Some(&">"), Some(_)) | (Some(_), Some(&">")) => return true,
            (Some(x), Some(y)) => {
                if *x != "*" && *y != "*" && x != y {
                    return false;
                }
            }
            (None, None) => return true,
            _ => return false,
        }
        i += 1;
    }
}

/// Whether every subject `inner` matches is matched by `outer`.
pub fn within(inner: &str, outer: &str) -> bool {
    let (inner, outer): (Vec<&str>, Vec<&str>) =
        (inner.split('.').collect(), outer.split('.').collect());
    if dollar_under_wildcard(&inner, &outer) {
        return false;
    }
    let mut i = 0;
    loop {
        match (inner.get(i), outer.get(i)) {
            (Some(_), Some(&">")) => return true,
            (Some(&">"), Some(_)) => return false,
            (Some(x), Some(&"*")) => {
                if *x == ">" {
                    return false;
                }
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return false;
                }
            }
            (None, None) => return true,
            _ => return false,
        }
        i += 1;
    }
}

/// Whether `a` starts with a `$` token where `b` starts with a wildcard, which never
/// matches it.
fn dollar_under_wildcard(a: &[&str], b: &[&str]) -> bool {
    let first_a = a.first().copied().unwrap_or_default();
    let first_b = b.first().copied().unwrap_or_default();
    first_a.starts_with('$') && matches!(first_b, "*" | ">")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_overlap_when_one_subject_can_match_both() {
        for (a, b) in [
            ("orders.>", "orders.eu"),
            ("orders.*", "orders.eu"),
            ("orders.*.x", "orders.eu.*"),
            (">", "a.b.c"),
            ("a.>", "a.*.c"),
            ("a.b", "a.b"),
        ] {
            assert!(overlap(a, b), "{a} and {b}");
            assert!(overlap(b, a), "{b} and {a}");
        }
        for (a, b) in [
            ("orders.>", "order.x"),
            ("orders.>", "orders"),
            ("a.*", "a.b.c"),
            ("a.b", "a.c"),
            ("a.*.c", "a.b.d"),
            (">", "$KV.cfg.>"),
            ("*.cfg.>", "$KV.cfg.a"),
        ] {
            assert!(!overlap(a, b), "{a} and {b}");
            assert!(!overlap(b, a), "{b} and {a}");
        }
    }

    #[test]
    fn a_filter_is_within_another_when_it_matches_nothing_more() {
        for (inner, outer) in [
            ("orders.eu", "orders.>"),
            ("orders.*", "orders.>"),
            ("orders.*.x", "orders.*.>"),
            ("orders.>", "orders.>"),
            ("a.b", "a.*"),
            ("a.*", "a.*"),
            ("a.b.c", ">"),
        ] {
            assert!(within(inner, outer), "{inner} within {outer}");
        }
        for (inner, outer) in [
            ("orders.>", "orders.*"),
            ("orders", "orders.>"),
            ("a.*", "a.b"),
            ("a.>", "a.*.>"),
            ("b.c", "a.>"),
            ("$KV.cfg.a", ">"),
            ("$KV.cfg.a", "*.cfg.a"),
        ] {
            assert!(!within(inner, outer), "{inner} not within {outer}");
        }
    }
}
