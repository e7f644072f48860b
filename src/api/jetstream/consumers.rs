//! JetStream consumers as Canopy consumer groups: a consumer's config becomes a
//! [`GroupSpec`] (and back, for its info), and its calls become the group's.
//!
//! The mapping: `filter_subject` (or one of `filter_subjects`; none is `>`) is the
//! pattern; `deliver_policy` all, new and by_start_time are the group's start;
//! `ack_wait`, `max_deliver` (unset or -1: no limit) and `max_ack_pending` (the
//! group's in flight per member) carry over; messages of one subject may be in
//! flight together up to `max_ack_pending`, as in JetStream, unless the config's
//! metadata sets `canopy.per_subject` (`"1"`: strict order per subject). A consumer
//! with a `deliver_subject` and acks is such a group too, with push terms its pump
//! (`broker::push`) follows; one without acks is an ordered push consumer
//! (`push.rs`). Ephemeral pull consumers, other delivery policies and acks other than
//! explicit are refused with an error that says so. A consumer needs the rights its group
//! needs: subscribe on the filter to create, read or delete it, and publish under its
//! dead-letter prefix, checked as `group.create` checks it. Pull terms that would make
//! the group work for nothing are refused or raised as nats-server does, or below
//! Canopy's floors (an idle heartbeat under [`MIN_HEARTBEAT`]). Must never: change a
//! group a JetStream client did not ask to change (a create with another config is
//! refused).

use std::sync::Arc;
use std::time::Duration;

use canopy_protocols::native::no_responders_block;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{JsError, Stream, authorize_reading, time};
use crate::api::groups::{groups_full, may_read, page};
use crate::api::{Answer, ApiCall};
use crate::broker::Broker;
use crate::broker::groups::jetstream::{JetStreamPull, status_block};
use crate::broker::groups::{Pull, PullStyle};
use crate::broker::push::OrderedPull;
use crate::groups::{GroupSpec, Limits, MAX_IN_FLIGHT, StartAt, StoredGroup};
use crate::store::Store;

/// The most messages one pull may ask for.
pub const MAX_BATCH: usize = 100_000;
/// The longest a pull waits (one without `expires` waits this long, then ends 408).
pub const MAX_EXPIRES: Duration = Duration::from_secs(300);
/// The waiting pulls a consumer keeps, as its info announces (`max_waiting`).
const MAX_WAITING: u64 = 1_024;
/// The shortest idle heartbeat a pull may ask for: below it a waiting pull is a stream
/// of status messages (nats-server asks 100 ms of a push consumer's).
pub const MIN_HEARTBEAT: Duration = Duration::from_millis(100);
/// The shortest wait a pull with `expires` gets (nats-server's floor for a consumer's
/// `max_expires`); a shorter one is raised to it.
pub const MIN_EXPIRES: Duration = Duration::from_millis(1);
/// The longest description, in bytes, as nats-server bounds it (Canopy keeps none).
pub const MAX_DESCRIPTION: usize = 4_096;
/// The most bytes of metadata keys and values, as nats-server bounds them (Canopy
/// keeps only its own keys).
pub const MAX_METADATA: usize = 128 * 1_024;
/// Most consumers one `CONSUMER.LIST` page holds, and names one `CONSUMER.NAMES`
/// page holds (nats-server's pages); fewer when they would not fit an answer.
const LIST_PAGE: usize = crate::api::groups::LIST_PAGE;
const NAMES_PAGE: usize = 1_024;
/// Metadata keys for what JetStream's config cannot say.
const PER_SUBJECT_KEY: &str = "canopy.per_subject";
const DEAD_LETTER_KEY: &str = "canopy.dead_letter";

