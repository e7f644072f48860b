//! JetStream push consumers over `$JS.API`: a consumer config with a
//! `deliver_subject`, and ordered pull consumers (`ack_policy: none` without one,
//! pulled by [`pull`]). Without acks (`ack_policy: none`: the ordered kind NATS KV's
//! watch, keys and history, object gets and ordered subscriptions make) it becomes a
//! running [`PushSpec`] (see `broker::push`): ephemeral, in memory, gone after
//! `inactive_threshold` without a listener (5 s by default, as nats-server's
//! ephemerals), answered, listed, read and deleted beside the groups. With acks it is
//! a consumer group with [`PushTerms`] (`consumers.rs` makes it, [`terms_of`] reads
//! its terms), pumped to its deliver subject; an ephemeral one is deleted after its
//! inactive threshold, a durable one outlives restarts. Creating either needs
//! subscribe rights on each filter and, for its deliver subject, publish rights there
//! or (ephemeral ones only) an inbox the calling connection holds, which the consumer
//! then does not outlive: a consumer may not pour what its maker reads onto a subject
//! its maker may not publish to. Must never: start a consumer a create with another
//! config asked for under a running one's name.

use std::sync::Arc;
use std::time::Duration;

use canopy_subjects::{Pattern, Subject};
use serde_json::{Map, Value, json};

use super::{JsError, Stream, authorize_reading, time};
use crate::api::{Answer, ApiCall};
use crate::broker::Broker;
use crate::broker::groups::jetstream::status_block;
use crate::broker::push::{
    self, OrderedPull, PullRefused, PushError, PushHandle, PushSpec, PushStart,
};
use crate::groups::PushTerms;
use crate::store::Store;
use crate::tenancy::Action;

/// An ephemeral consumer's inactive threshold when its config gives none
/// (nats-server's).
const DEFAULT_INACTIVE: Duration = Duration::from_secs(5);
/// The longest inactive threshold taken: a consumer nobody listens to is gone after
/// it at the latest.
const MAX_INACTIVE: Duration = Duration::from_secs(24 * 3600);
/// The shortest idle heartbeat (nats-server's floor).
const MIN_HEARTBEAT: Duration = Duration::from_millis(100);

/// Whether a consumer config asks for push delivery.
pub(super) fn is_push(config: &Value) -> bool {
    !text(config, "deliver_subject").is_empty()
}

fn text<'a>(config: &'a Value, key: &str) -> &'a str {
    config.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn nanos(config: &Value, key: &str) -> Duration {
    Duration::from_nanos(config.get(key).and_then(Value::as_u64).unwrap_or_default())
}

/// A fresh ephemeral consumer name: 8 letters and digits, as nats-server's.
pub(super) fn ephemeral_name() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..8)
        .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
        .collect()
}

/// `CONSUMER.CREATE` of a push consumer: starts it, or answers with the running one
/// of that name when the config is the same.
pub(super) async fn create(
    broker: &Arc<Broker>,
    store: &Arc<Store>,
    call: &ApiCall,
    stream: &Stream,
    name: &str,
    config: &Map<String, Value>,
) -> Result<Value, JsError> {
    if broker.mesh().is_some() {
        return Err(JsError::new(
            500,
            10052,
            "push consumers are not run across a cluster's nodes yet: use a pull consumer",
        ));
    }
    let given = text_of(config, "name");
    let name = match (name, given) {
        ("", "") => ephemeral_name(),
        ("", given) => given.to_owned(),
        (name, "") => name.to_owned(),
        (name, given) if name == given => name.to_owned(),
        (_, given) => {
            return Err(JsError::new(
                400,
                10017,
                format!("consumer name in subject does not match name in request ({given})"),
            ));
        }
    };
    if !crate::groups::name_ok(&name) {
        return Err(JsError::bad_request(format!(
            "a consumer name is 1 to {} letters, digits, - and _ (got {name:?})",
            crate::groups::MAX_NAME
        )));
    }
    let mut spec = spec_of(stream, &name, config, broker.clock().now_ms())?;
    for filter in &spec.filters {
        if !stream.holds(filter) {
            return Err(JsError::new(
                400,
                10093,
                "consumer filter subject is not a valid subset of the interest subjects",
            ));
        }
        authorize_reading(broker, call, filter)?;
    }
    if let Some(subject) = &spec.deliver_subject {
        spec.inbox_of = may_deliver_to(broker, call, subject, true)?;
    }
    let routes = &call.routes;
    // One consumer per name, of either kind; a stream deleted meanwhile takes it.
    let _change = routes.group_changes.lock().await;
    super::still_there(routes, stream)?;
    if let Some(running) = routes.pushes.get(&name) {
        if running.spec.config == spec.config && running.spec.stream == spec.stream {
            return Ok(info(broker, &running));
        }
        return Err(JsError::new(400, 10148, "consumer already exists"));
    }
    if store.group(&routes.name, &name).await?.is_some() {
        return Err(JsError::new(400, 10148, "consumer already exists"));
    }
    let handle = push::start(broker, store, routes, spec)
        .await
        .map_err(|e| match e {
            PushError::Exists(_) => JsError::new(400, 10148, "consumer already exists"),
            PushError::TooMany => {
                JsError::new(400, 10026, format!("maximum consumers limit reached: {e}"))
            }
            PushError::Store(e) => JsError::from(e),
            PushError::Filter(_) | PushError::PlanTooLarge => JsError::bad_request(e.to_string()),
        })?;
    Ok(info(broker, &handle))
}

