//! A small etcd v3 client over etcd's JSON gateway (`/v3/...` on the client port).
//!
//! Canopy needs six things of etcd: leases (grant, keep alive, revoke), plain puts and
//! gets, a create-if-absent transaction, deletes guarded by a revision, prefix listings
//! and prefix watches. The gateway serves exactly those as JSON over HTTP/1.1, so no
//! gRPC stack and no build-time `protoc` come into the server: `cargo run` still needs
//! nothing installed. Keys and values travel base64-encoded, 64-bit integers as
//! strings (the gateway's protobuf-to-JSON mapping).
//!
//! Must never: block on a lost endpoint longer than the request timeout (every call
//! but a watch has one), or retry a write by itself (a caller that claims a shard must
//! see that its claim's fate is unknown, not a second claim's).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

/// What a call to etcd can fail with.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("no etcd endpoint answered (last tried {endpoint}): {reason}")]
    Unreachable { endpoint: String, reason: String },
    #[error("etcd answered {status} to {path}: {body}")]
    Status {
        path: &'static str,
        status: u16,
        body: String,
    },
    #[error("etcd's answer to {path} could not be read: {reason}")]
    Decode { path: &'static str, reason: String },
    #[error("the etcd watch ended: {0}")]
    WatchEnded(String),
}

/// A key and its value as etcd holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// The revision that created the key: it grows with every creation, so it tells
    /// one claim of a key from a later one.
    pub create_revision: i64,
    pub mod_revision: i64,
    /// The lease the key dies with (0: none).
    pub lease: i64,
}

/// What a create-if-absent came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// The key is ours, created at this revision.
    Yes { revision: i64 },
    /// It existed already, with this value (`None`: deleted again before it could be read).
    Taken(Option<KeyValue>),
}

/// One change a watch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Put(KeyValue),
    /// The key was deleted or its lease expired.
    Delete {
        key: String,
        mod_revision: i64,
    },
}

/// A client of one etcd cluster; cheap to clone.
#[derive(Clone)]
pub struct Etcd {
    http: reqwest::Client,
    timeout: Duration,
    endpoints: std::sync::Arc<[String]>,
    /// The endpoint that answered last, tried first next time.
    current: std::sync::Arc<AtomicUsize>,
}

const GRANT: &str = "/v3/lease/grant";
const KEEP_ALIVE: &str = "/v3/lease/keepalive";
const REVOKE: &str = "/v3/lease/revoke";
const TIME_TO_LIVE: &str = "/v3/lease/timetolive";
const PUT: &str = "/v3/kv/put";
const RANGE: &str = "/v3/kv/range";
const TXN: &str = "/v3/kv/txn";
const WATCH: &str = "/v3/watch";

impl Etcd {
    /// A client of the etcd members at `endpoints` (`http://host:port`), each call
    /// bounded by `timeout`.
    pub fn new(endpoints: &[String], timeout: Duration) -> Result<Self, EtcdError> {
        let endpoints: Vec<String> = endpoints
            .iter()
            .map(|e| e.trim_end_matches('/').to_owned())
            .collect();
        if endpoints.is_empty() {
            return Err(EtcdError::Unreachable {
                endpoint: String::new(),
                reason: "no endpoint configured".into(),
            });
        }
        // No client-wide timeout: a watch stays open for as long as the process wants
        // it, so each bounded call sets its own.
        let http = reqwest::Client::builder()
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| EtcdError::Unreachable {
                endpoint: endpoints[0].clone(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            http,
            timeout,
            endpoints: endpoints.into(),
            current: std::sync::Arc::default(),
        })
    }

    /// Grants a lease of `ttl_secs`; returns its id.
    pub async fn grant(&self, ttl_secs: u64) -> Result<i64, EtcdError> {
        let answer = self
            .call(GRANT, json!({ "TTL": ttl_secs.to_string() }))
            .await?;
        let id = int(&answer, "ID");
        if id == 0 {
            return Err(decode(GRANT, format!("no lease id in {answer}")));
        }
        Ok(id)
    }

    /// Renews lease `id`. `None`: the lease is gone (expired or revoked).
    pub async fn keep_alive(&self, id: i64) -> Result<Option<u64>, EtcdError> {
        let answer = self
            .call(KEEP_ALIVE, json!({ "ID": id.to_string() }))
            .await?;
        // A stream's answer comes wrapped in `result`; a gone lease has no TTL.
        let result = answer.get("result").unwrap_or(&answer);
        let ttl = int(result, "TTL");
        Ok((ttl > 0).then_some(ttl as u64))
    }