/// The group a JetStream consumer config describes.
pub(super) fn spec_of(name: &str, config: &Value) -> Result<GroupSpec, JsError> {
    let int = |key: &str| config.get(key).and_then(Value::as_i64).unwrap_or_default();
    refuse_unoffered(name, config)?;
    let pattern = pattern_of(config)?;
    let start = start_of(config)?;
    let defaults = Limits::default();
    let ack_wait_ms = match u64::try_from(int("ack_wait")).unwrap_or_default() {
        0 => defaults.ack_wait_ms,
        nanos => nanos.div_ceil(1_000_000),
    };
    let max_deliveries = u32::try_from(int("max_deliver").max(0)).unwrap_or(u32::MAX);
    let per_member = match u32::try_from(int("max_ack_pending")) {
        Ok(n) if n > 0 => n.min(MAX_IN_FLIGHT),
        _ => defaults.per_member,
    };
    let metadata = |key: &str| {
        config
            .get("metadata")
            .and_then(|m| m.get(key))
            .and_then(Value::as_str)
    };
    let per_subject = match metadata(PER_SUBJECT_KEY) {
        Some(n) => n.parse().map_err(|_| {
            JsError::bad_request(format!(
                "metadata {PER_SUBJECT_KEY} is a number (got {n:?})"
            ))
        })?,
        None => per_member,
    };
    let spec = GroupSpec {
        name: name.to_owned(),
        pattern,
        ack_wait_ms,
        max_deliveries,
        per_subject,
        per_member,
        start,
        dead_letter: metadata(DEAD_LETTER_KEY).map(str::to_owned),
    };
    spec.check()
        .map_err(|e| JsError::bad_request(e.to_string()))?;
    Ok(spec)
}

/// A string field of a consumer's config, empty when it has none.
fn text<'a>(config: &'a Value, key: &str) -> &'a str {
    config.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// Refuses what a consumer's config asks for that Canopy does not offer, or that
/// breaks nats-server's limits, with the error nats-server gives where it has one.
fn refuse_unoffered(name: &str, config: &Value) -> Result<(), JsError> {
    for key in ["durable_name", "name"] {
        let given = text(config, key);
        if !given.is_empty() && given != name {
            return Err(JsError::new(
                400,
                10017,
                format!("consumer name in subject does not match {key} in request ({given})"),
            ));
        }
    }
    if !matches!(text(config, "ack_policy"), "" | "explicit") {
        return Err(JsError::bad_request(
            "ack_policy all is not offered: ack each message (explicit), or none for an \
             ordered consumer",
        ));
    }
    if config.get("headers_only").and_then(Value::as_bool) == Some(true) {
        return Err(JsError::bad_request(
            "headers_only consumers are not offered",
        ));
    }
    super::check_sizes(config)?;
    if config
        .get("backoff")
        .and_then(Value::as_array)
        .is_some_and(|b| !b.is_empty())
    {
        return Err(JsError::bad_request(
            "backoff is not offered: a message goes again after ack_wait (or a nak's delay)",
        ));
    }
    Ok(())
}

/// The group's pattern: the consumer's one filter subject, or `>` when it has none.
fn pattern_of(config: &Value) -> Result<String, JsError> {
    let filters: Vec<&str> = match config.get("filter_subjects").and_then(Value::as_array) {
        Some(list) => list.iter().filter_map(Value::as_str).collect(),
        None => Vec::new(),
    };
    match (text(config, "filter_subject"), filters.as_slice()) {
        ("", []) => Ok(">".to_owned()),
        ("", [one]) => Ok((*one).to_owned()),
        (one, []) => Ok(one.to_owned()),
        _ => Err(JsError::bad_request(
            "a Canopy consumer reads one pattern: give one filter subject",
        )),
    }
}

/// Where the group starts, from the consumer's deliver policy.
fn start_of(config: &Value) -> Result<StartAt, JsError> {
    match text(config, "deliver_policy") {
        "" | "all" => Ok(StartAt::All),
        "new" => Ok(StartAt::New),
        "by_start_time" => {
            let at = time::parse(text(config, "opt_start_time")).ok_or_else(|| {
                JsError::bad_request(
                    "deliver_policy by_start_time needs an RFC 3339 opt_start_time",
                )
            })?;
            Ok(StartAt::Time(at))
        }
        other => Err(JsError::bad_request(format!(
            "deliver_policy {other} is not offered: use all, new or by_start_time"
        ))),
    }
}