/// How a push consumer with acks (a group) delivers: its deliver subject (which the
/// caller must be allowed to deliver to), heartbeat and, for an ephemeral one or one
/// given an `inactive_threshold`, when it goes.
pub(super) fn terms_of(
    broker: &Broker,
    call: &ApiCall,
    stream: &Stream,
    config: &Value,
    ephemeral: bool,
) -> Result<PushTerms, JsError> {
    let deliver_subject = text(config, "deliver_subject").to_owned();
    // A durable consumer outlives its connection's inbox: it needs the right itself.
    let inbox_of = may_deliver_to(broker, call, &deliver_subject, ephemeral)?;
    let heartbeat = check_heartbeat(config)?;
    let inactive = nanos(config, "inactive_threshold");
    let inactive_ms = match (ephemeral, inactive.is_zero()) {
        (true, true) => Some(DEFAULT_INACTIVE),
        (_, false) => Some(inactive.min(MAX_INACTIVE)),
        (false, true) => None,
    }
    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1));
    Ok(PushTerms {
        stream: stream.name().to_owned(),
        deliver_subject,
        heartbeat_ms: u64::try_from(heartbeat.as_millis()).unwrap_or(u64::MAX),
        inactive_ms,
        inbox_of,
        deliver_group: Some(text(config, "deliver_group"))
            .filter(|group| !group.is_empty())
            .map(str::to_owned),
    })
}

/// A push consumer's idle heartbeat, held to nats-server's rules: at least 100 ms,
/// and present when flow control is asked for.
fn check_heartbeat(config: &Value) -> Result<Duration, JsError> {
    let heartbeat = nanos(config, "idle_heartbeat");
    let flow_control = config.get("flow_control").and_then(Value::as_bool) == Some(true);
    if flow_control && heartbeat.is_zero() {
        return Err(JsError::new(
            400,
            10108,
            "consumer with flow control also needs heartbeats",
        ));
    }
    if !heartbeat.is_zero() && heartbeat < MIN_HEARTBEAT {
        return Err(JsError::new(
            400,
            10083,
            "consumer idle heartbeat needs to be >= 100ms",
        ));
    }
    Ok(heartbeat)
}

/// What only a push consumer may ask for, refused for a pull one as nats-server does.
fn refuse_push_terms(config: &Value) -> Result<(), JsError> {
    if !nanos(config, "idle_heartbeat").is_zero() {
        return Err(JsError::new(
            400,
            10088,
            "consumer idle heartbeat requires a push based consumer",
        ));
    }
    if config.get("flow_control").and_then(Value::as_bool) == Some(true) {
        return Err(JsError::new(
            400,
            10089,
            "consumer flow control requires a push based consumer",
        ));
    }
    Ok(())
}

