//! `/metrics`: the Prometheus text of the counters the broker, sessions and store keep,
//! the whole server's or only the caller's tenant's.
//!
//! Must never: show a tenant's lines to a user of another tenant, or count anything
//! itself (it only reads what others keep).

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::metrics::Protocol;
use crate::store::stats::{BUCKETS, Latency};
use crate::tenancy::{DEFAULT_TENANT, Principal};

use super::HttpState;
use super::caller::Caller;

/// What a caller of `/metrics` is shown.
pub enum MetricsScope {
    /// Every line: without required logins, or to a user of the default tenant.
    Everything,
    /// Only the lines of this tenant (`tenant="…"`): no server-wide totals, no
    /// other tenant's name.
    Tenant(Arc<str>),
}

impl MetricsScope {
    /// With logins required, a user of the default tenant sees everything and a
    /// user of another tenant its own lines; a guest (no credentials, let in under
    /// anonymous rules) sees nothing (`None`), like a caller without a token.
    pub(super) fn of(state: &HttpState, principal: &Principal) -> Option<MetricsScope> {
        if !state.require_login {
            return Some(MetricsScope::Everything);
        }
        if principal.is_guest() {
            return None;
        }
        Some(if &*principal.tenant == DEFAULT_TENANT {
            MetricsScope::Everything
        } else {
            MetricsScope::Tenant(Arc::clone(&principal.tenant))
        })
    }

    /// The tenant whose subjects are counted.
    fn subjects_tenant(&self) -> &str {
        match self {
            MetricsScope::Everything => DEFAULT_TENANT,
            MetricsScope::Tenant(name) => name,
        }
    }
}

pub(super) async fn metrics(State(state): State<HttpState>, Caller(principal): Caller) -> Response {
    let Some(scope) = MetricsScope::of(&state, &principal) else {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "metrics need a user's login\n",
        )
            .into_response();
    };
    let subjects = match state.broker.store() {
        Some(store) => store.subject_count(scope.subjects_tenant()).await.ok(),
        None => None,
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render(&state, &scope, subjects),
    )
        .into_response()
}

/// The Prometheus text exposition of the counters `scope` shows; `subjects` is the
/// subject count of the scope's tenant (the default tenant for everything) when the
/// store could tell.
pub fn render(state: &HttpState, scope: &MetricsScope, subjects: Option<u64>) -> String {
    let mut out = String::with_capacity(4096);
    let only = match scope {
        MetricsScope::Everything => {
            render_server_wide(&mut out, state);
            None
        }
        MetricsScope::Tenant(name) => Some(&**name),
    };
    render_tenants(&mut out, state, only, subjects);
    if only.is_none() {
        render_mqtt_and_store(&mut out, state);
        render_cluster(&mut out, state);
    }
    out
}

/// This node's part in its cluster, when it is in one.
fn render_cluster(out: &mut String, state: &HttpState) {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(mesh) = state.broker.mesh() else {
        return;
    };
    let (here, shards) = mesh.shards_here();
    let gauges = [
        (
            "canopy_cluster_nodes",
            "Live nodes of the cluster, as this node sees it.",
            mesh.client_urls().len() as f64,
        ),
        (
            "canopy_cluster_shards",
            "Shards of the cluster's store.",
            f64::from(shards),
        ),
        (
            "canopy_cluster_shards_owned",
            "Shards this node owns.",
            here as f64,
        ),
    ];
    for (name, help, value) in gauges {
        metric(out, name, "gauge", help, &[(String::new(), value)]);
    }
    let counters = [
        (
            "canopy_cluster_messages_sent_total",
            "Messages sent to other nodes, one per interested node.",
            &mesh.messages_sent,
        ),
        (
            "canopy_cluster_appends_forwarded_total",
            "Publishes forwarded to their shard's owner.",
            &mesh.appends_forwarded,
        ),
        (
            "canopy_cluster_calls_forwarded_total",
            "API calls forwarded to their tenant's owner.",
            &mesh.calls_forwarded,
        ),
        (
            "canopy_cluster_frames_dropped_total",
            "Frames dropped because a link to a node was down or full.",
            &mesh.dropped,
        ),
    ];
    for (name, help, counter) in counters {
        metric(
            out,
            name,
            "counter",
            help,
            &[(String::new(), counter.load(Relaxed) as f64)],
        );
    }
}