    /// Revokes lease `id`: every key attached to it is deleted at once.
    pub async fn revoke(&self, id: i64) -> Result<(), EtcdError> {
        match self.call(REVOKE, json!({ "ID": id.to_string() })).await {
            // Revoking a lease that is already gone is what the caller wanted.
            Err(EtcdError::Status { body, .. }) if body.contains("not found") => Ok(()),
            other => other.map(drop),
        }
    }

    /// Puts `key` (attached to `lease` when not 0).
    pub async fn put(&self, key: &str, value: &[u8], lease: i64) -> Result<(), EtcdError> {
        self.call(PUT, put_body(key, value, lease)).await.map(drop)
    }

    /// Creates `key` only if it does not exist.
    pub async fn create(&self, key: &str, value: &[u8], lease: i64) -> Result<Created, EtcdError> {
        let body = json!({
            "compare": [{ "key": B64.encode(key), "target": "CREATE",
                          "result": "EQUAL", "create_revision": "0" }],
            "success": [{ "request_put": put_body(key, value, lease) }],
            "failure": [{ "request_range": { "key": B64.encode(key) } }],
        });
        let answer = self.call(TXN, body).await?;
        if answer.get("succeeded").and_then(Value::as_bool) == Some(true) {
            let revision = answer.pointer("/header/revision").map_or(0, as_int);
            return Ok(Created::Yes { revision });
        }
        let existing = answer
            .pointer("/responses/0/response_range/kvs/0")
            .map(|kv| key_value(TXN, kv))
            .transpose()?;
        Ok(Created::Taken(existing))
    }

    /// Seconds lease `id` has left, `None` when it is gone.
    pub async fn time_to_live(&self, id: i64) -> Result<Option<i64>, EtcdError> {
        let answer = self
            .call(TIME_TO_LIVE, json!({ "ID": id.to_string() }))
            .await?;
        let ttl = int(&answer, "TTL");
        Ok((ttl >= 0 && answer.get("TTL").is_some()).then_some(ttl))
    }

    /// Deletes `key` if it is still the one created at `create_revision`; false when
    /// it was not (already gone, or claimed again since).
    pub async fn delete_if_created_at(
        &self,
        key: &str,
        create_revision: i64,
    ) -> Result<bool, EtcdError> {
        let body = json!({
            "compare": [{ "key": B64.encode(key), "target": "CREATE",
                          "result": "EQUAL", "create_revision": create_revision.to_string() }],
            "success": [{ "request_delete_range": { "key": B64.encode(key) } }],
        });
        let answer = self.call(TXN, body).await?;
        Ok(answer.get("succeeded").and_then(Value::as_bool) == Some(true))
    }

    /// Puts `key` only while `guard` is still the key created at `created_at`: how
    /// an owner writes for its shard, so a node whose claim is gone writes nothing.
    /// False when the guard no longer holds.
    pub async fn put_guarded(
        &self,
        key: &str,
        value: &[u8],
        guard: &str,
        created_at: i64,
    ) -> Result<bool, EtcdError> {
        let request = json!({ "request_put": put_body(key, value, 0) });
        self.guarded(guard, created_at, request).await
    }

    /// Deletes `key` only while `guard` is still the key created at `created_at`.
    pub async fn delete_guarded(
        &self,
        key: &str,
        guard: &str,
        created_at: i64,
    ) -> Result<bool, EtcdError> {
        let request = json!({ "request_delete_range": { "key": B64.encode(key) } });
        self.guarded(guard, created_at, request).await
    }

    async fn guarded(
        &self,
        guard: &str,
        created_at: i64,
        request: Value,
    ) -> Result<bool, EtcdError> {
        let body = json!({
            "compare": [{ "key": B64.encode(guard), "target": "CREATE",
                          "result": "EQUAL", "create_revision": created_at.to_string() }],
            "success": [request],
        });
        let answer = self.call(TXN, body).await?;
        Ok(answer.get("succeeded").and_then(Value::as_bool) == Some(true))
    }

    /// Follows everything under `prefix` until `stop`: a listing (handed to
    /// `listed` with its revision; false sends it back for another listing a moment
    /// later), then a watch from the listing's revision (each batch of events to
    /// `changed`), listed again whenever the watch breaks.
    pub async fn follow(
        &self,
        prefix: &str,
        stop: &tokio_util::sync::CancellationToken,
        mut listed: impl FnMut(Vec<KeyValue>, i64) -> bool,
        mut changed: impl FnMut(&[Event]),
    ) {
        let pause = || async {
            tokio::select! {
                () = stop.cancelled() => true,
                () = tokio::time::sleep(Duration::from_millis(500)) => false,
            }
        };
        loop {
            let revision = match self.list(prefix).await {
                Ok((kvs, revision)) => {
                    if !listed(kvs, revision) {
                        if pause().await {
                            return;
                        }
                        continue;
                    }
                    revision
                }
                Err(e) => {
                    tracing::warn!(prefix, error = %e, "could not list in etcd; trying again");
                    if pause().await {
                        return;
                    }
                    continue;
                }
            };
            let mut watch = match self.watch(prefix, revision + 1).await {
                Ok(watch) => watch,
                Err(e) => {
                    tracing::warn!(prefix, error = %e, "could not watch in etcd; listing again");
                    if pause().await {
                        return;
                    }
                    continue;
                }
            };
            loop {
                let events = tokio::select! {
                    () = stop.cancelled() => return,
                    events = watch.next() => events,
                };
                match events {
                    Ok(events) => changed(&events),
                    Err(e) => {
                        tracing::debug!(prefix, error = %e, "the watch ended; listing again");
                        break;
                    }
                }
            }
        }
    }