fn text_of<'a>(config: &'a Map<String, Value>, key: &str) -> &'a str {
    config.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// The deliver subject must be a subject (no wildcard), one the caller may publish to
/// or (with `own_inbox`, for a consumer that goes with its connection) under an inbox
/// the calling connection holds: then that connection, which the consumer must not
/// outlive the claim of.
fn may_deliver_to(
    broker: &Broker,
    call: &ApiCall,
    subject: &str,
    own_inbox: bool,
) -> Result<Option<u64>, JsError> {
    let literal = Pattern::parse_native(subject).is_ok_and(|p| p.is_literal())
        && Subject::parse_native(subject).is_ok();
    if !literal {
        return Err(JsError::new(
            400,
            10112,
            format!("invalid push consumer deliver subject {subject:?}"),
        ));
    }
    let published = broker
        .authorizer()
        .authorize(&call.principal, Action::Publish, subject);
    let held = own_inbox
        && crate::broker::inbox_owner(subject)
            .is_some_and(|token| call.routes.inboxes.holds(token, call.origin));
    match published {
        Ok(()) => Ok(None),
        Err(_) if held => Ok(Some(call.origin)),
        Err(denied) => Err(JsError::new(403, 10003, denied.to_string())),
    }
}

/// The push consumer a config describes, refusing what Canopy does not offer.
fn spec_of(
    stream: &Stream,
    name: &str,
    config: &Map<String, Value>,
    now_ms: u64,
) -> Result<PushSpec, JsError> {
    let whole = Value::Object(config.clone());
    super::check_sizes(&whole)?;
    if !text(&whole, "durable_name").is_empty() {
        return Err(JsError::bad_request(
            "a consumer without acks is an ordered consumer, which is ephemeral: \
             leave durable_name empty, or ask for acks (ack_policy explicit)",
        ));
    }
    if text(&whole, "ack_policy") != "none" {
        return Err(JsError::bad_request(
            "an ordered consumer has no acks: ack_policy none",
        ));
    }
    let deliver_subject = Some(text(&whole, "deliver_subject"))
        .filter(|subject| !subject.is_empty())
        .map(str::to_owned);
    if deliver_subject.is_none() {
        refuse_push_terms(&whole)?;
    }
    if !matches!(text(&whole, "replay_policy"), "" | "instant") {
        return Err(JsError::bad_request(
            "replay_policy original is not offered: messages are delivered at once",
        ));
    }
    if whole
        .get("rate_limit_bps")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        > 0
    {
        return Err(JsError::bad_request("rate_limit_bps is not offered"));
    }
    let heartbeat = check_heartbeat(&whole)?;
    let filters = filters_of(stream, &whole)?;
    let start = start_of(&whole)?;
    let inactive = match nanos(&whole, "inactive_threshold") {
        zero if zero.is_zero() => DEFAULT_INACTIVE,
        given => given.min(MAX_INACTIVE),
    };
    let mut echoed = config.clone();
    echoed.insert("name".into(), json!(name));
    echoed.insert("ack_policy".into(), json!("none"));
    echoed.insert("replay_policy".into(), json!("instant"));
    echoed.insert("inactive_threshold".into(), json!(inactive.as_nanos()));
    if text(&whole, "deliver_policy").is_empty() {
        echoed.insert("deliver_policy".into(), json!("all"));
    }
    echoed.remove("durable_name");
    Ok(PushSpec {
        stream: Arc::from(stream.name()),
        name: Arc::from(name),
        filters,
        deliver_subject,
        start,
        headers_only: whole.get("headers_only").and_then(Value::as_bool) == Some(true),
        heartbeat: (!heartbeat.is_zero()).then_some(heartbeat),
        inactive,
        config: Value::Object(echoed),
        created_ms: now_ms,
        inbox_of: None,
    })
}