/// A group's definition as a JetStream consumer config.
pub(super) fn config_of(spec: &GroupSpec) -> Value {
    let mut config = json!({
        "name": spec.name,
        "durable_name": spec.name,
        "ack_policy": "explicit",
        "ack_wait": u128::from(spec.ack_wait_ms) * 1_000_000,
        "max_deliver": if spec.max_deliveries == 0 { -1 } else { i64::from(spec.max_deliveries) },
        "filter_subject": spec.pattern,
        "replay_policy": "instant",
        "max_ack_pending": spec.per_member,
        "max_waiting": MAX_WAITING,
        "num_replicas": 0,
        "metadata": {PER_SUBJECT_KEY: spec.per_subject.to_string()},
    });
    match spec.start {
        StartAt::All => config["deliver_policy"] = json!("all"),
        StartAt::New => config["deliver_policy"] = json!("new"),
        StartAt::Time(ms) => {
            config["deliver_policy"] = json!("by_start_time");
            config["opt_start_time"] = json!(time::format(ms));
        }
    }
    if let Some(prefix) = &spec.dead_letter {
        config["metadata"][DEAD_LETTER_KEY] = json!(prefix);
    }
    config
}

/// A stored group's config as its consumer's: the group's, with its push terms.
fn config_of_group(group: &StoredGroup) -> Value {
    let mut config = config_of(&group.spec);
    if let Some(push) = &group.push {
        config["deliver_subject"] = json!(push.deliver_subject);
        if push.heartbeat_ms > 0 {
            config["idle_heartbeat"] = json!(u128::from(push.heartbeat_ms) * 1_000_000);
        }
        if let Some(ms) = push.inactive_ms {
            config["inactive_threshold"] = json!(u128::from(ms) * 1_000_000);
        }
        if let Some(group) = &push.deliver_group {
            config["deliver_group"] = json!(group);
        }
    }
    config
}

async fn stored(store: &Store, tenant: &str, name: &str) -> Result<Option<StoredGroup>, JsError> {
    match store.group(tenant, name).await? {
        None => Ok(None),
        Some(record) => serde_json::from_slice(&record).map(Some).map_err(|e| {
            JsError::new(
                500,
                10012,
                format!("the stored consumer {name} is unreadable: {e}"),
            )
        }),
    }
}

/// `CONSUMER.CREATE` and `CONSUMER.DURABLE.CREATE`: makes the group, or answers with
/// the one there when it has the same config.
pub(super) async fn create(
    broker: &Arc<Broker>,
    store: &Arc<Store>,
    call: &ApiCall,
    stream: &Stream,
    name: &str,
) -> Result<Value, JsError> {
    let request: Value = serde_json::from_slice(&call.body)
        .map_err(|e| JsError::bad_request(format!("the request is not JSON: {e}")))?;
    let mut config = request.get("config").cloned().unwrap_or_else(|| json!({}));
    let Some(fields) = config.as_object_mut() else {
        return Err(JsError::bad_request("a consumer's config is a JSON object"));
    };
    let pushed = super::push::is_push(&Value::Object(fields.clone()));
    if text(&request["config"], "ack_policy") == "none" {
        return super::push::create(broker, store, call, stream, name, fields).await;
    }
    let given = [
        text(&request["config"], "durable_name"),
        text(&request["config"], "name"),
    ]
    .into_iter()
    .find(|given| !given.is_empty());
    let name = match (name, given) {
        ("", Some(given)) => given.to_owned(),
        ("", None) if pushed => super::push::ephemeral_name(),
        ("", None) => {
            return Err(JsError::bad_request(
                "Canopy keeps durable pull consumers: give the consumer a name \
                 (durable_name); ephemeral consumers are push ones (a deliver_subject)",
            ));
        }
        (name, _) => name.to_owned(),
    };
    let name = name.as_str();
    let ephemeral = text(&request["config"], "durable_name").is_empty();
    let push = if pushed {
        let config = Value::Object(fields.clone());
        Some(super::push::terms_of(
            broker, call, stream, &config, ephemeral,
        )?)
    } else {
        None
    };
    if let Stream::Declared(declared) = stream
        && pattern_of(&Value::Object(fields.clone()))? == ">"
        && let [only] = declared.subjects.as_slice()
    {
        // A consumer of a declared stream reads the stream's subjects by default.
        fields.insert("filter_subject".into(), json!(only));
    }
    let spec = spec_of(name, &config)?;
    if !stream.holds(&spec.pattern) {
        return Err(JsError::new(
            400,
            10093,
            "consumer filter subject is not a valid subset of the interest subjects",
        ));
    }
    authorize_reading(broker, call, &spec.pattern)?;
    if let Some(prefix) = &spec.dead_letter {
        crate::api::check_dead_letter(broker, &call.principal, prefix)
            .map_err(|e| JsError::new(e.code, 10003, e.description))?;
    }
    let action = request.get("action").and_then(Value::as_str).unwrap_or("");
    let tenant = &*call.routes.name;
    let _change = call.routes.group_changes.lock().await;
    if call.routes.pushes.get(name).is_some() {
        return Err(JsError::new(400, 10148, "consumer already exists"));
    }
    super::still_there(&call.routes, stream)?;
    match stored(store, tenant, name).await? {
        Some(existing) if existing.spec == spec && existing.push == push => {}
        Some(_) if action == "create" => {
            return Err(JsError::new(400, 10148, "consumer already exists"));
        }
        Some(_) => {
            return Err(JsError::new(
                400,
                10148,
                "consumer already exists with another configuration: Canopy does not change \
                 a consumer in place; delete it first, or create it with the same configuration",
            ));
        }
        None if action == "update" => {
            return Err(JsError::new(404, 10149, "consumer does not exist"));
        }
        None => {
            if let Some(limit) = groups_full(store, &call.routes).await? {
                return Err(JsError::new(
                    400,
                    10026,
                    format!(
                        "maximum consumers limit reached: tenant {tenant} keeps at most \
                         {limit} consumers and groups"
                    ),
                ));
            }
            let group = StoredGroup {
                spec,
                created_ms: broker.clock().now_ms(),
                push: push.clone(),
            };
            let record = serde_json::to_vec(&group)
                .map_err(|e| JsError::new(500, 10012, format!("consumer record: {e}")))?;
            store.create_group(tenant, name, &record).await?;
            broker.groups().start(broker, store, &call.routes, group);
            if let Some(terms) = push {
                crate::broker::push::start_pump(broker, store, &call.routes, name, terms);
            }
        }
    }
    info(broker, store, call, stream, name).await
}

