//! The HTTP admin and metrics endpoints (as upstream's master) on the metrics port, and the optional
//! `/metadata?key=` store on its own port.
//!
//! Error bodies are `{"success":false,"error_code":<int>,"error_message":<name>}` with upstream's
//! status mapping. Unlike upstream, `/query_key` does not grant a lease: an admin looking at a key
//! must not block its removal for ten seconds.
//!
//! With the cluster's token (`--auth_token_file`), every endpoint except the monitoring ones
//! ([`OPEN_ADMIN_PATHS`]: metrics, health, role) needs `Authorization: Bearer TOKEN`: the
//! mutations (`remove_all`, `snapshot`, tenant quotas) and the reads that reveal keys or replica
//! descriptors (whose endpoints carry data-port capabilities). A missing or wrong token is
//! answered 401 with `ILLEGAL_CLIENT` (-601) and does nothing.

use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use mooncake_common::{
    format_size, AuthToken, ErrorCode, ReplicaDescriptor, ReplicaKind, ReplicaStatus, SegmentStatus,
};
use mooncake_master::MasterService;
use parking_lot::RwLock;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use crate::metrics::{gauge, RpcMetrics};

/// What the admin endpoints read.
#[derive(Debug, Clone)]
pub struct AdminState {
    pub master: Arc<MasterService>,
    pub metrics: Arc<RpcMetrics>,
    pub rpc_stats: Option<Arc<mooncake_rpc::ServerStats>>,
    pub workers: Arc<crate::metrics::WorkerMetrics>,
    pub cluster_id: String,
    /// Where quota admin changes are persisted (the tenant policy file, if configured).
    pub tenant_policy: Arc<crate::tenant_policy::TenantPolicyStore>,
    /// The snapshot writer (`POST /api/v1/snapshot`), when a snapshot directory is configured.
    pub snapshots: Option<Arc<crate::snapshot::Snapshotter>>,
    pub snapshot_metrics: Arc<crate::snapshot::SnapshotMetrics>,
    /// The cluster's token: required (`Authorization: Bearer`) by every endpoint but the
    /// monitoring ones.
    pub auth_token: Option<AuthToken>,
    /// This master's role in the election (crate::ha).
    pub ha: Arc<crate::ha::HaStatus>,
}

/// Admin paths served without a token even when one is configured: monitoring only (no key,
/// no descriptor, no mutation).
pub const OPEN_ADMIN_PATHS: &[&str] = &[
    "/metrics",
    "/metrics/summary",
    "/health",
    "/role",
    "/ha_status",
    "/leader",
];

/// Lets a request through only with `Authorization: Bearer <token>` (scheme case-insensitive,
/// token compared in constant time); 401 with `ILLEGAL_CLIENT` otherwise.
async fn require_bearer(State(token): State<AuthToken>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| {
            let value = value.as_bytes();
            let space = value.iter().position(|&b| b == b' ')?;
            let (scheme, rest) = value.split_at(space);
            scheme
                .eq_ignore_ascii_case(b"bearer")
                .then(|| rest.trim_ascii())
        });
    let why = match presented {
        Some(presented) if token.verify(presented) => return next.run(request).await,
        Some(_) => "wrong token",
        None => "authentication required: send Authorization: Bearer <token> (the master's --auth_token_file)",
    };
    let body = json!({
        "success": false,
        "error_code": ErrorCode::ILLEGAL_CLIENT.as_i32(),
        "error_message": why,
    });
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(body),
    )
        .into_response()
}

/// `router` behind [`require_bearer`] when a token is configured.
fn guarded<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    token: Option<&AuthToken>,
) -> Router<S> {
    match token {
        Some(token) => router.route_layer(middleware::from_fn_with_state(
            token.clone(),
            require_bearer,
        )),
        None => router,
    }
}

