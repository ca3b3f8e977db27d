//! `setup(...)`: parsing its arguments (upstream's positional/keyword form and its dict form),
//! the `MC_RS_*` environment settings, and connecting the store client they describe.

use std::time::Duration;

use mooncake_client::BackendKind;
use mooncake_client::{DiskConfig, StoreClient, StoreConfig, TransportMode};
use mooncake_common::{parse_size, ErrorCode};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString, PyTuple};

use crate::codes::code_of;

/// Upstream's parameter names, in positional order.
pub const PARAMS: [&str; 13] = [
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "rdma_devices",
    "master_server_addr",
    "engine",
    "enable_ssd_offload",
    "ssd_offload_path",
    "tenant_id",
    "enable_client_http_server",
    "client_http_port",
];

/// Keys the dict form reads (upstream's list); others are ignored, as upstream does.
const DICT_KEYS: [&str; 13] = [
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "rdma_devices",
    "master_server_addr",
    "ipc_socket_path",
    "enable_ssd_offload",
    "ssd_offload_path",
    "tenant_id",
    "enable_client_http_server",
    "client_http_port",
];

/// Validated settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupParams {
    pub local_hostname: String,
    pub metadata_server: String,
    pub global_segment_size: u64,
    pub local_buffer_size: u64,
    pub protocol: String,
    pub master_server_addr: String,
    pub tenant_id: String,
    /// `enable_ssd_offload=True`: the disk directory (`ssd_offload_path`, else
    /// `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH`), shared by the processes given it: each takes its
    /// own `client-N` subdirectory.
    pub ssd_offload_path: Option<String>,
}

/// A refusal that `setup` reports as a negative code (INVALID_PARAMS) with this message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

fn size_value(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Result<u64, Invalid>> {
    if value.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "setup(): {name} must be an int or a size string"
        )));
    }
    if value.is_instance_of::<PyInt>() {
        return Ok(value
            .extract::<u64>()
            .map_err(|_| Invalid(format!("{name} must be between 0 and 2**64-1"))));
    }
    if let Ok(text) = value.downcast::<PyString>() {
        let text = text.to_cow()?;
        let text: &str = &text;
        return Ok(parse_size(text).map_err(|e| Invalid(format!("{name}: {e}"))));
    }
    Err(PyTypeError::new_err(format!(
        "setup(): {name} must be an int or a size string such as \"16MB\""
    )))
}

fn str_value(name: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    value
        .downcast::<PyString>()
        .map_err(|_| PyTypeError::new_err(format!("setup(): {name} must be a str")))?
        .to_cow()
        .map(|c| c.into_owned())
}

/// A Python bool, or the strings upstream's dict form produces ("True", "False", "1", "0", …).
fn bool_value(name: &str, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    if let Ok(b) = value.downcast::<PyBool>() {
        return Ok(b.is_true());
    }
    if value.is_instance_of::<PyInt>() {
        return Ok(value.extract::<i64>()? != 0);
    }
    if let Ok(text) = value.downcast::<PyString>() {
        match text.to_cow()?.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => return Ok(true),
            "false" | "0" | "no" | "off" | "" => return Ok(false),
            _ => {}
        }
    }
    Err(PyTypeError::new_err(format!(
        "setup(): {name} must be a bool (or \"True\"/\"False\")"
    )))
}

/// Collects `setup`'s arguments into a name → value map, with Python's own TypeErrors for
/// unknown or repeated names. Returns the map and whether the dict form was used.
pub fn collect<'py>(
    py: Python<'py>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<(Bound<'py, PyDict>, bool)> {
    let out = PyDict::new(py);
    // Dict form: setup({...}) or setup(config={...}).
    let dict_arg = if args.len() == 1 && kwargs.map_or(true, |k| k.is_empty()) {
        args.get_item(0)?.downcast::<PyDict>().ok().cloned()
    } else if args.is_empty() && kwargs.is_some_and(|k| k.len() == 1) {
        kwargs
            .and_then(|k| k.get_item("config").ok().flatten())
            .and_then(|v| v.downcast::<PyDict>().ok().cloned())
    } else {
        None
    };
    if let Some(config) = dict_arg {
        for (key, value) in config.iter() {
            let key: String = key
                .extract()
                .map_err(|_| PyTypeError::new_err("setup(config): keys must be str"))?;
            if DICT_KEYS.contains(&key.as_str()) {
                // Upstream stringifies every value before parsing.
                out.set_item(key, value.str()?)?;
            }
        }
        return Ok((out, true));
    }
    if args.len() > PARAMS.len() {
        return Err(PyTypeError::new_err(format!(
            "setup() takes at most {} positional arguments ({} given)",
            PARAMS.len(),
            args.len()
        )));
    }
    for (i, value) in args.iter().enumerate() {
        out.set_item(PARAMS[i], value)?;
    }
    if let Some(kwargs) = kwargs {
        for (key, value) in kwargs.iter() {
            let key: String = key.extract()?;
            if !PARAMS.contains(&key.as_str()) {
                return Err(PyTypeError::new_err(format!(
                    "setup() got an unexpected keyword argument '{key}'"
                )));
            }
            if out.contains(&key)? {
                return Err(PyTypeError::new_err(format!(
                    "setup() got multiple values for argument '{key}'"
                )));
            }
            out.set_item(key, value)?;
        }
    }
    Ok((out, false))
}

