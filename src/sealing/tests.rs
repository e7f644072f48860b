use std::sync::Arc;

use super::*;

const A: &str = "a:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const B: &str = "b:1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(future)
}

fn key(provider: &LocalKeys, tenant: &str, pattern: &str, id: u32) -> (DataKey, StoredDataKey) {
    block_on(new_data_key(provider, tenant, pattern, id, u64::from(id))).expect("a data key")
}

#[test]
fn a_sealed_message_opens_only_at_its_tenant_subject_and_version() {
    let provider = LocalKeys::parse(A).expect("keys");
    let (key, _) = key(&provider, "t", "orders.>", 7);
    let context = message_context("t", "orders.1", 3);
    let sealed = key
        .seal(&context, b"NATS/1.0\r\nA: b\r\n\r\n", b"secret payload")
        .expect("sealed");
    assert_eq!(sealed.len(), OVERHEAD + 18 + 14);
    assert_eq!(key_id_of(&sealed), Some(7));
    assert!(
        !sealed.windows(6).any(|w| w == b"secret"),
        "ciphertext holds the plaintext"
    );
    assert_eq!(
        key.open(&context, &sealed),
        Opened::Plain {
            headers: Bytes::from_static(b"NATS/1.0\r\nA: b\r\n\r\n"),
            payload: Bytes::from_static(b"secret payload"),
        }
    );
    for other in [
        message_context("u", "orders.1", 3),
        message_context("t", "orders.2", 3),
        message_context("t", "orders.1", 4),
    ] {
        assert_eq!(key.open(&other, &sealed), Opened::Unreadable { key_id: 7 });
    }
    let mut changed = sealed.to_vec();
    changed[20] ^= 1;
    assert_eq!(
        key.open(&context, &changed),
        Opened::Unreadable { key_id: 7 }
    );
    for cut in 0..sealed.len() {
        assert!(matches!(
            key.open(&context, &sealed[..cut]),
            Opened::Unreadable { .. }
        ));
    }
    // Two seals of one message differ (a nonce each).
    assert_ne!(
        key.seal(&context, b"", b"x").ok(),
        key.seal(&context, b"", b"x").ok()
    );
}

#[test]
fn the_most_specific_pattern_seals_and_every_key_opens_what_it_sealed() {
    let provider = LocalKeys::parse(A).expect("keys");
    let (wide, _) = key(&provider, "t", "orders.>", 1);
    let (narrow, _) = key(&provider, "t", "orders.eu.*", 2);
    let (old, _) = key(&provider, "t", "orders.eu.*", 0);
    let keys = TenantKeys::new([Arc::new(wide), Arc::new(narrow), Arc::new(old)]);
    assert_eq!(keys.sealing_key("orders.eu.1").map(|k| k.id), Some(2));
    assert_eq!(keys.sealing_key("orders.us.1").map(|k| k.id), Some(1));
    assert_eq!(keys.sealing_key("orders.eu.1.x").map(|k| k.id), Some(1));
    assert!(keys.sealing_key("orders").is_none());
    assert!(keys.sealing_key("payments.x").is_none());

    let context = message_context("t", "orders.eu.1", 1);
    let sealed = keys
        .key(0)
        .expect("old")
        .seal(&context, b"", b"v")
        .expect("sealed");
    assert!(matches!(
        keys.open("t", "orders.eu.1", 1, &sealed),
        Opened::Plain { .. }
    ));
    // Shredded: the key is gone, and so is what it sealed.
    let without = TenantKeys::new(keys.keys().into_iter().filter(|k| k.id != 0));
    assert_eq!(
        without.open("t", "orders.eu.1", 1, &sealed),
        Opened::Unreadable { key_id: 0 }
    );
}

#[test]
fn rotating_the_key_encryption_key_rewraps_data_keys_that_still_open_old_messages() {
    let first = LocalKeys::parse(A).expect("keys");
    let (key, stored) = key(&first, "t", "x.>", 4);
    assert_eq!(stored.wrapped.kek, "a");
    let context = message_context("t", "x.1", 1);
    let sealed = key.seal(&context, b"", b"kept").expect("sealed");

    // Both keys, `b` current: the data key unwraps with `a` and comes back wrapped by `b`.
    let both = LocalKeys::parse(&format!("{A}\n# rotated\n{B}\n")).expect("keys");
    assert_eq!(both.current(), "b");
    let (again, rewrapped) = block_on(unwrap_data_key(&both, "t", &stored)).expect("unwraps");
    let rewrapped = rewrapped.expect("rewrapped by the current key");
    assert_eq!(rewrapped.wrapped.kek, "b");
    assert_eq!(again.kek, "b");
    assert!(matches!(
        again.open(&context, &sealed),
        Opened::Plain { .. }
    ));

    // `a` removed: the re-wrapped record still unwraps, the old one no longer does.
    let only_b = LocalKeys::parse(B).expect("keys");
    let (last, none) = block_on(unwrap_data_key(&only_b, "t", &rewrapped)).expect("unwraps");
    assert!(none.is_none());
    assert!(matches!(last.open(&context, &sealed), Opened::Plain { .. }));
    assert!(matches!(
        block_on(unwrap_data_key(&only_b, "t", &stored)),
        Err(SealError::UnknownKek(_))
    ));
    // A wrapped key is bound to its tenant and id.
    assert!(matches!(
        block_on(unwrap_data_key(&only_b, "u", &rewrapped)),
        Err(SealError::Unwrap(_))
    ));
}

#[test]
fn bad_key_texts_are_refused_with_why() {
    for (text, why) in [
        ("", "no key"),
        ("a 00", "ID:HEX"),
        ("a:00", "64 hex"),
        (
            "a b:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
            "letters",
        ),
        (&format!("{A},{A}"), "twice"),
    ] {
        let error = LocalKeys::parse(text).expect_err(text).to_string();
        assert!(error.contains(why), "{text}: {error}");
        assert!(
            !error.contains("0001020304"),
            "a key's bytes shown: {error}"
        );
    }
    assert!(!format!("{:?}", LocalKeys::parse(A).expect("keys")).contains("0001"));
    assert!(LocalKeys::load("nothing").is_err());
}

#[test]
fn sealing_costs_one_load_until_a_tenant_has_keys() {
    let sealing = Sealing::default();
    assert!(sealing.keys_of("t").is_none());
    let provider = LocalKeys::parse(A).expect("keys");
    let (k, _) = key(&provider, "t", ">", 1);
    sealing.set("t", Some(TenantKeys::new([Arc::new(k)])));
    assert!(sealing.keys_of("t").is_some_and(|k| k.seals_any()));
    assert!(sealing.keys_of("u").is_none());
    sealing.set("t", None);
    assert!(sealing.keys_of("t").is_none());
}