/// The consumer `name` on `stream`, when the caller may read its group (403
/// otherwise).
pub(super) async fn readable(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    stream: &Stream,
    name: &str,
) -> Result<StoredGroup, JsError> {
    let group = stored(store, &call.routes.name, name)
        .await?
        .filter(|group| stream.holds(&group.spec.pattern))
        .ok_or_else(JsError::consumer_not_found)?;
    if !may_read(broker, &call.principal, &group.spec.pattern) {
        return Err(JsError::unreadable(name));
    }
    Ok(group)
}

/// Stops and deletes every consumer that reads inside `stream` (its deletion takes
/// them, as in NATS).
pub(super) async fn delete_within(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    stream: &crate::streams::Stream,
) -> Result<(), JsError> {
    // The caller holds the tenant's `group_changes` until the stream is gone.
    let tenant = &*call.routes.name;
    for record in store.groups(tenant).await? {
        let Ok(group) = serde_json::from_slice::<StoredGroup>(&record) else {
            continue;
        };
        if stream.holds_filter(&group.spec.pattern) {
            broker.groups().stop(&call.routes, &group.spec.name);
            call.routes.pushes.stop(&group.spec.name);
            store.delete_group(tenant, &group.spec.name).await?;
        }
    }
    for pushed in call.routes.pushes.list() {
        if *pushed.spec.stream == *stream.name {
            call.routes.pushes.stop(&pushed.spec.name);
        }
    }
    Ok(())
}

/// Every consumer of the tenant whose group the caller may read, in name order.
pub(super) async fn readable_all(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
) -> Result<Vec<StoredGroup>, JsError> {
    Ok(store
        .groups(&call.routes.name)
        .await?
        .iter()
        .filter_map(|record| serde_json::from_slice::<StoredGroup>(record).ok())
        .filter(|group| may_read(broker, &call.principal, &group.spec.pattern))
        .collect())
}

