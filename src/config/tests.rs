use super::*;

#[test]
fn the_documented_defaults_are_the_defaults() {
    let table = parse_table(DEFAULT_TOML).expect("default.toml parses");
    let parsed = Config::deserialize(toml::Value::Table(table)).expect("default.toml fits");
    assert_eq!(parsed, Config::default());
}

#[test]
fn env_overrides_file_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("canopy.toml");
    std::fs::write(
        &path,
        "[native]\nlisten = \"127.0.0.1:1000\"\nmax_payload = 2048\n\
         [websocket]\nmax_payload = 2048\n",
    )
    .expect("write");
    let env = vec![
        (
            "CANOPY_NATIVE__LISTEN".to_owned(),
            "127.0.0.1:2000".to_owned(),
        ),
        (
            "CANOPY_AUTHZ__DENY_PUBLISH".to_owned(),
            "[\"a.>\"]".to_owned(),
        ),
        (
            "CANOPY_SERVER".to_owned(),
            "nats://elsewhere:4222".to_owned(),
        ),
        ("HOME".to_owned(), "/root".to_owned()),
    ];
    let config = Config::load(Some(&path), env).expect("loads");
    assert_eq!(
        config.native.listen,
        "127.0.0.1:2000".parse().expect("addr")
    );
    assert_eq!(config.native.max_payload, 2048);
    assert_eq!(config.authz.deny_publish, vec!["a.>".to_owned()]);
}

#[test]
fn bad_input_is_an_error_that_names_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[native]\nlisten = 12\n").expect("write");
    let err = Config::load(Some(&path), Vec::new()).expect_err("must fail");
    assert!(err.to_string().contains("invalid"), "{err}");

    std::fs::write(&path, "[native\n").expect("write");
    let err = Config::load(Some(&path), Vec::new()).expect_err("must fail");
    assert!(err.to_string().contains("not valid TOML"), "{err}");

    std::fs::write(&path, "[native]\nlistn = \"x\"\n").expect("write");
    let err = Config::load(Some(&path), Vec::new()).expect_err("must fail");
    assert!(err.to_string().contains("listn"), "{err}");

    let env = vec![("CANOPY_NATIVE__MAX_PAYLOAD".to_owned(), "0".to_owned())];
    let err = Config::load(None, env).expect_err("must fail");
    assert!(err.to_string().contains("max_payload"), "{err}");
}

#[test]
fn websocket_payloads_fit_what_native_clients_accept() {
    let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let err = Config::load(
        None,
        env(&[
            ("CANOPY_NATIVE__MAX_PAYLOAD", "65536"),
            ("CANOPY_WEBSOCKET__MAX_PAYLOAD", "65537"),
        ]),
    )
    .expect_err("over native.max_payload");
    assert!(err.to_string().contains("websocket.max_payload"), "{err}");
    let config = Config::load(
        None,
        env(&[
            ("CANOPY_NATIVE__MAX_PAYLOAD", "65536"),
            ("CANOPY_WEBSOCKET__MAX_PAYLOAD", "65536"),
            ("CANOPY_WEBSOCKET__MAX_SUBSCRIPTIONS", "5"),
        ]),
    )
    .expect("at native.max_payload");
    assert_eq!(config.websocket.max_subscriptions, 5);
    // Room for the payload in base64 and the JSON around it.
    assert!(config.websocket.max_message_bytes(65536) >= 65536 * 4 / 3 + 64 * 1024);
    // 0, the default, follows native.max_payload.
    let config = Config::load(None, env(&[("CANOPY_NATIVE__MAX_PAYLOAD", "4096")]))
        .expect("the default follows native");
    assert_eq!(
        config.websocket.payload_limit(config.native.max_payload),
        4096
    );
    let err = Config::load(None, env(&[("CANOPY_WEBSOCKET__WRITE_DEADLINE_SECS", "0")]))
        .expect_err("no deadline");
    assert!(err.to_string().contains("write_deadline_secs"), "{err}");
}