/// The consumer's filters: `filter_subject` or `filter_subjects` (none overlapping),
/// else every subject of its stream.
fn filters_of(stream: &Stream, config: &Value) -> Result<Vec<String>, JsError> {
    let mut filters = crate::streams::config::strings_of(config, "filter_subjects");
    let one = text(config, "filter_subject");
    if !one.is_empty() {
        if !filters.is_empty() {
            return Err(JsError::new(
                400,
                10134,
                "consumer cannot have both FilterSubject and FilterSubjects specified",
            ));
        }
        filters.push(one.to_owned());
    }
    if filters.len() > crate::streams::config::MAX_SUBJECTS {
        return Err(JsError::bad_request(format!(
            "a consumer has at most {} filter subjects",
            crate::streams::config::MAX_SUBJECTS
        )));
    }
    if filters.is_empty() {
        filters = match stream {
            Stream::Declared(declared) => declared.subjects.clone(),
            Stream::Tenant(_) => vec![">".to_owned()],
        };
    }
    for filter in &filters {
        Pattern::parse_native(filter).map_err(|e| {
            JsError::bad_request(format!("filter subject {filter:?} is not a pattern: {e}"))
        })?;
    }
    for (i, a) in filters.iter().enumerate() {
        if filters[i + 1..]
            .iter()
            .any(|b| crate::streams::filters::overlap(a, b))
        {
            return Err(JsError::new(
                400,
                10136,
                "consumer subject filters cannot overlap",
            ));
        }
    }
    Ok(filters)
}

/// Where the consumer starts, from its deliver policy.
fn start_of(config: &Value) -> Result<PushStart, JsError> {
    Ok(match text(config, "deliver_policy") {
        "" | "all" => PushStart::All,
        "new" => PushStart::New,
        "last" => PushStart::Last,
        "last_per_subject" => PushStart::LastPerSubject,
        "by_start_sequence" => match config.get("opt_start_seq").and_then(Value::as_u64) {
            Some(seq) if seq > 0 => PushStart::Offset(seq),
            _ => {
                return Err(JsError::bad_request(
                    "deliver_policy by_start_sequence needs an opt_start_seq of 1 or more",
                ));
            }
        },
        "by_start_time" => {
            let at = time::parse(text(config, "opt_start_time")).ok_or_else(|| {
                JsError::bad_request(
                    "deliver_policy by_start_time needs an RFC 3339 opt_start_time",
                )
            })?;
            PushStart::Time(at)
        }
        other => {
            return Err(JsError::bad_request(format!(
                "deliver_policy {other} is not a deliver policy"
            )));
        }
    })
}

/// `CONSUMER.MSG.NEXT` to a running ordered consumer: its task answers on the pull's
/// reply subject; here only a refusal.
pub(super) fn pull(handle: &PushHandle, pull: OrderedPull, answer: &mut Answer) {
    if !handle.is_pulled() {
        answer.status(&status_block(409, "Consumer is push based", None));
        return;
    }
    match handle.pull(pull) {
        Ok(()) => {}
        Err(PullRefused::TooMany) => {
            answer.status(&status_block(409, "Exceeded MaxWaiting", None));
        }
        Err(PullRefused::Gone) => {
            answer.status(canopy_protocols::native::no_responders_block());
        }
    }
}

/// A running push consumer as a JetStream consumer info.
pub(super) fn info(broker: &Broker, handle: &PushHandle) -> Value {
    use std::sync::atomic::Ordering::Relaxed;
    let state = &handle.state;
    let delivered = json!({
        "consumer_seq": state.consumer_seq.load(Relaxed),
        "stream_seq": state.stream_seq.load(Relaxed),
    });
    let mut info = json!({
        "type": "io.nats.jetstream.api.v1.consumer_info_response",
        "stream_name": &*handle.spec.stream,
        "name": &*handle.spec.name,
        "created": time::format(handle.spec.created_ms),
        "config": handle.spec.config,
        "delivered": delivered,
        // Without acks, what was delivered is done with.
        "ack_floor": delivered,
        "num_ack_pending": 0,
        "num_redelivered": 0,
        "num_waiting": state.waiting.load(Relaxed),
        "num_pending": state.pending.load(Relaxed),
        "ts": time::format(broker.clock().now_ms()),
    });
    if state.bound.load(Relaxed) && !handle.is_pulled() {
        info["push_bound"] = json!(true);
    }
    info
}