/// `CONSUMER.INFO`: the group as a JetStream consumer, with its live counts.
pub(super) async fn info(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    stream: &Stream,
    name: &str,
) -> Result<Value, JsError> {
    let group = stored(store, &call.routes.name, name)
        .await?
        .filter(|group| stream.holds(&group.spec.pattern))
        .ok_or_else(JsError::consumer_not_found)?;
    let live = broker
        .groups()
        .info(&call.routes, name, false)
        .await
        .unwrap_or(Value::Null);
    let count = |key: &str| live.get(key).and_then(Value::as_u64).unwrap_or_default();
    let pending = count("pending").saturating_sub(count("in_flight"));
    let consumer_seq = count("consumer_seq");
    Ok(json!({
        "type": "io.nats.jetstream.api.v1.consumer_info_response",
        "stream_name": stream.name(),
        "name": name,
        "created": time::format(group.created_ms),
        "config": config_of_group(&group),
        "delivered": {"consumer_seq": consumer_seq, "stream_seq": count("last_offset")},
        "ack_floor": {"consumer_seq": count("ack_floor_seq"), "stream_seq": count("ack_floor_offset")},
        "num_ack_pending": count("in_flight"),
        "num_redelivered": count("redelivered"),
        "num_waiting": count("waiting_pulls"),
        "num_pending": pending,
        "ts": time::format(broker.clock().now_ms()),
    }))
}

/// `CONSUMER.DELETE`: stops the group and deletes it with its cursors.
pub(super) async fn delete(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    stream: &Stream,
    name: &str,
) -> Result<Value, JsError> {
    let tenant = &*call.routes.name;
    let _change = call.routes.group_changes.lock().await;
    readable(broker, store, call, stream, name).await?;
    broker.groups().stop(&call.routes, name);
    call.routes.pushes.stop(name);
    store.delete_group(tenant, name).await?;
    Ok(json!({"type": "io.nats.jetstream.api.v1.consumer_delete_response", "success": true}))
}

/// A `CONSUMER.LIST` or `CONSUMER.NAMES` request: where the page starts.
#[derive(Debug, Default, Deserialize)]
struct ListRequest {
    #[serde(default)]
    offset: usize,
}

/// `CONSUMER.NAMES` (names) and `CONSUMER.LIST` (infos) of the consumers the caller
/// may read, a page from the request's `offset`: at most 1,024 names or 256 infos,
/// and no more than fit an answer.
pub(super) async fn list(
    broker: &Broker,
    store: &Store,
    call: &ApiCall,
    stream: &Stream,
    infos: bool,
) -> Result<Value, JsError> {
    let request: ListRequest = if call.body.iter().all(u8::is_ascii_whitespace) {
        ListRequest::default()
    } else {
        serde_json::from_slice(&call.body).map_err(|e| {
            JsError::bad_request(format!("the request is not the JSON expected: {e}"))
        })?
    };
    let groups: Vec<StoredGroup> = readable_all(broker, store, call)
        .await?
        .into_iter()
        .filter(|group| stream.holds(&group.spec.pattern))
        .collect();
    let pushes = super::push::readable_all(broker, call, stream);
    let limit = if infos { LIST_PAGE } else { NAMES_PAGE };
    let mut entries = Vec::new();
    for group in groups.iter().skip(request.offset).take(limit) {
        entries.push(if infos {
            info(broker, store, call, stream, &group.spec.name).await?
        } else {
            json!(group.spec.name)
        });
    }
    let pushes_from = request.offset.saturating_sub(groups.len());
    for pushed in pushes.iter().skip(pushes_from).take(limit - entries.len()) {
        entries.push(if infos {
            super::push::info(broker, pushed)
        } else {
            json!(&*pushed.spec.name)
        });
    }
    let consumers = page(entries.into_iter(), 0, limit, broker.max_answer());
    let kind = if infos {
        "io.nats.jetstream.api.v1.consumer_list_response"
    } else {
        "io.nats.jetstream.api.v1.consumer_names_response"
    };
    Ok(json!({
        "type": kind, "total": groups.len() + pushes.len(), "offset": request.offset, "limit": limit,
        "consumers": consumers,
    }))
}

/// A `CONSUMER.MSG.NEXT` body: `{"batch", "expires", "no_wait", "idle_heartbeat",
/// "max_bytes"}` (times in nanoseconds), a bare batch size, or nothing (one message).
#[derive(Debug, Default, Deserialize)]
struct NextRequest {
    batch: Option<usize>,
    expires: Option<u64>,
    no_wait: Option<bool>,
    idle_heartbeat: Option<u64>,
    max_bytes: Option<usize>,
}

fn parse_next(body: &[u8]) -> Result<NextRequest, String> {
    let text = std::str::from_utf8(body).map_err(|_| "the pull request is not UTF-8".to_owned())?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(NextRequest::default());
    }
    if let Ok(batch) = text.parse::<usize>() {
        return Ok(NextRequest {
            batch: Some(batch),
            ..NextRequest::default()
        });
    }
    serde_json::from_str(text)
        .map_err(|e| format!("the pull request is not the JSON expected: {e}"))
}

