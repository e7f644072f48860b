//! The mapping examples the README gives, so the README cannot drift from the code.

use canopy_subjects::{Pattern, Subject};

#[test]
fn readme_mapping_examples_hold() {
    let cases = [
        ("home/living.room/temp", "home.living%2Eroom.temp"),
        ("/devices/7", "%.devices.7"),
        ("a%2Fb/c%2Bd", "a/b.c+d"),
        ("50%off/*", "50%off.%2A"),
    ];
    for (mqtt, native) in cases {
        let from_mqtt = Subject::parse_mqtt(mqtt).expect("valid MQTT topic");
        assert_eq!(from_mqtt.as_str(), native, "{mqtt}");
        let from_native = Subject::parse_native(native).expect("valid native subject");
        assert_eq!(from_native.to_mqtt(), mqtt, "{native}");
    }
    let one_or_more = Pattern::parse_native("a.>").expect("pattern");
    assert_eq!(one_or_more.to_mqtt(), "a/+/#");
    assert_eq!(
        Pattern::parse_mqtt("a/#").expect("filter").to_native(),
        None
    );
    let refused = Subject::parse_native("a%41").expect_err("non-canonical escape");
    assert!(refused.to_string().contains('A'), "{refused}");
}