    /// The key, if it exists.
    pub async fn get(&self, key: &str) -> Result<Option<KeyValue>, EtcdError> {
        let answer = self.call(RANGE, json!({ "key": B64.encode(key) })).await?;
        answer
            .pointer("/kvs/0")
            .map(|kv| key_value(RANGE, kv))
            .transpose()
    }

    /// Every key under `prefix`, and the revision the listing was taken at (a watch
    /// from the next revision misses nothing).
    pub async fn list(&self, prefix: &str) -> Result<(Vec<KeyValue>, i64), EtcdError> {
        let body = json!({
            "key": B64.encode(prefix),
            "range_end": B64.encode(prefix_end(prefix)),
        });
        let answer = self.call(RANGE, body).await?;
        let revision = answer.pointer("/header/revision").map_or(0, as_int);
        let kvs = match answer.get("kvs").and_then(Value::as_array) {
            Some(kvs) => kvs
                .iter()
                .map(|kv| key_value(RANGE, kv))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        Ok((kvs, revision))
    }

    /// Watches every key under `prefix` from `start_revision` on.
    pub async fn watch(&self, prefix: &str, start_revision: i64) -> Result<Watch, EtcdError> {
        let body = json!({ "create_request": {
            "key": B64.encode(prefix),
            "range_end": B64.encode(prefix_end(prefix)),
            "start_revision": start_revision.to_string(),
        }});
        let (endpoint, response) = self.send(WATCH, &body, false).await?;
        Ok(Watch {
            endpoint,
            response,
            buffer: Vec::new(),
        })
    }

    async fn call(&self, path: &'static str, body: Value) -> Result<Value, EtcdError> {
        let (_, response) = self.send(path, &body, true).await?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| decode(path, e.to_string()))?;
        if !status.is_success() {
            return Err(EtcdError::Status {
                path,
                status: status.as_u16(),
                body: String::from_utf8_lossy(&bytes).into_owned(),
            });
        }
        let value: Value =
            serde_json::from_slice(&bytes).map_err(|e| decode(path, e.to_string()))?;
        // A gateway error can come with status 200 inside a stream's wrapper.
        if let Some(error) = value.get("error") {
            return Err(EtcdError::Status {
                path,
                status: error.get("http_code").map_or(500, |c| as_int(c) as u16),
                body: error.to_string(),
            });
        }
        Ok(value)
    }

    /// Sends to the endpoint that answered last, then to the others in turn.
    async fn send(
        &self,
        path: &'static str,
        body: &Value,
        bounded: bool,
    ) -> Result<(String, reqwest::Response), EtcdError> {
        let first = self.current.load(Ordering::Relaxed);
        let mut last_error = String::new();
        for step in 0..self.endpoints.len() {
            let at = (first + step) % self.endpoints.len();
            let endpoint = &self.endpoints[at];
            let mut request = self
                .http
                .post(format!("{endpoint}{path}"))
                .header("content-type", "application/json")
                .body(body.to_string());
            if bounded {
                request = request.timeout(self.timeout);
            }
            match request.send().await {
                Ok(response) => {
                    self.current.store(at, Ordering::Relaxed);
                    return Ok((endpoint.clone(), response));
                }
                Err(e) => last_error = e.to_string(),
            }
        }
        Err(EtcdError::Unreachable {
            endpoint: self.endpoints[(first + self.endpoints.len() - 1) % self.endpoints.len()]
                .clone(),
            reason: last_error,
        })
    }
}

/// An open watch: its changes come in order, a batch per revision.
pub struct Watch {
    endpoint: String,
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Watch {
    /// The next batch of changes. An error ends the watch; the caller lists again and
    /// watches from the listing's revision.
    pub async fn next(&mut self) -> Result<Vec<Event>, EtcdError> {
        loop {
            if let Some(events) = self.take_message()? {
                if !events.is_empty() {
                    return Ok(events);
                }
                continue;
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) => {
                    return Err(EtcdError::WatchEnded(format!(
                        "{} closed the stream",
                        self.endpoint
                    )));
                }
                Err(e) => return Err(EtcdError::WatchEnded(e.to_string())),
            }
        }
    }

