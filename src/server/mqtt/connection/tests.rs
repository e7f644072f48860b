//! Unit tests of the MQTT connection: the session matcher, and the size of an idle
//! connection's task.

use super::*;

#[test]
fn a_session_matcher_merges_overlapping_filters() {
    let mut trie = Trie::new();
    for (filter, qos, id) in [("a/#", 0, 1), ("a/+/c", 2, 2), ("b/#", 1, 0)] {
        trie.insert(
            &Pattern::parse_mqtt(filter).expect("filter"),
            None,
            SavedSubscription {
                filter: filter.into(),
                qos,
                no_local: false,
                retain_as_published: false,
                subscription_id: id,
            },
        );
    }
    let matcher = SessionMatcher { trie };
    assert!(matcher.matches("a.b.c"));
    assert!(!matcher.matches("c"));
    let (qos, mut ids) = matcher.delivery("a.b.c", 0);
    ids.sort_unstable();
    assert_eq!((qos, ids), (2, vec![1, 2]));
    assert_eq!(matcher.delivery("a.b.c", mqtt_flags(1, false)).0, 1);
    assert_eq!(matcher.delivery("b.x", 0), (1, vec![]));
}

mod task_size {
    use super::*;

    /// Every connected device costs at least its task, whose size is the largest
    /// state of `serve`: rare steps with store reads and the state of serving traffic
    /// must stay boxed so that a parked connection does not pay for them (the MQTT idle
    /// benchmark measures the rest).
    #[tokio::test]
    async fn an_idle_connection_task_stays_small() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let broker = Arc::new(Broker::new(
            Arc::new(crate::tenancy::Authorizer::default()),
            Arc::new(crate::broker::Metrics::default()),
            crate::broker::durable::Policies::new(&[]).expect("policies"),
        ));
        let config = Arc::new(crate::config::Config::default());
        let context = Arc::new(MqttContext::new(config, broker, None));
        let task = serve(client, addr, context, CancellationToken::new());
        let size = std::mem::size_of_val(&task);
        assert!(size <= 1_500, "the connection task grew to {size} bytes");
        assert!(std::mem::size_of::<Connection>() <= 1_000);
    }
}