/// Validates the collected arguments. `Err` = TypeError (Python-level misuse, naming the
/// argument); `Ok(Err)` = a value upstream would refuse with a negative code.
pub fn parse(values: &Bound<'_, PyDict>) -> PyResult<Result<SetupParams, Invalid>> {
    let get = |name: &str| values.get_item(name).ok().flatten();
    let Some(local_hostname) = get("local_hostname") else {
        return Err(PyTypeError::new_err(
            "setup() missing required argument 'local_hostname'",
        ));
    };
    let Some(metadata_server) = get("metadata_server") else {
        return Err(PyTypeError::new_err(
            "setup() missing required argument 'metadata_server'",
        ));
    };
    let local_hostname = str_value("local_hostname", &local_hostname)?;
    let metadata_server = str_value("metadata_server", &metadata_server)?;
    let mut sizes = [16u64 << 20, 16u64 << 20];
    for (slot, name) in ["global_segment_size", "local_buffer_size"]
        .iter()
        .enumerate()
    {
        if let Some(v) = get(name) {
            match size_value(name, &v)? {
                Ok(n) => sizes[slot] = n,
                Err(invalid) => return Ok(Err(invalid)),
            }
        }
    }
    let protocol = match get("protocol") {
        Some(v) => str_value("protocol", &v)?,
        None => "tcp".to_string(),
    };
    if let Some(v) = get("rdma_devices") {
        str_value("rdma_devices", &v)?;
    }
    let master_server_addr = match get("master_server_addr") {
        Some(v) => str_value("master_server_addr", &v)?,
        None => "127.0.0.1:50051".to_string(),
    };
    // `engine`: upstream reuses a TransferEngine object; we always run our own engine, so any
    // value is accepted and not used.
    let offload = match get("enable_ssd_offload") {
        Some(v) => bool_value("enable_ssd_offload", &v)?,
        None => false,
    };
    let mut ssd_offload_path = match get("ssd_offload_path") {
        Some(v) => str_value("ssd_offload_path", &v)?,
        None => String::new(),
    };
    if offload && ssd_offload_path.trim().is_empty() {
        ssd_offload_path = std::env::var(OFFLOAD_PATH_ENV).unwrap_or_default();
        if ssd_offload_path.trim().is_empty() {
            return Ok(Err(Invalid(format!(
                "enable_ssd_offload=True needs ssd_offload_path (or {OFFLOAD_PATH_ENV})"
            ))));
        }
    }
    let ssd_offload_path = offload.then_some(ssd_offload_path);
    let tenant_id = match get("tenant_id") {
        Some(v) => str_value("tenant_id", &v)?,
        None => "default".to_string(),
    };
    if let Some(v) = get("enable_client_http_server") {
        if bool_value("enable_client_http_server", &v)? {
            return Err(PyTypeError::new_err(
                "setup(): enable_client_http_server=True is not supported by mooncake_rs; drop \
                 the argument",
            ));
        }
    }
    if let Some(v) = get("client_http_port") {
        if !(v.is_instance_of::<PyInt>() || v.is_instance_of::<PyString>()) {
            return Err(PyTypeError::new_err(
                "setup(): client_http_port must be an int",
            ));
        }
    }
    if metadata_server.trim().is_empty() {
        return Ok(Err(Invalid(
            "metadata_server is empty (use \"P2PHANDSHAKE\" or an http:// URL)".into(),
        )));
    }
    let protocol = match protocol.trim().to_ascii_lowercase().as_str() {
        "tcp" | "rdma" => protocol.trim().to_ascii_lowercase(),
        other => {
            return Ok(Err(Invalid(format!(
                "protocol {other:?} is not supported (tcp; rdma falls back to tcp)"
            ))))
        }
    };
    Ok(Ok(SetupParams {
        local_hostname,
        metadata_server,
        global_segment_size: sizes[0],
        local_buffer_size: sizes[1],
        protocol,
        master_server_addr,
        tenant_id,
        ssd_offload_path,
    }))
}