/// Upstream's status mapping for error bodies.
pub fn http_status(code: ErrorCode) -> StatusCode {
    let name = code.name();
    if code == ErrorCode::INVALID_PARAMS {
        StatusCode::BAD_REQUEST
    } else if name.ends_with("_NOT_FOUND") || code == ErrorCode::TENANT_NOT_REGISTERED {
        StatusCode::NOT_FOUND
    } else if name.starts_with("UNAVAILABLE_") || code == ErrorCode::TENANT_NOT_EMPTY {
        StatusCode::CONFLICT
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

pub(crate) fn error_response(code: ErrorCode, message: Option<&str>) -> Response {
    let body = json!({
        "success": false,
        "error_code": code.as_i32(),
        "error_message": message.unwrap_or(code.name()),
    });
    (http_status(code), axum::Json(body)).into_response()
}

fn text(body: String) -> Response {
    ([("content-type", "text/plain; charset=utf-8")], body).into_response()
}

/// The admin router.
pub fn admin_router(state: AdminState) -> Router {
    let token = state.auth_token.clone();
    let open = Router::new()
        .route("/metrics", get(metrics))
        .route("/metrics/summary", get(summary))
        .route("/health", get(health))
        .route(
            "/role",
            get(|State(state): State<AdminState>| async move { state.ha.role() }),
        )
        .route(
            "/ha_status",
            get(|State(state): State<AdminState>| async move { state.ha.state_name() }),
        )
        .route("/leader", get(leader));
    let protected = Router::new()
        .route("/query_key", get(query_key))
        .route("/batch_query_keys", get(batch_query_keys))
        .route("/get_all_keys", get(get_all_keys))
        .route("/get_all_segments", get(get_all_segments))
        .route("/get_segments_detail", get(get_segments_detail))
        .route("/query_segment", get(query_segment))
        .route("/api/v1/segments/status", get(segment_status))
        .route("/api/v1/remove_all", post(remove_all))
        .route("/api/v1/snapshot", post(take_snapshot))
        .merge(crate::drain_http::routes())
        .route(
            "/api/v1/tenant_quotas",
            get(tenant_quotas_get)
                .put(tenant_quotas_put)
                .delete(tenant_quotas_delete),
        );
    let protected = protected.route_layer(middleware::from_fn_with_state(
        state.ha.clone(),
        require_serving,
    ));
    open.merge(guarded(protected, token.as_ref()))
        .with_state(state)
}

/// A master that does not serve (an HA standby, a leader that stepped down) answers the
/// endpoints that read or change the master's state with 409 `UNAVAILABLE_IN_CURRENT_STATUS`:
/// its own state is not the cluster's.
async fn require_serving(
    State(ha): State<Arc<crate::ha::HaStatus>>,
    request: Request,
    next: Next,
) -> Response {
    if ha.serving() {
        return next.run(request).await;
    }
    let why = format!(
        "this master is not the serving leader ({}); ask the leader (/leader)",
        ha.state_name()
    );
    error_response(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, Some(&why))
}

async fn metrics(State(state): State<AdminState>) -> Response {
    // The census walks every shard: off the async workers.
    let master = state.master.clone();
    let census = match tokio::task::spawn_blocking(move || master.object_census()).await {
        Ok(census) => census,
        Err(_) => return error_response(ErrorCode::INTERNAL_ERROR, None),
    };
    let master = &state.master;
    let mut out = String::with_capacity(16 << 10);
    render_capacity(master, &census, &mut out);
    state.metrics.render(&mut out);
    state.workers.render(master.counters(), &mut out);
    state.snapshot_metrics.render(master, &mut out);
    crate::metrics::render_offload(&master.offload_stats(), &mut out);
    crate::metrics::render_hot_keys(&master.hot_key_stats(), &mut out);
    let core = master.counters();
    crate::metrics::counter(
        &mut out,
        "master_put_start_discard_cnt",
        "Total number of discarded PutStart operations",
        core.put_start_discards(),
    );
    crate::metrics::counter(
        &mut out,
        "master_put_start_release_cnt",
        "Total number of released PutStart operations",
        core.put_start_releases(),
    );
    gauge(
        &mut out,
        "master_put_start_discarded_staging_size",
        "Total size of memory replicas in discarded but not yet released PutStart operations",
        census.discarded_staging_bytes as f64,
    );
    if let Some(stats) = &state.rpc_stats {
        render_rpc_limits(stats, &mut out);
    }
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}

/// Capacity, key and segment gauges of `/metrics` (upstream's family names).
fn render_capacity(
    master: &MasterService,
    census: &mooncake_master::ObjectCensus,
    out: &mut String,
) {
    let usage = master.segment_usage();
    let allocated: u64 = usage.iter().filter_map(|u| u.used_bytes).sum();
    let mut clients: Vec<_> = usage.iter().map(|u| u.client).collect();
    clients.sort_unstable();
    clients.dedup();
    gauge(
        out,
        "master_allocated_bytes",
        "Total memory bytes currently allocated across all segments",
        allocated as f64,
    );
    gauge(
        out,
        "master_total_capacity_bytes",
        "Total memory capacity across all mounted segments",
        master.total_capacity_bytes() as f64,
    );
    gauge(
        out,
        "master_key_count",
        "Total number of keys managed by the master",
        census.objects as f64,
    );
    gauge(
        out,
        "master_soft_pin_key_count",
        "Total number of soft-pinned keys managed by the master",
        census.soft_pinned as f64,
    );
    gauge(
        out,
        "mem_cache_nums_",
        "Current number of cached values in the memory pool",
        census.in_memory as f64,
    );
    gauge(
        out,
        "master_active_clients",
        "Total number of clients with mounted segments",
        clients.len() as f64,
    );
    gauge(
        out,
        "master_mounted_segments",
        "Number of mounted segments",
        usage.len() as f64,
    );
    gauge(
        out,
        "master_suspected_segments",
        "Mounted segments out of placement after a reported transfer failure",
        master.suspected_segments().len() as f64,
    );
    let _ = writeln!(out, "# HELP segment_allocated_bytes Total memory bytes currently allocated of the segment\n# TYPE segment_allocated_bytes gauge");
    for u in &usage {
        let _ = writeln!(
            out,
            "segment_allocated_bytes{{segment=\"{}\"}} {}",
            escape_label(&u.name),
            u.used_bytes.unwrap_or(0)
        );
    }
    let _ = writeln!(out, "# HELP segment_total_capacity_bytes Total memory capacity of the mounted segment\n# TYPE segment_total_capacity_bytes gauge");
    for u in &usage {
        let _ = writeln!(
            out,
            "segment_total_capacity_bytes{{segment=\"{}\"}} {}",
            escape_label(&u.name),
            u.capacity_bytes
        );
    }
}

/// The RPC server's connection counters and its limits against idle, slow and hostile peers
/// (docs/security.md).
fn render_rpc_limits(stats: &mooncake_rpc::ServerStats, out: &mut String) {
    use std::sync::atomic::Ordering::Relaxed;
    gauge(
        out,
        "master_rpc_connections_open",
        "RPC connections open now",
        stats.connections_open.load(Relaxed) as f64,
    );
    crate::metrics::counter(
        out,
        "master_rpc_connections_refused_total",
        "RPC connections refused at the connection limit",
        stats.connections_refused.load(Relaxed),
    );
    crate::metrics::counter(
        out,
        "master_rpc_frame_errors_total",
        "Malformed frames received",
        stats.frame_errors.load(Relaxed),
    );
    // The limits against idle, slow and hostile peers (docs/security.md).
    for (name, help, value) in [
        (
            "master_rpc_connections_evicted_total",
            "RPC connections closed to make room for a new one",
            &stats.connections_evicted,
        ),
        (
            "master_rpc_handshake_timeouts_total",
            "RPC connections closed for making no valid request in time",
            &stats.handshake_timeouts,
        ),
        (
            "master_rpc_idle_timeouts_total",
            "Identified RPC connections closed by the idle timeout",
            &stats.idle_timeouts,
        ),
        (
            "master_rpc_frame_timeouts_total",
            "RPC connections closed for a frame or a write of answers taking too long",
            &stats.frame_timeouts,
        ),
        (
            "master_rpc_oversized_requests_total",
            "Request frames refused from their header (over their method's limit)",
            &stats.oversized_requests,
        ),
        (
            "master_rpc_budget_waits_total",
            "Large request frames that waited for the shared buffer budget",
            &stats.budget_waits,
        ),
        (
            "master_rpc_frames_shed_total",
            "Partial large frames dropped to give their budget to an older wait",
            &stats.frames_shed,
        ),
        (
            "master_rpc_auth_failures_total",
            "RPC connections closed for a wrong token or a request before authenticating",
            &stats.auth_failures,
        ),
    ] {
        crate::metrics::counter(out, name, help, value.load(Relaxed));
    }
}

pub(crate) fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

async fn summary(State(state): State<AdminState>) -> Response {
    text(format!("{}\n", summary_text(&state.master, &state.ha)))
}

/// The `/metrics/summary` line (also logged every 10 s with `--enable_metric_reporting`).
pub fn summary_text(master: &MasterService, ha: &crate::ha::HaStatus) -> String {
    let usage = master.segment_usage();
    let allocated: u64 = usage.iter().filter_map(|u| u.used_bytes).sum();
    let capacity = master.total_capacity_bytes();
    let percent = if capacity == 0 {
        0.0
    } else {
        allocated as f64 * 100.0 / capacity as f64
    };
    format!(
        "role={}, state={}, service_ready={}, master={{Mem Storage: {} / {} ({percent:.1}%) | Keys: {} | Segments: {}}}",
        ha.role(),
        ha.state_name(),
        ha.serving(),
        format_size(allocated),
        format_size(capacity),
        master.object_count(),
        usage.len(),
    )
}

/// The leader etcd names (`present: false` without election or while nobody leads).
async fn leader(State(state): State<AdminState>) -> Response {
    let view = state.ha.view();
    axum::Json(json!({
        "present": view.is_some(),
        "leader_address": view.as_ref().map(|v| v.leader.clone()),
        "view_version": view.as_ref().map(|v| v.version),
    }))
    .into_response()
}

async fn health(State(state): State<AdminState>) -> Response {
    let view = state.ha.view();
    axum::Json(json!({
        "status": "ok",
        "role": state.ha.role(),
        "ha_state": state.ha.state_name(),
        "service_ready": state.ha.serving(),
        "leader_address": view.as_ref().map(|v| v.leader.clone()),
        "view_version": view.as_ref().map(|v| v.version),
        "cluster_id": state.cluster_id,
    }))
    .into_response()
}

fn memory_values(replicas: &[ReplicaDescriptor]) -> Vec<Value> {
    replicas
        .iter()
        .filter(|r| r.status == ReplicaStatus::COMPLETE)
        .filter_map(|r| match &r.kind {
            ReplicaKind::Memory(m) => Some(json!({
                "size_": m.size,
                "buffer_address_": m.buffer_address,
                "protocol_": &*m.protocol,
                "transport_endpoint_": &*m.transport_endpoint,
            })),
            _ => None,
        })
        .collect()
}

/// The readable memory replicas of `key` without granting a lease.
fn lookup(master: &MasterService, key: &str) -> Result<Vec<Value>, ErrorCode> {
    let replicas = master.all_replica_descriptors(key, "")?;
    let values = memory_values(&replicas);
    if values.is_empty() {
        // Present but not readable (still being written): as GetReplicaList would say.
        return Err(ErrorCode::REPLICA_IS_NOT_READY);
    }
    Ok(values)
}

async fn query_key(
    State(state): State<AdminState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Some(key) = q.get("key").filter(|k| !k.is_empty()) else {
        return error_response(ErrorCode::INVALID_PARAMS, Some("missing key"));
    };
    match lookup(&state.master, key) {
        Ok(values) => axum::Json(json!({"success": true, "data": values})).into_response(),
        Err(code) => error_response(code, None),
    }
}

async fn batch_query_keys(
    State(state): State<AdminState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Some(keys) = q.get("keys").filter(|k| !k.is_empty()) else {
        return error_response(ErrorCode::INVALID_PARAMS, Some("missing keys"));
    };
    let mut data = serde_json::Map::new();
    for key in keys
        .split(',')
        .filter(|k| !k.is_empty())
        .take(mooncake_proto::limits::DEFAULT_MAX_BATCH_LEN)
    {
        let entry = match lookup(&state.master, key) {
            Ok(values) => json!({"ok": true, "error": null, "values": values}),
            Err(code) => json!({"ok": false, "error": code.name(), "values": null}),
        };
        data.insert(key.to_string(), entry);
    }
    axum::Json(json!({"success": true, "data": data})).into_response()
}

async fn get_all_keys(State(state): State<AdminState>) -> Response {
    match state.master.get_all_keys("") {
        Ok(keys) => {
            let mut body = String::new();
            for key in keys {
                body.push_str(&key);
                body.push('\n');
            }
            text(body)
        }
        Err(code) => error_response(code, None),
    }
}

async fn get_all_segments(State(state): State<AdminState>) -> Response {
    let mut names: Vec<String> = state
        .master
        .segment_usage()
        .into_iter()
        .filter(|u| u.status == SegmentStatus::OK)
        .map(|u| u.name)
        .collect();
    names.sort();
    names.dedup();
    let mut body = String::new();
    for name in names {
        body.push_str(&name);
        body.push('\n');
    }
    text(body)
}

async fn get_segments_detail(State(state): State<AdminState>) -> Response {
    let usage = state.master.segment_usage();
    let segments: Vec<Value> = usage
        .iter()
        .map(|u| {
            let used = u.used_bytes.unwrap_or(0);
            let percent = if u.capacity_bytes == 0 {
                0.0
            } else {
                used as f64 * 100.0 / u.capacity_bytes as f64
            };
            json!({
                "segment_name": u.name,
                "segment_id": u.id.to_string(),
                "client_id": u.client.to_string(),
                "base_address": format!("{:#x}", u.base),
                "size_bytes": u.capacity_bytes,
                "size_human": format_size(u.capacity_bytes),
                "status": format!("{:?}", u.status),
                "allocator_used_bytes": used,
                "allocator_capacity_bytes": u.capacity_bytes,
                "allocator_usage_percent": percent,
                "live_buffers": u.live_buffers,
            })
        })
        .collect();
    axum::Json(json!({"total_segments": segments.len(), "segments": segments})).into_response()
}

async fn query_segment(
    State(state): State<AdminState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Some(name) = q.get("segment").filter(|k| !k.is_empty()) else {
        return error_response(ErrorCode::INVALID_PARAMS, Some("missing segment"));
    };
    let matching: Vec<_> = state
        .master
        .segment_usage()
        .into_iter()
        .filter(|u| &u.name == name)
        .collect();
    if matching.is_empty() {
        return error_response(ErrorCode::SEGMENT_NOT_FOUND, None);
    }
    let used: u64 = matching.iter().filter_map(|u| u.used_bytes).sum();
    let capacity: u64 = matching.iter().map(|u| u.capacity_bytes).sum();
    text(format!(
        "Used(bytes): {used}\nCapacity(bytes): {capacity}\n"
    ))
}

async fn segment_status(
    State(state): State<AdminState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Some(name) = q.get("segment").filter(|k| !k.is_empty()) else {
        return error_response(ErrorCode::INVALID_PARAMS, Some("missing segment"));
    };
    match state.master.query_segment_status(name) {
        Ok(status) => axum::Json(json!({
            "success": true,
            "segment": name,
            "status": status.as_number(),
            "status_name": format!("{status:?}"),
            "error_code": 0,
            "error_message": "",
        }))
        .into_response(),
        Err(code) => error_response(code, None),
    }
}

async fn remove_all(
    State(state): State<AdminState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let force = match q.get("force").map(String::as_str) {
        None | Some("") | Some("false") | Some("0") => false,
        Some("true") | Some("1") => true,
        Some(_) => {
            return error_response(
                ErrorCode::INVALID_PARAMS,
                Some("force must be true or false"),
            )
        }
    };
    let tenant = q.get("tenant_id").cloned().unwrap_or_default();
    let removed = state.master.remove_all(force, &tenant);
    axum::Json(json!({"success": true, "removed_count": removed})).into_response()
}

/// `POST /api/v1/snapshot`: writes a snapshot now, off the async workers; answers the file, its
/// size, the object count and the duration.
async fn take_snapshot(State(state): State<AdminState>) -> Response {
    let Some(snapshots) = state.snapshots else {
        return error_response(
            ErrorCode::NOT_SUPPORTED,
            Some("no snapshot directory: start the master with --snapshot_dir"),
        );
    };
    let result = tokio::task::spawn_blocking(move || {
        snapshots
            .take("on-demand")
            .map_err(|error| error.to_string())
    })
    .await
    .unwrap_or_else(|_| Err("the snapshot panicked".into()));
    match result {
        Ok(report) => axum::Json(json!({
            "success": true,
            "path": report.path.display().to_string(),
            "bytes": report.bytes,
            "objects": report.objects,
            "duration_ms": report.duration.as_secs_f64() * 1e3,
        }))
        .into_response(),
        Err(message) => error_response(ErrorCode::INTERNAL_ERROR, Some(&message)),
    }
}

fn snapshot_json(s: &mooncake_master::TenantQuotaSnapshot) -> Value {
    json!({
        "tenant_id": s.tenant_id,
        "requested_quota_bytes": s.requested_quota_bytes,
        "effective_quota_bytes": s.effective_quota_bytes,
        "charged_bytes": s.charged_bytes,
        "admission_closed": s.admission_closed,
        "has_explicit_policy": s.has_explicit_policy,
        "over_quota": s.over_quota,
    })
}

async fn tenant_quotas_get(
    State(state): State<AdminState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let tenant = q
        .get("tenant_id")
        .filter(|t| !t.is_empty())
        .map(String::as_str);
    match state.master.list_tenant_quotas(tenant) {
        Ok(list) => {
            let tenants: Vec<Value> = list.iter().map(snapshot_json).collect();
            axum::Json(json!({"success": true, "tenants": tenants})).into_response()
        }
        Err(code) => error_response(code, None),
    }
}

/// `PUT /api/v1/tenant_quotas?tenant_id=T&quota_bytes=N` (sizes like `4GiB` accepted), or a JSON
/// body `{"tenant_id": T, "quota_bytes": N}` (`requested_quota_bytes` is accepted too).
async fn tenant_quotas_put(
    State(state): State<AdminState>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let from_body: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&body) {
            Ok(value) => value,
            Err(_) => return error_response(ErrorCode::INVALID_PARAMS, Some("body is not JSON")),
        }
    };
    let tenant = q.get("tenant_id").cloned().or_else(|| {
        from_body
            .get("tenant_id")
            .and_then(Value::as_str)
            .map(String::from)
    });
    let quota = q
        .get("quota_bytes")
        .or_else(|| q.get("requested_quota_bytes"))
        .and_then(|v| mooncake_common::parse_size(v).ok())
        .or_else(|| {
            ["quota_bytes", "requested_quota_bytes"]
                .iter()
                .find_map(|k| from_body.get(*k).and_then(Value::as_u64))
        });
    let (Some(tenant), Some(quota)) = (tenant, quota) else {
        return error_response(
            ErrorCode::INVALID_PARAMS,
            Some("tenant_id and quota_bytes are required"),
        );
    };
    // Persisting may block on the disk: off the async workers, outside every master lock.
    let AdminState {
        master,
        tenant_policy,
        ..
    } = state;
    let result =
        tokio::task::spawn_blocking(move || tenant_policy.set_quota(&master, &tenant, quota))
            .await
            .unwrap_or(Err(ErrorCode::INTERNAL_ERROR));
    match result {
        Ok(snapshot) => {
            axum::Json(json!({"success": true, "tenant": snapshot_json(&snapshot)})).into_response()
        }
        Err(code) => error_response(code, None),
    }
}