/// `CONSUMER.MSG.NEXT`: a pull the group answers on the reply subject, JetStream's
/// way. Problems are status messages there, as nats-server sends them.
pub(super) async fn next(
    broker: &Arc<Broker>,
    store: &Store,
    call: &ApiCall,
    answer: &mut Answer,
    stream: &Stream,
    name: &str,
) {
    let Some(reply) = call.reply.clone() else {
        return;
    };
    let request = match parse_next(&call.body) {
        Ok(request) => request,
        Err(why) => {
            answer.status(&status_block(400, &why, None));
            return;
        }
    };
    let batch = request.batch.unwrap_or(1).max(1);
    if batch > MAX_BATCH {
        let why = format!("Exceeded MaxRequestBatch of {MAX_BATCH}");
        answer.status(&status_block(409, &why, None));
        return;
    }
    if let Err(why) = check_heartbeat(&request) {
        answer.status(&status_block(400, &why, None));
        return;
    }
    let no_wait = request.no_wait.unwrap_or(false);
    let wait = match request.expires {
        Some(nanos) if nanos > 0 => Duration::from_nanos(nanos).clamp(MIN_EXPIRES, MAX_EXPIRES),
        _ if no_wait => Duration::ZERO,
        _ => MAX_EXPIRES,
    };
    let heartbeat = request
        .idle_heartbeat
        .filter(|&nanos| nanos > 0)
        .map(Duration::from_nanos);
    let max_bytes = request.max_bytes.unwrap_or(0);
    let ordered = super::push::readable(broker, call, stream, name);
    let group = match (&ordered, stored(store, &call.routes.name, name).await) {
        // One on another stream is not there for this one.
        (Err(e), _) if e.err_code == 10014 => {
            answer.status(no_responders_block());
            return;
        }
        (Ok(Some(_)) | Err(_), _) => None,
        (Ok(None), Ok(Some(group))) if stream.holds(&group.spec.pattern) => Some(group),
        // nats-server has nobody listening on a missing consumer's subject.
        _ => {
            answer.status(no_responders_block());
            return;
        }
    };
    let readable = group
        .as_ref()
        .is_none_or(|group| may_read(broker, &call.principal, &group.spec.pattern));
    if ordered.is_err() || !readable {
        answer.status(&status_block(
            409,
            &crate::api::groups::unreadable(name),
            None,
        ));
        return;
    }
    // A pull that may wait holds a place among its connection's.
    let place = if wait.is_zero() {
        None
    } else {
        match broker.groups().pull_place(call.origin) {
            Some(place) => Some(place),
            None => {
                answer.status(&status_block(409, "Exceeded MaxWaiting", None));
                return;
            }
        }
    };
    if let Ok(Some(handle)) = ordered {
        let pull = OrderedPull {
            reply,
            batch,
            max_bytes,
            wait,
            no_wait,
            heartbeat,
            place,
        };
        super::push::pull(&handle, pull, answer);
        return;
    }
    let pull = Pull {
        // One connection is one member, however many inboxes its pulls use.
        member: format!("conn:{}", call.origin),
        max: batch,
        wait,
        reply,
        routes: Arc::clone(&call.routes),
        style: PullStyle::JetStream {
            stream: Arc::from(stream.name()),
            terms: JetStreamPull {
                no_wait,
                heartbeat,
                max_bytes,
                push: false,
            },
        },
        place,
    };
    if !broker.groups().pull(&call.routes, name, pull).await {
        answer.status(no_responders_block());
    }
}