/// Upstream's environment variable of the disk directory.
const OFFLOAD_PATH_ENV: &str = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH";

/// `MOONCAKE_OFFLOAD_<name>` parsed as `T`: `None` when unset or empty, an error naming the
/// variable when it does not parse.
fn offload_env<T: std::str::FromStr>(name: &str) -> Result<Option<T>, String> {
    let var = format!("MOONCAKE_OFFLOAD_{name}");
    match std::env::var(&var) {
        Ok(raw) if !raw.trim().is_empty() => raw
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{var}={raw:?} is not a valid value")),
        _ => Ok(None),
    }
}

/// The disk tier of `setup(enable_ssd_offload=True, ssd_offload_path=DIR)` with upstream's
/// `MOONCAKE_OFFLOAD_*` knobs that apply (docs/python.md): the backend
/// (`STORAGE_BACKEND_DESCRIPTOR`: bucket by default, as upstream), its capacity
/// (`TOTAL_SIZE_LIMIT_BYTES`, 2 TiB), the staging memory (`LOCAL_BUFFER_SIZE_BYTES`, 1280 MiB),
/// the read lease (`CLIENT_BUFFER_GC_TTL_MS`, 5000), the offload period
/// (`HEARTBEAT_INTERVAL_SECONDS`) and disk eviction (`ENABLE_DISK_WATERMARK_EVICTION`,
/// `DISK_EVICTION_HIGH_WATERMARK_RATIO` / `LOW` 0.90 / 0.80). A bad value is an error.
pub fn offload_config(path: &str) -> Result<DiskConfig, String> {
    let backend = match offload_env::<String>("STORAGE_BACKEND_DESCRIPTOR")?.as_deref() {
        None | Some("bucket_storage_backend") => BackendKind::Bucket,
        Some("file_per_key_storage_backend") => BackendKind::File,
        Some("offset_allocator_storage_backend") => BackendKind::Log,
        Some(other) => {
            return Err(format!(
                "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR={other:?} is not supported \
                 (bucket_storage_backend, file_per_key_storage_backend, \
                 offset_allocator_storage_backend)"
            ))
        }
    };
    let capacity = offload_env::<u64>("TOTAL_SIZE_LIMIT_BYTES")?.unwrap_or(2 << 40);
    let mut config = DiskConfig::new(path, capacity);
    config.backend = backend;
    config.shared = true;
    config.staging_bytes = offload_env::<u64>("LOCAL_BUFFER_SIZE_BYTES")?.unwrap_or(1280 << 20);
    if let Some(ms) = offload_env::<u64>("CLIENT_BUFFER_GC_TTL_MS")? {
        config.lease = Duration::from_millis(ms.max(1));
    }
    if let Some(s) = offload_env::<u64>("HEARTBEAT_INTERVAL_SECONDS")? {
        config.offload_interval = Duration::from_secs(s.max(1));
    }
    if let Some(on) = offload_env::<bool>("ENABLE_DISK_WATERMARK_EVICTION")? {
        config.eviction.enabled = on;
    }
    config.eviction.high_watermark_ratio =
        offload_env::<f64>("DISK_EVICTION_HIGH_WATERMARK_RATIO")?.unwrap_or(0.90);
    config.eviction.low_watermark_ratio =
        offload_env::<f64>("DISK_EVICTION_LOW_WATERMARK_RATIO")?.unwrap_or(0.80);
    let (low, high) = (
        config.eviction.low_watermark_ratio,
        config.eviction.high_watermark_ratio,
    );
    if !(low > 0.0 && low < high && high <= 1.0) {
        return Err(format!(
            "MOONCAKE_OFFLOAD_DISK_EVICTION watermarks need 0 < low ({low}) < high ({high}) <= 1"
        ));
    }
    Ok(config)
}