async fn tenant_quotas_delete(
    State(state): State<AdminState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Some(tenant) = q.get("tenant_id").filter(|t| !t.is_empty()).cloned() else {
        return error_response(ErrorCode::INVALID_PARAMS, Some("tenant_id is required"));
    };
    let AdminState {
        master,
        tenant_policy,
        ..
    } = state;
    let result = tokio::task::spawn_blocking(move || tenant_policy.delete_quota(&master, &tenant))
        .await
        .unwrap_or(Err(ErrorCode::INTERNAL_ERROR));
    match result {
        Ok(()) => axum::Json(json!({"success": true})).into_response(),
        Err(code) => error_response(code, None),
    }
}

/// Upstream's HTTP metadata store: an in-memory key → bytes map for tools that expect it.
#[derive(Debug, Clone, Default)]
pub struct MetadataStore {
    entries: Arc<RwLock<HashMap<String, Bytes>>>,
}

/// Largest value the metadata store accepts.
pub const MAX_METADATA_VALUE_BYTES: usize = 1 << 20;
/// Most keys the metadata store holds.
pub const MAX_METADATA_KEYS: usize = 100_000;

/// The metadata router: GET/PUT/DELETE `/metadata?key=` (behind the bearer token when one is
/// configured), GET `/health`.
pub fn metadata_router(store: MetadataStore, auth_token: Option<&AuthToken>) -> Router {
    let metadata = Router::new().route(
        "/metadata",
        get(metadata_get).put(metadata_put).delete(metadata_delete),
    );
    guarded(metadata, auth_token)
        .route("/health", get(|| async { "OK" }))
        .layer(axum::extract::DefaultBodyLimit::max(
            MAX_METADATA_VALUE_BYTES,
        ))
        .with_state(store)
}