    /// One whole JSON message off the buffer, if there is one.
    fn take_message(&mut self) -> Result<Option<Vec<Event>>, EtcdError> {
        let mut messages = serde_json::Deserializer::from_slice(&self.buffer).into_iter::<Value>();
        let message = match messages.next() {
            Some(Ok(message)) => message,
            Some(Err(e)) if e.is_eof() => return Ok(None),
            Some(Err(e)) => return Err(decode(WATCH, e.to_string())),
            None => return Ok(None),
        };
        let used = messages.byte_offset();
        self.buffer.drain(..used);
        if let Some(error) = message.get("error") {
            return Err(EtcdError::WatchEnded(error.to_string()));
        }
        let result = message.get("result").unwrap_or(&message);
        if result.get("canceled").and_then(Value::as_bool) == Some(true) {
            let reason = result
                .get("cancel_reason")
                .and_then(Value::as_str)
                .unwrap_or("compacted");
            return Err(EtcdError::WatchEnded(format!("canceled: {reason}")));
        }
        let Some(events) = result.get("events").and_then(Value::as_array) else {
            return Ok(Some(Vec::new()));
        };
        events.iter().map(event).collect::<Result<_, _>>().map(Some)
    }
}

fn event(raw: &Value) -> Result<Event, EtcdError> {
    let kv = raw
        .get("kv")
        .ok_or_else(|| decode(WATCH, format!("an event without kv: {raw}")))?;
    // The gateway leaves out enum fields at their zero value: no type is a PUT.
    if raw.get("type").and_then(Value::as_str) == Some("DELETE") {
        return Ok(Event::Delete {
            key: text(WATCH, kv, "key")?,
            mod_revision: kv.get("mod_revision").map_or(0, as_int),
        });
    }
    key_value(WATCH, kv).map(Event::Put)
}

fn put_body(key: &str, value: &[u8], lease: i64) -> Value {
    let mut body = json!({ "key": B64.encode(key), "value": B64.encode(value) });
    if lease != 0 {
        body["lease"] = Value::String(lease.to_string());
    }
    body
}

/// The end of the range of keys starting with `prefix`: the prefix with its last byte
/// raised by one (etcd's own `WithPrefix`).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range runs to the end of the key space.
    vec![0]
}

fn key_value(path: &'static str, kv: &Value) -> Result<KeyValue, EtcdError> {
    Ok(KeyValue {
        key: text(path, kv, "key")?,
        value: bytes(path, kv, "value")?,
        create_revision: int(kv, "create_revision"),
        mod_revision: int(kv, "mod_revision"),
        lease: int(kv, "lease"),
    })
}

fn bytes(path: &'static str, value: &Value, field: &str) -> Result<Vec<u8>, EtcdError> {
    match value.get(field).and_then(Value::as_str) {
        // An empty value is left out.
        None => Ok(Vec::new()),
        Some(b64) => B64
            .decode(b64)
            .map_err(|e| decode(path, format!("{field}: {e}"))),
    }
}

fn text(path: &'static str, value: &Value, field: &str) -> Result<String, EtcdError> {
    String::from_utf8(bytes(path, value, field)?)
        .map_err(|_| decode(path, format!("{field} is not UTF-8")))
}

/// A 64-bit integer field, which the gateway writes as a string (0 when left out).
fn int(value: &Value, field: &str) -> i64 {
    value.get(field).map_or(0, as_int)
}

fn as_int(value: &Value) -> i64 {
    match value {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn decode(path: &'static str, reason: String) -> EtcdError {
    EtcdError::Decode { path, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_where_its_last_byte_is_raised() {
        assert_eq!(prefix_end("canopy/nodes/"), b"canopy/nodes0".to_vec());
        assert_eq!(prefix_end("a"), b"b".to_vec());
    }

    #[test]
    fn an_event_without_a_type_is_a_put_and_integers_come_as_strings() {
        let put = json!({"kv": {"key": B64.encode("k"), "value": B64.encode("v"),
                                "create_revision": "7", "mod_revision": "9", "lease": "42"}});
        assert_eq!(
            event(&put).unwrap(),
            Event::Put(KeyValue {
                key: "k".into(),
                value: b"v".to_vec(),
                create_revision: 7,
                mod_revision: 9,
                lease: 42,
            })
        );
        let delete =
            json!({"type": "DELETE", "kv": {"key": B64.encode("k"), "mod_revision": "10"}});
        assert_eq!(
            event(&delete).unwrap(),
            Event::Delete {
                key: "k".into(),
                mod_revision: 10
            }
        );
    }
}