/// The running push consumer `name` on `stream`, when the caller may read each of its
/// filters; `Ok(None)` when there is none (it may be a pull consumer).
pub(super) fn readable(
    broker: &Broker,
    call: &ApiCall,
    stream: &Stream,
    name: &str,
) -> Result<Option<Arc<PushHandle>>, JsError> {
    let Some(handle) = call.routes.pushes.get(name) else {
        return Ok(None);
    };
    if &*handle.spec.stream != stream.name() {
        return Err(JsError::consumer_not_found());
    }
    if !handle
        .spec
        .filters
        .iter()
        .all(|filter| crate::api::groups::may_read(broker, &call.principal, filter))
    {
        return Err(JsError::unreadable(name));
    }
    Ok(Some(handle))
}

/// The running push consumers on `stream` the caller may read, in name order.
pub(super) fn readable_all(
    broker: &Broker,
    call: &ApiCall,
    stream: &Stream,
) -> Vec<Arc<PushHandle>> {
    call.routes
        .pushes
        .list()
        .into_iter()
        .filter(|handle| &*handle.spec.stream == stream.name())
        .filter(|handle| {
            handle
                .spec
                .filters
                .iter()
                .all(|filter| crate::api::groups::may_read(broker, &call.principal, filter))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(config: Value) -> Result<PushSpec, JsError> {
        let stream = Stream::Tenant(Arc::from("default"));
        let config = config.as_object().cloned().unwrap_or_default();
        spec_of(&stream, "w", &config, 0)
    }

    #[test]
    fn an_ordered_consumers_config_becomes_a_push_spec() {
        let made = spec(json!({
            "deliver_subject": "_INBOX.x", "ack_policy": "none", "filter_subject": "$KV.b.>",
            "deliver_policy": "last_per_subject", "headers_only": true, "flow_control": true,
            "idle_heartbeat": 5_000_000_000u64, "inactive_threshold": 300_000_000_000u64,
        }))
        .expect("accepted");
        assert_eq!(made.filters, ["$KV.b.>"]);
        assert_eq!(made.start, PushStart::LastPerSubject);
        assert!(made.headers_only);
        assert_eq!(made.heartbeat, Some(Duration::from_secs(5)));
        assert_eq!(made.inactive, Duration::from_secs(300));
        assert_eq!(made.config["name"], json!("w"));
        let plain =
            spec(json!({"deliver_subject": "_INBOX.x", "ack_policy": "none"})).expect("accepted");
        assert_eq!(plain.filters, [">"], "the tenant's stream: everything");
        assert_eq!(plain.start, PushStart::All);
        assert_eq!(plain.inactive, DEFAULT_INACTIVE);
        let from = spec(json!({"deliver_subject": "_INBOX.x", "ack_policy": "none",
            "deliver_policy": "by_start_sequence", "opt_start_seq": 7}))
        .expect("accepted");
        assert_eq!(from.start, PushStart::Offset(7));
    }

    #[test]
    fn what_a_push_consumer_cannot_be_is_refused_with_why() {
        for (config, err_code, says) in [
            (json!({"ack_policy": "explicit"}), 10003, "ack_policy none"),
            (json!({"durable_name": "d"}), 10003, "ephemeral"),
            (json!({"replay_policy": "original"}), 10003, "original"),
            (json!({"flow_control": true}), 10108, "heartbeats"),
            (json!({"idle_heartbeat": 1_000_000}), 10083, "100ms"),
            (json!({"filter_subjects": ["a.>", "a.b"]}), 10136, "overlap"),
            (
                json!({"filter_subject": "a", "filter_subjects": ["b"]}),
                10134,
                "both",
            ),
            (
                json!({"deliver_policy": "by_start_sequence"}),
                10003,
                "opt_start_seq",
            ),
            (
                json!({"deliver_policy": "sometimes"}),
                10003,
                "not a deliver",
            ),
        ] {
            let mut full = json!({"deliver_subject": "_INBOX.x", "ack_policy": "none"});
            if let (Some(full), Some(config)) = (full.as_object_mut(), config.as_object()) {
                full.extend(config.clone());
            }
            let error = spec(full).expect_err("refused");
            assert_eq!(error.err_code, err_code, "{config}: {}", error.description);
            assert!(
                error.description.contains(says),
                "{config}: {}",
                error.description
            );
        }
    }
}