/// nats-server's rule for a pull's idle heartbeat (at most half its `expires`, so a
/// heartbeat without `expires` is refused too), and Canopy's floor, [`MIN_HEARTBEAT`].
/// The answer is the status description nats-server would send.
fn check_heartbeat(request: &NextRequest) -> Result<(), String> {
    let Some(nanos) = request.idle_heartbeat.filter(|&n| n > 0) else {
        return Ok(());
    };
    if nanos.saturating_mul(2) > request.expires.unwrap_or(0) {
        return Err("Bad Request - heartbeat value too large".into());
    }
    if Duration::from_nanos(nanos) < MIN_HEARTBEAT {
        return Err(format!(
            "Bad Request - idle heartbeat needs to be at least {}ms",
            MIN_HEARTBEAT.as_millis()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_consumers_config_becomes_a_group_and_back() {
        let config = json!({
            "durable_name": "billing", "filter_subject": "orders.>",
            "deliver_policy": "all", "ack_policy": "explicit",
            "ack_wait": 2_000_000_000u64, "max_deliver": 3, "max_ack_pending": 50,
            "replay_policy": "instant", "inactive_threshold": 0, "idle_heartbeat": 0,
        });
        let spec = spec_of("billing", &config).expect("accepted");
        assert_eq!(spec.pattern, "orders.>");
        assert_eq!(
            (
                spec.ack_wait_ms,
                spec.max_deliveries,
                spec.per_member,
                spec.per_subject
            ),
            (2_000, 3, 50, 50)
        );
        assert_eq!(spec.start, StartAt::All);
        let back = config_of(&spec);
        assert_eq!(spec_of("billing", &back).expect("round trip"), spec);
        assert_eq!(back["ack_wait"], json!(2_000_000_000u64));
        assert_eq!(back["metadata"][PER_SUBJECT_KEY], json!("50"));
    }

    #[test]
    fn defaults_and_metadata_fill_what_jetstream_cannot_say() {
        let spec = spec_of(
            "c",
            &json!({"max_deliver": -1, "metadata": {"canopy.per_subject": "1"}}),
        )
        .expect("accepted");
        assert_eq!(spec.pattern, ">");
        assert_eq!(spec.max_deliveries, 0, "-1 is no limit");
        assert_eq!(spec.per_subject, 1);
        assert_eq!(spec.ack_wait_ms, Limits::default().ack_wait_ms);
        let timed = spec_of(
            "c",
            &json!({"deliver_policy": "by_start_time", "opt_start_time": "2026-12-02T13:10:54.5Z"}),
        )
        .expect("accepted");
        assert_eq!(timed.start, StartAt::Time(1_796_217_054_500));
        assert_eq!(spec_of("c", &config_of(&timed)).expect("round trip"), timed);
    }

    #[test]
    fn what_canopy_cannot_serve_is_refused_with_why() {
        for (config, says) in [
            (json!({"ack_policy": "all"}), "explicit"),
            (json!({"deliver_policy": "last"}), "not offered"),
            (json!({"filter_subjects": ["a", "b"]}), "one filter"),
            (json!({"durable_name": "other"}), "does not match"),
            (json!({"filter_subject": "a..b"}), "pattern"),
            (json!({"metadata": {"canopy.per_subject": "x"}}), "number"),
        ] {
            let error = spec_of("c", &config).expect_err("refused");
            assert!(
                error.description.contains(says),
                "{config}: {}",
                error.description
            );
        }
    }

    #[test]
    fn a_heartbeat_is_at_most_half_the_expiry_and_at_least_the_floor() {
        let pull = |expires, idle_heartbeat| NextRequest {
            expires,
            idle_heartbeat,
            ..NextRequest::default()
        };
        let second = 1_000_000_000;
        assert!(check_heartbeat(&pull(Some(second), None)).is_ok());
        assert!(check_heartbeat(&pull(Some(second), Some(0))).is_ok());
        assert!(check_heartbeat(&pull(Some(second), Some(second / 2))).is_ok());
        let too_large = check_heartbeat(&pull(Some(second), Some(second / 2 + 1)));
        assert!(too_large.unwrap_err().contains("too large"));
        assert!(check_heartbeat(&pull(None, Some(second))).is_err());
        let small = check_heartbeat(&pull(Some(second), Some(1)));
        assert!(small.unwrap_err().contains("100ms"));
    }

    #[test]
    fn pull_bodies_come_in_three_forms() {
        let json = parse_next(br#"{"batch":5,"expires":1000000000,"no_wait":true,"heartbeat":null,"idle_heartbeat":null}"#);
        let json = json.expect("parses");
        assert_eq!(
            (json.batch, json.expires, json.no_wait),
            (Some(5), Some(1_000_000_000), Some(true))
        );
        assert_eq!(parse_next(b"7").expect("parses").batch, Some(7));
        assert_eq!(parse_next(b"").expect("parses").batch, None);
        assert!(parse_next(b"{nope").is_err());
    }
}
