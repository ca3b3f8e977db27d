//! Upstream's drain-job endpoints on the admin port: `POST /api/v1/drain_jobs` (JSON body
//! `{"segments": [..], "target_segments": [..], "max_concurrency": 4}`), `GET
//! /api/v1/drain_jobs/query?job_id=` and `POST /api/v1/drain_jobs/cancel?job_id=`, with
//! upstream's response fields; the job itself is `mooncake_master::drain_jobs`. A missing or
//! malformed `job_id` is 400 before anything else, as upstream.

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use mooncake_common::{DrainJobRequest, DrainJobView, ErrorCode, TaskId};
use serde_json::{json, Value};
use std::collections::HashMap;

use crate::http::{error_response, AdminState};

/// Upstream's default `max_concurrency`.
const DEFAULT_MAX_CONCURRENCY: u32 = 4;

/// The three routes (mounted with the other protected admin routes).
pub fn routes() -> Router<AdminState> {
    Router::new()
        .route("/api/v1/drain_jobs", post(create))
        .route("/api/v1/drain_jobs/query", get(query))
        .route("/api/v1/drain_jobs/cancel", post(cancel))
}

/// The body of a create request; absent fields take upstream's defaults.
fn parse_request(body: &[u8]) -> Result<DrainJobRequest, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("Invalid JSON body: {e}"))?;
    let strings = |field: &str| -> Result<Vec<String>, String> {
        match value.get(field) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| format!("{field} must be a list of strings"))
                })
                .collect(),
            Some(_) => Err(format!("{field} must be a list of strings")),
        }
    };
    let max_concurrency = match value.get("max_concurrency") {
        None | Some(Value::Null) => DEFAULT_MAX_CONCURRENCY,
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or("max_concurrency must be a non-negative integer")?,
    };
    Ok(DrainJobRequest {
        segments: strings("segments")?,
        target_segments: strings("target_segments")?,
        max_concurrency,
    })
}

async fn create(State(state): State<AdminState>, body: Bytes) -> Response {
    let request = match parse_request(&body) {
        Ok(request) => request,
        Err(message) => return error_response(ErrorCode::INVALID_PARAMS, Some(&message)),
    };
    match state.master.create_drain_job(&request) {
        Ok(id) => axum::Json(json!({
            "success": true,
            "job_id": id.to_string(),
            "status": "CREATED",
            "error_code": 0,
            "error_message": "",
        }))
        .into_response(),
        Err(code) => error_response(code, None),
    }
}

fn job_id(q: &HashMap<String, String>) -> Result<TaskId, Box<Response>> {
    q.get("job_id")
        .and_then(|text| text.parse::<TaskId>().ok())
        .ok_or_else(|| {
            Box::new(error_response(
                ErrorCode::INVALID_PARAMS,
                Some("Missing or invalid job_id"),
            ))
        })
}

/// A job as upstream's query answers it (plus `total_units` and `total_bytes`).
pub fn view_json(job: &DrainJobView) -> Value {
    json!({
        "success": true,
        "job_id": job.id.to_string(),
        "type": 0,
        "type_name": "DRAIN",
        "status": job.status.as_number(),
        "status_name": job.status.name(),
        "created_at_ms_epoch": job.created_at_ms,
        "last_updated_at_ms_epoch": job.last_updated_at_ms,
        "segments": job.segments,
        "succeeded_units": job.succeeded_units,
        "failed_units": job.failed_units,
        "blocked_units": job.blocked_units,
        "active_units": job.active_units,
        "migrated_bytes": job.migrated_bytes,
        "total_units": job.total_units,
        "total_bytes": job.total_bytes,
        "message": job.message,
        "error_code": 0,
        "error_message": "",
    })
}

async fn query(
    State(state): State<AdminState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let id = match job_id(&q) {
        Ok(id) => id,
        Err(response) => return *response,
    };
    match state.master.query_drain_job(id) {
        Ok(job) => axum::Json(view_json(&job)).into_response(),
        Err(code) => error_response(code, None),
    }
}

async fn cancel(
    State(state): State<AdminState>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let id = match job_id(&q) {
        Ok(id) => id,
        Err(response) => return *response,
    };
    match state.master.cancel_drain_job(id) {
        Ok(()) => axum::Json(json!({
            "success": true,
            "job_id": id.to_string(),
            "status": "CANCELED",
            "error_code": 0,
            "error_message": "",
        }))
        .into_response(),
        Err(code) => error_response(code, None),
    }
}