/// Appends one metric: its help, its type and its lines (labels, value).
fn metric(out: &mut String, name: &str, kind: &str, help: &str, lines: &[(String, f64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in lines {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

/// Totals of the whole server, every tenant's included.
fn render_server_wide(out: &mut String, state: &HttpState) {
    let metrics = state.broker.metrics();
    let snap = metrics.snapshot();
    let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, f64)]| {
        metric(out, name, kind, help, lines)
    };
    let plain = |v: u64| vec![(String::new(), v as f64)];
    metric(
        "canopy_connections",
        "gauge",
        "Open client connections, by protocol.",
        &Protocol::ALL
            .iter()
            .map(|p| {
                (
                    format!("{{protocol=\"{}\"}}", p.name()),
                    metrics.open_connections(*p) as f64,
                )
            })
            .collect::<Vec<_>>(),
    );
    let counters: [(&str, &str, u64); 12] = [
        (
            "canopy_connections_total",
            "Client connections accepted since start.",
            snap.connections_total,
        ),
        (
            "canopy_messages_in_total",
            "Messages published by clients.",
            snap.msgs_in,
        ),
        (
            "canopy_bytes_in_total",
            "Payload bytes published by clients.",
            snap.bytes_in,
        ),
        (
            "canopy_messages_out_total",
            "Messages delivered to subscribers.",
            snap.msgs_out,
        ),
        (
            "canopy_bytes_out_total",
            "Payload and header bytes delivered to subscribers.",
            snap.bytes_out,
        ),
        (
            "canopy_slow_consumers_total",
            "Clients disconnected because they fell too far behind.",
            snap.slow_consumers,
        ),
        (
            "canopy_publisher_stalls_total",
            "Times a publisher's reading waited for subscribers it feeds to catch up.",
            snap.stalls,
        ),
        (
            "canopy_stale_connections_total",
            "Clients dropped for not answering pings.",
            snap.stale_connections,
        ),
        (
            "canopy_password_checks_total",
            "Password verifications of logins, an unknown user's included.",
            snap.password_checks,
        ),
        (
            "canopy_group_catch_up_reads_total",
            "Store reads consumer groups made to catch up (subject pages walked, starts found).",
            snap.group_catch_up_reads,
        ),
        (
            "canopy_group_delivery_reads_total",
            "Store reads consumer groups made to hand out a message they did not hold in memory \
             (one per stored run).",
            snap.group_delivery_reads,
        ),
        (
            "canopy_dropped_total",
            "Deliveries not sent because they exceeded the client's maximum packet size.",
            snap.dropped,
        ),
    ];
    for (name, help, value) in counters {
        metric(name, "counter", help, &plain(value));
    }
    metric(
        "canopy_subscriptions",
        "gauge",
        "Live subscriptions of every protocol, all tenants.",
        &plain(state.broker.subscription_count() as u64),
    );
}

/// The lines by tenant: every tenant's, or `only` that one's.
fn render_tenants(out: &mut String, state: &HttpState, only: Option<&str>, subjects: Option<u64>) {
    let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, f64)]| {
        metric(out, name, kind, help, lines)
    };
    let tenants = state.broker.live_tenants();
    let by_tenant = |value: &dyn Fn(&crate::tenancy::quota::LiveUsage, usize) -> u64| {
        tenants
            .iter()
            .filter(|(name, ..)| only.is_none_or(|only| **name == *only))
            .map(|(name, quota, subs)| {
                (
                    format!("{{tenant=\"{name}\"}}"),
                    value(&quota.counts(), *subs) as f64,
                )
            })
            .collect::<Vec<_>>()
    };
    metric(
        "canopy_tenant_connections",
        "gauge",
        "Open connections, by tenant (tenants that have had one).",
        &by_tenant(&|u, _| u.connections),
    );
    metric(
        "canopy_tenant_subscriptions",
        "gauge",
        "Live subscriptions, by tenant.",
        &by_tenant(&|_, subs| subs as u64),
    );
    metric(
        "canopy_tenant_published_messages_total",
        "counter",
        "Publishes admitted, by tenant.",
        &by_tenant(&|u, _| u.published_msgs),
    );
    metric(
        "canopy_tenant_published_bytes_total",
        "counter",
        "Header and payload bytes of admitted publishes, by tenant.",
        &by_tenant(&|u, _| u.published_bytes),
    );
    metric(
        "canopy_tenant_quota_refusals_total",
        "counter",
        "Connections, subscriptions and publishes refused by a quota, by tenant.",
        &by_tenant(&|u, _| u.refused),
    );
    metric(
        "canopy_tenant_quota_throttled_total",
        "counter",
        "Publishes taken late because the connection was held to the rate, by tenant.",
        &by_tenant(&|u, _| u.throttled),
    );
    let tallies: Vec<_> = state
        .broker
        .tenants()
        .into_iter()
        .filter(|tenant| only.is_none_or(|only| *tenant.name == *only))
        .map(|tenant| {
            let schemas = &tenant.schemas;
            (
                Arc::clone(&tenant.name),
                schemas.refused.load(std::sync::atomic::Ordering::Relaxed),
                schemas
                    .dead_lettered
                    .load(std::sync::atomic::Ordering::Relaxed),
            )
        })
        .collect();
    let schema_lines = |pick: &dyn Fn(u64, u64) -> u64| {
        tallies
            .iter()
            .map(|(name, refused, dead)| {
                (
                    format!("{{tenant=\"{name}\"}}"),
                    pick(*refused, *dead) as f64,
                )
            })
            .collect::<Vec<_>>()
    };
    metric(
        "canopy_tenant_schema_refused_total",
        "counter",
        "Publishes the schema bound to their subject refused, by tenant.",
        &schema_lines(&|refused, _| refused),
    );
    metric(
        "canopy_tenant_schema_dead_lettered_total",
        "counter",
        "Publishes the schema bound to their subject refused, kept as dead letters, by tenant.",
        &schema_lines(&|_, dead| dead),
    );
    if let Some(subjects) = subjects {
        let tenant = only.unwrap_or(DEFAULT_TENANT);
        metric(
            "canopy_subjects",
            "gauge",
            "Stored subjects, by tenant.",
            &[(format!("{{tenant=\"{tenant}\"}}"), subjects as f64)],
        );
    }
}

/// MQTT sessions and the store's latencies: the whole server's.
fn render_mqtt_and_store(out: &mut String, state: &HttpState) {
    if let Some(mqtt) = &state.mqtt {
        metric(
            out,
            "canopy_mqtt_sessions",
            "gauge",
            "MQTT client ids connected or waiting for a delayed will.",
            &[(String::new(), mqtt.live_sessions() as f64)],
        );
    }
    if let Some(store) = state.broker.store() {
        let stats = store.stats();
        histogram(
            out,
            "canopy_store_write_seconds",
            "Time to hand one write to the storage engine: a group commit, or behind the journal one flush of the unflushed rounds.",
            &stats.write,
        );
        histogram(
            out,
            "canopy_store_durable_seconds",
            "Time to make a group commit durable (the journal synced, or the WAL flushed).",
            &stats.durable,
        );
    }
}

fn histogram(out: &mut String, name: &str, help: &str, latency: &Latency) {
    let (buckets, count, sum) = latency.read();
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (bound, cumulative) in BUCKETS.iter().zip(&buckets) {
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum {sum}");
    let _ = writeln!(out, "{name}_count {count}");
}