fn metadata_key(q: &HashMap<String, String>) -> Result<&String, Box<Response>> {
    q.get("key")
        .filter(|k| !k.is_empty())
        .ok_or_else(|| Box::new((StatusCode::BAD_REQUEST, "missing key").into_response()))
}

async fn metadata_get(
    State(store): State<MetadataStore>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let key = match metadata_key(&q) {
        Ok(key) => key,
        Err(response) => return *response,
    };
    match store.entries.read().get(key) {
        Some(value) => value.clone().into_response(),
        None => (StatusCode::NOT_FOUND, "metadata not found").into_response(),
    }
}

async fn metadata_put(
    State(store): State<MetadataStore>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let key = match metadata_key(&q) {
        Ok(key) => key,
        Err(response) => return *response,
    };
    let mut entries = store.entries.write();
    if entries.len() >= MAX_METADATA_KEYS && !entries.contains_key(key) {
        return (StatusCode::INSUFFICIENT_STORAGE, "metadata store full").into_response();
    }
    entries.insert(key.clone(), body);
    (StatusCode::OK, "metadata updated").into_response()
}

async fn metadata_delete(
    State(store): State<MetadataStore>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let key = match metadata_key(&q) {
        Ok(key) => key,
        Err(response) => return *response,
    };
    match store.entries.write().remove(key) {
        Some(_) => (StatusCode::OK, "metadata deleted").into_response(),
        None => (StatusCode::NOT_FOUND, "metadata not found").into_response(),
    }
}