/// Upper bound of `setup` (connect + mount), whatever the master does.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The `MC_RS_*` environment settings of `setup` (read with the GIL held: a bad value is logged).
#[derive(Debug, Clone, Copy)]
pub struct EnvSettings {
    /// `MC_RS_IO_THREADS`: workers of the store's runtime (default 2).
    io_threads: usize,
    /// `MC_RS_TRANSPORT`: auto, tcp or shm.
    transport: TransportMode,
    /// `MC_RS_VERIFY_CHECKSUMS`: off with 0/false/off/no.
    verify_checksums: bool,
    /// `MC_RS_BUSY_POLL_US`: the master RPC's busy-poll window on every call (0 = off; unset =
    /// the adaptive default).
    busy_poll_us: Option<u64>,
}

impl EnvSettings {
    pub fn read(py: Python<'_>) -> EnvSettings {
        EnvSettings {
            io_threads: env_setting::<usize>(py, "MC_RS_IO_THREADS", "a thread count")
                .filter(|&n| n > 0)
                .unwrap_or(2),
            transport: env_setting(py, "MC_RS_TRANSPORT", "auto, tcp or shm").unwrap_or_default(),
            verify_checksums: std::env::var("MC_RS_VERIFY_CHECKSUMS")
                .map(|v| !matches!(v.trim(), "0" | "false" | "off" | "no"))
                .unwrap_or(true),
            busy_poll_us: env_setting::<u64>(py, "MC_RS_BUSY_POLL_US", "microseconds"),
        }
    }
}

/// Starts the store's runtime and connects its client (GIL released): the runtime and client,
/// or upstream's code and a message for the log.
pub fn connect(
    params: &SetupParams,
    settings: EnvSettings,
) -> Result<(tokio::runtime::Runtime, StoreClient), (i32, String)> {
    let tenant = if params.tenant_id.is_empty() {
        "default".to_string()
    } else {
        params.tenant_id.clone()
    };
    let disk = match &params.ssd_offload_path {
        Some(path) => {
            Some(offload_config(path).map_err(|e| (ErrorCode::INVALID_PARAMS.as_i32(), e))?)
        }
        None => None,
    };
    let mut config = StoreConfig {
        disk,
        master_addr: params.master_server_addr.clone(),
        local_hostname: params.local_hostname.clone(),
        global_segment_size: params.global_segment_size,
        local_buffer_size: params.local_buffer_size,
        protocol: "tcp".to_string(),
        tenant,
        transport: settings.transport,
        verify_checksums: settings.verify_checksums,
        ..StoreConfig::default()
    };
    if let Some(us) = settings.busy_poll_us {
        config.rpc.set_busy_poll_us(us);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.io_threads)
        .thread_name("mooncake-rs-io")
        .enable_all()
        .build()
        .map_err(|e| (ErrorCode::INTERNAL_ERROR.as_i32(), e.to_string()))?;
    let connected = runtime.block_on(async {
        match tokio::time::timeout(SETUP_TIMEOUT, StoreClient::connect(config)).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(error)) => Err((code_of(&error), error.to_string())),
            Err(_) => Err((
                ErrorCode::RPC_TIMEOUT.as_i32(),
                format!("no answer within {} s", SETUP_TIMEOUT.as_secs()),
            )),
        }
    })?;
    Ok((runtime, connected))
}

/// Logs `message` at `level` on the `mooncake_rs` logger.
pub(crate) fn log(py: Python<'_>, level: &str, message: &str) {
    let _ = py
        .import("logging")
        .and_then(|l| l.call_method1("getLogger", ("mooncake_rs",)))
        .and_then(|logger| logger.call_method1(level, (message,)));
}

/// The environment variable `name` parsed as `T`; `None` when unset or empty. A value that does
/// not parse is logged as a warning (naming the variable and what it expects) and ignored, so the
/// default applies.
fn env_setting<T: std::str::FromStr>(py: Python<'_>, name: &str, expected: &str) -> Option<T> {
    let raw = std::env::var(name).ok()?;
    let value = raw.trim();
    if value.is_empty() {
        return None;
    }
    match value.parse() {
        Ok(parsed) => Some(parsed),
        Err(_) => {
            log(
                py,
                "warning",
                &format!("{name}={raw:?} is not {expected}: ignored, the default applies"),
            );
            None
        }
    }
}
