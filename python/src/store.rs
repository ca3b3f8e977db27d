//! `MooncakeDistributedStore`: upstream's Python API over [`StoreClient`].
//!
//! Every method that talks to the cluster releases the GIL and blocks on the store's own tokio
//! runtime, so any number of Python threads can share one object. Return conventions are
//! upstream's: 0 or a negative `ErrorCode` for writes, the byte count or a negative code for
//! reads into caller memory, `b""` for a missing key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::future::{join, join_all};
use mooncake_client::{PutOutcome, StoreClient, StoreConfig, StoreError};
use mooncake_common::{ErrorCode, ReplicateConfig as RsReplicateConfig};
use mooncake_proto::methods as m;
use mooncake_transfer::Endpoint;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::buffer::{ByteView, NativeBuffer};
use crate::config::{ReplicaDescriptor, ReplicateConfig};
use crate::setup;

/// Code returned by every call made before `setup` succeeded or after `close`.
const NOT_READY: i32 = ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS as i32;
const INVALID: i32 = ErrorCode::INVALID_PARAMS as i32;

/// Upper bound of `setup` (connect + mount), whatever the master does.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
const HEALTH_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug)]
struct Connected {
    runtime: tokio::runtime::Runtime,
    client: StoreClient,
    tenant: String,
    hostname: String,
}

impl Connected {
    fn block_on<T>(&self, future: impl std::future::Future<Output = T>) -> T {
        self.runtime.block_on(future)
    }
}

/// Upstream's code for a store error. A caller buffer too small for the object is INVALID_PARAMS
/// (-600), as upstream answers it.
fn code_of(error: &StoreError) -> i32 {
    match error {
        StoreError::BufferTooSmall { .. } => INVALID,
        other => other.code().as_i32(),
    }
}

fn put_code(result: &Result<PutOutcome, StoreError>) -> i32 {
    match result {
        Ok(PutOutcome::Stored) | Ok(PutOutcome::AlreadyPresent) => 0,
        Err(error) => code_of(error),
    }
}

fn unit_code(result: &Result<(), StoreError>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(error) => code_of(error),
    }
}

fn to_i64(result: Result<u64, StoreError>) -> i64 {
    match result {
        Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
        Err(error) => code_of(&error) as i64,
    }
}

/// Caller memory `[ptr, ptr+size)` as a slice, or INVALID_PARAMS for a null pointer / bad size.
///
/// # Safety
/// The caller (Python code) promises the range is readable for the duration of the call, as
/// upstream's zero-copy API requires.
unsafe fn raw_slice<'a>(ptr: usize, size: usize) -> Result<&'a [u8], i32> {
    if size == 0 {
        return Ok(&[]);
    }
    if ptr == 0 || size > isize::MAX as usize || ptr.checked_add(size).is_none() {
        return Err(INVALID);
    }
    // SAFETY: forwarded to the caller's contract; non-null and in range checked above.
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const u8, size) })
}

/// # Safety
/// As [`raw_slice`], and writable.
unsafe fn raw_slice_mut<'a>(ptr: usize, size: usize) -> Result<&'a mut [u8], i32> {
    if size == 0 {
        return Ok(&mut []);
    }
    if ptr == 0 || size > isize::MAX as usize || ptr.checked_add(size).is_none() {
        return Err(INVALID);
    }
    // SAFETY: forwarded to the caller's contract; non-null and in range checked above.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, size) })
}

fn config_of(config: Option<PyRef<'_, ReplicateConfig>>) -> RsReplicateConfig {
    config.map(|c| c.inner.clone()).unwrap_or_default()
}

fn log(py: Python<'_>, level: &str, message: &str) {
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

/// The segment name peers and `ReplicateConfig.preferred_segment` use for this client.
fn hostname_of(client: &StoreClient) -> String {
    if let Some(segment) = client.segments().first() {
        return segment.name.clone();
    }
    match Endpoint::parse(&client.endpoint()) {
        Ok(endpoint) => endpoint.tcp_authority(),
        Err(_) => client.endpoint(),
    }
}

/// Upstream's `MooncakeDistributedStore` on the mooncake-rs client. See docs/python.md.
#[pyclass(
    subclass,
    module = "mooncake_rs.store",
    name = "MooncakeDistributedStore"
)]
#[derive(Debug, Default)]
pub struct Store {
    conn: RwLock<Option<Arc<Connected>>>,
    /// Serialises setup and close.
    lifecycle: Mutex<()>,
}

impl Store {
    fn conn(&self) -> Option<Arc<Connected>> {
        match self.conn.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_conn(&self, value: Option<Arc<Connected>>) -> Option<Arc<Connected>> {
        match self.conn.write() {
            Ok(mut guard) => std::mem::replace(&mut *guard, value),
            Err(poisoned) => std::mem::replace(&mut *poisoned.into_inner(), value),
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Best effort: unmount this client's segment now rather than when its TTL runs out.
        if let Some(conn) = self.set_conn(None) {
            let _ = conn.block_on(async {
                tokio::time::timeout(Duration::from_secs(2), conn.client.close()).await
            });
        }
    }
}

/// Put (write-once: an existing key is success) or upsert (replace): the only difference between
/// the two families of methods below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    Put,
    Upsert,
}

impl Write {
    /// One object from `parts`; 0 or a negative code.
    fn one(self, conn: &Connected, key: &str, parts: &[&[u8]], config: &RsReplicateConfig) -> i32 {
        match self {
            Write::Put => put_code(&conn.block_on(conn.client.put_parts(key, parts, config))),
            Write::Upsert => {
                unit_code(&conn.block_on(conn.client.upsert_parts(key, parts, config)))
            }
        }
    }

    /// Many objects; one code per item, in order.
    fn many(
        self,
        conn: &Connected,
        items: &[(&str, &[u8])],
        config: &RsReplicateConfig,
    ) -> Vec<i32> {
        match self {
            Write::Put => conn
                .block_on(conn.client.put_batch(items, config))
                .iter()
                .map(put_code)
                .collect(),
            Write::Upsert => conn
                .block_on(conn.client.upsert_batch(items, config))
                .iter()
                .map(unit_code)
                .collect(),
        }
    }
}

/// The bodies shared by the put and upsert families.
impl Store {
    fn write_value(
        &self,
        py: Python<'_>,
        mode: Write,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let view = ByteView::new(value)?;
        let Some(conn) = self.conn() else {
            return Ok(NOT_READY);
        };
        let config = config_of(config);
        let bytes = view.as_slice();
        Ok(py.allow_threads(|| mode.one(&conn, key, &[bytes], &config)))
    }

    fn write_parts(
        &self,
        py: Python<'_>,
        mode: Write,
        key: &str,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let views = parts
            .iter()
            .map(|p| ByteView::new(&p))
            .collect::<PyResult<Vec<_>>>()?;
        let Some(conn) = self.conn() else {
            return Ok(NOT_READY);
        };
        let config = config_of(config);
        let slices: Vec<&[u8]> = views.iter().map(|v| v.as_slice()).collect();
        Ok(py.allow_threads(|| mode.one(&conn, key, &slices, &config)))
    }

    /// 0 when every key succeeded (for put: or already existed), else the first negative code.
    fn write_batch(
        &self,
        py: Python<'_>,
        mode: Write,
        keys: Vec<String>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let views = values
            .try_iter()?
            .map(|v| ByteView::new(&v?))
            .collect::<PyResult<Vec<_>>>()?;
        if views.len() != keys.len() {
            return Ok(INVALID);
        }
        let Some(conn) = self.conn() else {
            return Ok(NOT_READY);
        };
        if keys.is_empty() {
            return Ok(0);
        }
        let config = config_of(config);
        let items: Vec<(&str, &[u8])> = keys
            .iter()
            .zip(&views)
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        Ok(py.allow_threads(|| {
            mode.many(&conn, &items, &config)
                .into_iter()
                .find(|&c| c != 0)
                .unwrap_or(0)
        }))
    }

    fn write_from(
        &self,
        py: Python<'_>,
        mode: Write,
        key: &str,
        buffer_ptr: usize,
        size: usize,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        let Some(conn) = self.conn() else {
            return NOT_READY;
        };
        let config = config_of(config);
        py.allow_threads(|| {
            // SAFETY: upstream's contract: the caller's range is readable during the call.
            let bytes = match unsafe { raw_slice(buffer_ptr, size) } {
                Ok(b) => b,
                Err(code) => return code,
            };
            mode.one(&conn, key, &[bytes], &config)
        })
    }

    fn write_batch_from(
        &self,
        py: Python<'_>,
        mode: Write,
        keys: Vec<String>,
        buffer_ptrs: Vec<usize>,
        sizes: Vec<usize>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        if keys.len() != buffer_ptrs.len() || keys.len() != sizes.len() {
            return vec![INVALID; keys.len()];
        }
        let Some(conn) = self.conn() else {
            return vec![NOT_READY; keys.len()];
        };
        let config = config_of(config);
        py.allow_threads(|| {
            let mut out = vec![0i32; keys.len()];
            let mut items = Vec::with_capacity(keys.len());
            let mut slots = Vec::with_capacity(keys.len());
            for (i, key) in keys.iter().enumerate() {
                // SAFETY: upstream's contract: the caller's ranges are readable during the call.
                match unsafe { raw_slice(buffer_ptrs[i], sizes[i]) } {
                    Ok(bytes) => {
                        items.push((key.as_str(), bytes));
                        slots.push(i);
                    }
                    Err(code) => out[i] = code,
                }
            }
            if !items.is_empty() {
                for (slot, code) in slots.into_iter().zip(mode.many(&conn, &items, &config)) {
                    out[slot] = code;
                }
            }
            out
        })
    }
}

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        Store::default()
    }

    /// setup(local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol,
    ///       rdma_devices, master_server_addr, engine=None, enable_ssd_offload=False,
    ///       ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
    ///       client_http_port=9300) -> int
    /// setup(config: dict) -> int
    ///
    /// Connects to the master, starts the transfer engine and mounts `global_segment_size` bytes
    /// (0 = contribute nothing). Sizes may be ints or strings such as "16MB" / "16 MB";
    /// percentages are refused. Returns 0, or a negative code (bad value: -600, master
    /// unreachable: -900/-901) within seconds. Unknown keyword arguments raise TypeError naming
    /// them, as do the options we do not support when set (enable_ssd_offload=True,
    /// enable_client_http_server=True).
    ///
    /// Differences from upstream: `metadata_server` (P2PHANDSHAKE or a URL) is accepted and not
    /// contacted (segment endpoints travel in replica descriptors); `engine` is ignored (we always
    /// run our own engine); protocol "rdma" falls back to TCP with a warning; `local_buffer_size`
    /// caps nothing (puts and gets use caller memory in place). Calling setup on a store that is
    /// already set up returns -1010 (UNAVAILABLE_IN_CURRENT_STATUS); close() first.
    #[pyo3(signature = (*args, **kwargs))]
    fn setup(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<i32> {
        let (values, _dict_form) = setup::collect(py, args, kwargs)?;
        let params = match setup::parse(&values)? {
            Ok(params) => params,
            Err(setup::Invalid(message)) => {
                log(py, "error", &format!("setup refused: {message}"));
                return Ok(INVALID);
            }
        };
        if params.protocol == "rdma" {
            log(
                py,
                "warning",
                "protocol 'rdma' is not available in mooncake_rs: using tcp (same-host peers \
                 use shared memory)",
            );
        }
        let _lifecycle = self
            .lifecycle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.conn().is_some() {
            log(
                py,
                "error",
                "setup: this store is already set up; close() it first",
            );
            return Ok(NOT_READY);
        }
        let io_threads = env_setting::<usize>(py, "MC_RS_IO_THREADS", "a thread count")
            .filter(|&n| n > 0)
            .unwrap_or(2);
        let tenant = if params.tenant_id.is_empty() {
            "default".to_string()
        } else {
            params.tenant_id.clone()
        };
        let config = StoreConfig {
            master_addr: params.master_server_addr.clone(),
            local_hostname: params.local_hostname.clone(),
            global_segment_size: params.global_segment_size,
            local_buffer_size: params.local_buffer_size,
            protocol: "tcp".to_string(),
            tenant: tenant.clone(),
            transport: env_setting(py, "MC_RS_TRANSPORT", "auto, tcp or shm").unwrap_or_default(),
            verify_checksums: std::env::var("MC_RS_VERIFY_CHECKSUMS")
                .map(|v| !matches!(v.trim(), "0" | "false" | "off" | "no"))
                .unwrap_or(true),
            ..StoreConfig::default()
        };
        let mut config = config;
        if let Some(us) = env_setting::<u64>(py, "MC_RS_BUSY_POLL_US", "microseconds") {
            config.rpc.set_busy_poll_us(us);
        }
        let outcome = py.allow_threads(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(io_threads)
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
            });
            match connected {
                Ok(client) => {
                    let hostname = hostname_of(&client);
                    Ok(Connected {
                        runtime,
                        client,
                        tenant,
                        hostname,
                    })
                }
                Err(e) => Err(e),
            }
        });
        match outcome {
            Ok(connected) => {
                self.set_conn(Some(Arc::new(connected)));
                Ok(0)
            }
            Err((code, message)) => {
                log(
                    py,
                    "error",
                    &format!(
                        "setup failed ({code}): {message} [master_server_addr={}]",
                        params.master_server_addr
                    ),
                );
                Ok(code)
            }
        }
    }

    /// Unmounts this client's segment (objects stored only there are gone) and stops the client.
    /// Returns 0 (also when not set up); setup() may be called again afterwards.
    fn close(&self, py: Python<'_>) -> i32 {
        let _lifecycle = self
            .lifecycle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(conn) = self.set_conn(None) else {
            return 0;
        };
        py.allow_threads(move || {
            let rc = match conn.block_on(conn.client.close()) {
                Ok(()) => 0,
                Err(error) => code_of(&error),
            };
            drop(conn);
            rc
        })
    }

    /// 0 healthy, 1 not set up or closed, 2 master unreachable.
    fn health_check(&self, py: Python<'_>) -> i32 {
        let Some(conn) = self.conn() else { return 1 };
        py.allow_threads(|| {
            let ok = conn.block_on(async {
                matches!(
                    tokio::time::timeout(HEALTH_TIMEOUT, conn.client.master().service_ready())
                        .await,
                    Ok(Ok(_))
                )
            });
            if ok {
                0
            } else {
                2
            }
        })
    }

    /// This client's segment name ("host:port"), usable as `ReplicateConfig.preferred_segment`.
    /// "" before setup.
    fn get_hostname(&self) -> String {
        self.conn().map(|c| c.hostname.clone()).unwrap_or_default()
    }

    // ----- copying writes ----------------------------------------------------------------------

    /// Stores `value` (any bytes-like object) under `key`. 0 on success, also when the key exists
    /// or is being written by another client (the first write stays); negative code otherwise
    /// (-200 when the store is full and eviction cannot make room).
    #[pyo3(signature = (key, value, config=None))]
    fn put(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_value(py, Write::Put, key, value, config)
    }

    /// Stores the concatenation of `parts` (bytes-like) under `key`, without concatenating them
    /// first. Same results as put().
    #[pyo3(signature = (key, *parts, config=None))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_parts(py, Write::Put, key, parts, config)
    }

    /// Stores every `values[i]` under `keys[i]` (one master round trip per phase). Returns 0 when
    /// every key succeeded (or already existed), else the first negative code.
    #[pyo3(signature = (keys, values, config=None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_batch(py, Write::Put, keys, values, config)
    }

    // ----- copying reads -----------------------------------------------------------------------

    /// The value stored under `key`, or b"" when it is missing (or on any error). A value of
    /// 64 KiB or more is read straight into the returned `bytes` (no intermediate copy).
    fn get<'py>(&self, py: Python<'py>, key: &str) -> Bound<'py, PyBytes> {
        let Some(conn) = self.conn() else {
            return PyBytes::new(py, b"");
        };
        read_to_bytes(py, &conn, &[key])
            .pop()
            .flatten()
            .unwrap_or_else(|| PyBytes::new(py, b""))
    }

    /// One bytes object per key, in order; b"" for a missing key. One master round trip and one
    /// transfer batch (values of 64 KiB or more straight into the returned objects).
    fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<String>) -> Vec<Bound<'py, PyBytes>> {
        let Some(conn) = self.conn() else {
            return keys.iter().map(|_| PyBytes::new(py, b"")).collect();
        };
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut objects = read_to_bytes(py, &conn, &refs);
        objects.resize_with(refs.len(), || None);
        objects
            .into_iter()
            .map(|object| object.unwrap_or_else(|| PyBytes::new(py, b"")))
            .collect()
    }

    /// The object's bytes held by a `_NativeBuffer` (wrapped as BufferHandle by
    /// `mooncake_rs.store`), or None when missing.
    fn _get_buffer_native(&self, py: Python<'_>, key: &str) -> Option<NativeBuffer> {
        let conn = self.conn()?;
        let value = py.allow_threads(|| conn.block_on(conn.client.get(key)));
        value.ok().map(NativeBuffer::from_vec)
    }

    fn _batch_get_buffer_native(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
    ) -> Vec<Option<NativeBuffer>> {
        let Some(conn) = self.conn() else {
            return keys.iter().map(|_| None).collect();
        };
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = py.allow_threads(|| {
            if refs.is_empty() {
                return Vec::new();
            }
            conn.block_on(conn.client.get_batch(&refs))
        });
        values
            .into_iter()
            .map(|v| v.ok().map(NativeBuffer::from_vec))
            .collect()
    }

    // ----- registered memory and zero-copy calls -----------------------------------------------

    /// Registers `[buffer_ptr, buffer_ptr+size)` for zero-copy calls. The memory must stay valid
    /// until unregister_buffer() or close(). 0 or a negative code.
    fn register_buffer(&self, py: Python<'_>, buffer_ptr: usize, size: usize) -> i32 {
        let Some(conn) = self.conn() else {
            return NOT_READY;
        };
        if buffer_ptr == 0 || size == 0 || size > isize::MAX as usize {
            return INVALID;
        }
        py.allow_threads(|| {
            // SAFETY: the caller promises the range stays valid until unregister/close, which is
            // the contract of upstream's register_buffer.
            match unsafe { conn.client.register_buffer(buffer_ptr as *mut u8, size) } {
                Ok(()) => 0,
                Err(error) => code_of(&error),
            }
        })
    }

    /// Unregisters a buffer registered at `buffer_ptr` (waits for transfers using it).
    fn unregister_buffer(&self, py: Python<'_>, buffer_ptr: usize) -> i32 {
        let Some(conn) = self.conn() else {
            return NOT_READY;
        };
        py.allow_threads(
            || match conn.client.unregister_buffer(buffer_ptr as *mut u8) {
                Ok(()) => 0,
                Err(error) => code_of(&error),
            },
        )
    }

    /// Stores `size` bytes at `buffer_ptr` under `key`. Same results as put(). Unlike upstream,
    /// the memory need not be registered (unregistered memory is registered for the call).
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: &str,
        buffer_ptr: usize,
        size: usize,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        self.write_from(py, Write::Put, key, buffer_ptr, size, config)
    }

    /// Reads the object into `[buffer_ptr, buffer_ptr+size)`: returns its length in bytes, or a
    /// negative code (-704 missing, -600 when `size` is smaller than the object).
    fn get_into(&self, py: Python<'_>, key: &str, buffer_ptr: usize, size: usize) -> i64 {
        let Some(conn) = self.conn() else {
            return NOT_READY as i64;
        };
        py.allow_threads(|| {
            // SAFETY: upstream's contract: the caller's range is writable during the call.
            let buffer = match unsafe { raw_slice_mut(buffer_ptr, size) } {
                Ok(b) => b,
                Err(code) => return code as i64,
            };
            to_i64(conn.block_on(conn.client.get_into(key, buffer)))
        })
    }

    /// put_from for many keys: one result per key, in order (0 or a negative code).
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<usize>,
        sizes: Vec<usize>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        self.write_batch_from(py, Write::Put, keys, buffer_ptrs, sizes, config)
    }

    /// get_into for many keys: one result per key, in order (bytes read or a negative code).
    /// One master round trip and one transfer batch for the whole batch.
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<usize>,
        sizes: Vec<usize>,
    ) -> Vec<i64> {
        if keys.len() != buffer_ptrs.len() || keys.len() != sizes.len() {
            return vec![INVALID as i64; keys.len()];
        }
        let Some(conn) = self.conn() else {
            return vec![NOT_READY as i64; keys.len()];
        };
        py.allow_threads(|| {
            let mut out = vec![0i64; keys.len()];
            let mut refs = Vec::with_capacity(keys.len());
            let mut buffers = Vec::with_capacity(keys.len());
            let mut slots = Vec::with_capacity(keys.len());
            for (i, key) in keys.iter().enumerate() {
                // SAFETY: upstream's contract: the caller's ranges are writable during the call.
                match unsafe { raw_slice_mut(buffer_ptrs[i], sizes[i]) } {
                    Ok(buffer) => {
                        refs.push(key.as_str());
                        buffers.push(buffer);
                        slots.push(i);
                    }
                    Err(code) => out[i] = code as i64,
                }
            }
            if !refs.is_empty() {
                let results = conn.block_on(conn.client.get_batch_into(&refs, &mut buffers));
                for (slot, result) in slots.into_iter().zip(results) {
                    out[slot] = to_i64(result);
                }
            }
            out
        })
    }

    /// Stores, for each key, the concatenation of the buffers `all_buffer_ptrs[i][j]` of sizes
    /// `all_sizes[i][j]` (layer-wise KV layouts). One result per key: 0 or a negative code.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config=None))]
    fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        if keys.len() != all_buffer_ptrs.len() || keys.len() != all_sizes.len() {
            return vec![INVALID; keys.len()];
        }
        let Some(conn) = self.conn() else {
            return vec![NOT_READY; keys.len()];
        };
        let config = config_of(config);
        py.allow_threads(|| {
            let mut out = vec![0i32; keys.len()];
            // Keys whose buffers are adjacent are one slice each and go in one put_batch; the
            // others (scattered buffers) are put one by one, concurrently with the batch.
            let mut whole: Vec<(&str, &[u8])> = Vec::new();
            let mut whole_slots = Vec::new();
            let mut scattered: Vec<(&str, Vec<&[u8]>)> = Vec::new();
            let mut scattered_slots = Vec::new();
            for (i, (ptrs, sizes)) in all_buffer_ptrs.iter().zip(&all_sizes).enumerate() {
                if ptrs.len() != sizes.len() {
                    out[i] = INVALID;
                    continue;
                }
                let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
                let adjacent = !ptrs.is_empty()
                    && ptrs
                        .windows(2)
                        .zip(sizes)
                        .all(|(w, &s)| w[0].checked_add(s) == Some(w[1]));
                let checked = match total {
                    None => Err(INVALID),
                    // SAFETY: upstream's contract: the caller's ranges are readable during the
                    // call; adjacent ones together form one readable range.
                    Some(total) if adjacent => unsafe { raw_slice(ptrs[0], total) }.map(|b| {
                        whole.push((keys[i].as_str(), b));
                        whole_slots.push(i);
                    }),
                    Some(_) => ptrs
                        .iter()
                        .zip(sizes)
                        // SAFETY: as above.
                        .map(|(&p, &s)| unsafe { raw_slice(p, s) })
                        .collect::<Result<Vec<_>, i32>>()
                        .map(|parts| {
                            scattered.push((keys[i].as_str(), parts));
                            scattered_slots.push(i);
                        }),
                };
                if let Err(code) = checked {
                    out[i] = code;
                }
            }
            let client = &conn.client;
            let config = &config;
            let (batched, one_by_one) = conn.block_on(join(
                async {
                    if whole.is_empty() {
                        Vec::new()
                    } else {
                        client.put_batch(&whole, config).await
                    }
                },
                join_all(
                    scattered
                        .iter()
                        .map(|(key, parts)| client.put_parts(key, parts, config)),
                ),
            ));
            for (slot, result) in whole_slots.into_iter().zip(&batched) {
                out[slot] = put_code(result);
            }
            for (slot, result) in scattered_slots.into_iter().zip(&one_by_one) {
                out[slot] = put_code(result);
            }
            out
        })
    }

    /// Reads each object into its buffers `all_buffer_ptrs[i][j]` in order (the object is the
    /// concatenation of the buffers). One result per key: the object's length, or a negative
    /// code (-600 when the buffers cannot hold it). `prefer_alloc_in_same_node` is accepted and
    /// not used (replica choice already prefers this process, then this host).
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node=false))]
    fn batch_get_into_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        prefer_alloc_in_same_node: bool,
    ) -> Vec<i64> {
        let _ = prefer_alloc_in_same_node;
        if keys.len() != all_buffer_ptrs.len() || keys.len() != all_sizes.len() {
            return vec![INVALID as i64; keys.len()];
        }
        let Some(conn) = self.conn() else {
            return vec![NOT_READY as i64; keys.len()];
        };
        py.allow_threads(|| {
            let mut out = vec![0i64; keys.len()];
            let mut refs = Vec::with_capacity(keys.len());
            let mut destinations = Vec::with_capacity(keys.len());
            let mut slots = Vec::with_capacity(keys.len());
            for (i, key) in keys.iter().enumerate() {
                // SAFETY: upstream's contract: every buffer is writable during the call.
                match unsafe { multi_destination(&all_buffer_ptrs[i], &all_sizes[i]) } {
                    Ok(destination) => {
                        refs.push(key.as_str());
                        destinations.push(destination);
                        slots.push(i);
                    }
                    Err(code) => out[i] = code as i64,
                }
            }
            if refs.is_empty() {
                return out;
            }
            // Private buffers of the scattered keys, sized once the objects' sizes are known.
            let mut scratch: Vec<Vec<u8>> = Vec::new();
            let results = {
                let scratch = &mut scratch;
                let destinations = &mut destinations;
                conn.block_on(conn.client.get_batch_with(&refs, move |object_sizes| {
                    *scratch = destinations
                        .iter()
                        .zip(object_sizes)
                        .map(|(destination, size)| match (destination, size) {
                            (MultiDestination::Scatter { capacity, .. }, Some(size))
                                if *size <= *capacity as u64 =>
                            {
                                vec![0u8; *size as usize]
                            }
                            _ => Vec::new(),
                        })
                        .collect();
                    destinations
                        .iter_mut()
                        .zip(scratch.iter_mut())
                        .zip(object_sizes)
                        .map(|((destination, private), size)| match destination {
                            MultiDestination::Direct(buffer) => Some(&mut **buffer),
                            // An object larger than the buffers gets none: BufferTooSmall.
                            MultiDestination::Scatter { .. } => size
                                .filter(|&s| s as usize == private.len())
                                .map(|_| private.as_mut_slice()),
                        })
                        .collect()
                }))
            };
            for (j, (slot, result)) in slots.into_iter().zip(results).enumerate() {
                out[slot] = match (result, &mut destinations[j]) {
                    (Ok(n), MultiDestination::Scatter { buffers, .. }) => {
                        let read = usize::try_from(n)
                            .ok()
                            .and_then(|n| scratch.get(j).and_then(|p| p.get(..n)));
                        let Some(mut rest) = read else {
                            out[slot] = ErrorCode::INTERNAL_ERROR.as_i32() as i64;
                            continue;
                        };
                        for buffer in buffers.iter_mut() {
                            let take = buffer.len().min(rest.len());
                            buffer[..take].copy_from_slice(&rest[..take]);
                            rest = &rest[take..];
                        }
                        to_i64(Ok(n))
                    }
                    (result, _) => to_i64(result),
                }
            }
            out
        })
    }

    /// Gathers byte ranges of objects into buffers: for buffer i, key `all_keys[i][j]` and range k,
    /// copies `all_sizes[i][j][k]` bytes from object offset `all_src_offsets[i][j][k]` to
    /// `buffer_ptrs[i] + all_dst_offsets[i][j][k]`. Results have the same shape: bytes copied or a
    /// negative code. Unlike upstream, each object is read whole once and the ranges are copied
    /// out of it (no ranged transfer in our client yet).
    fn get_into_ranges(
        &self,
        py: Python<'_>,
        buffer_ptrs: Vec<usize>,
        all_keys: Vec<Vec<String>>,
        all_dst_offsets: Vec<Vec<Vec<usize>>>,
        all_src_offsets: Vec<Vec<Vec<usize>>>,
        all_sizes: Vec<Vec<Vec<usize>>>,
    ) -> Vec<Vec<Vec<i64>>> {
        let shape_error = |code: i32| -> Vec<Vec<Vec<i64>>> {
            all_sizes
                .iter()
                .map(|per_key| per_key.iter().map(|r| vec![code as i64; r.len()]).collect())
                .collect()
        };
        let n = buffer_ptrs.len();
        if all_keys.len() != n
            || all_dst_offsets.len() != n
            || all_src_offsets.len() != n
            || all_sizes.len() != n
        {
            return shape_error(INVALID);
        }
        let Some(conn) = self.conn() else {
            return shape_error(NOT_READY);
        };
        py.allow_threads(|| {
            let mut distinct: Vec<&str> = all_keys.iter().flatten().map(String::as_str).collect();
            distinct.sort_unstable();
            distinct.dedup();
            let values: HashMap<&str, Result<Vec<u8>, StoreError>> = if distinct.is_empty() {
                HashMap::new()
            } else {
                let got = conn.block_on(conn.client.get_batch(&distinct));
                distinct.iter().copied().zip(got).collect()
            };
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                let keys = &all_keys[i];
                let mut per_buffer = Vec::with_capacity(keys.len());
                for (j, key) in keys.iter().enumerate() {
                    let (Some(dsts), Some(srcs), Some(sizes)) = (
                        all_dst_offsets[i].get(j),
                        all_src_offsets[i].get(j),
                        all_sizes[i].get(j),
                    ) else {
                        per_buffer.push(Vec::new());
                        continue;
                    };
                    let mut per_key = Vec::with_capacity(sizes.len());
                    for (k, &size) in sizes.iter().enumerate() {
                        let (Some(&dst), Some(&src)) = (dsts.get(k), srcs.get(k)) else {
                            per_key.push(INVALID as i64);
                            continue;
                        };
                        let value = match values.get(key.as_str()) {
                            Some(Ok(v)) => v,
                            Some(Err(error)) => {
                                per_key.push(code_of(error) as i64);
                                continue;
                            }
                            None => {
                                per_key.push(INVALID as i64);
                                continue;
                            }
                        };
                        let Some(source) =
                            src.checked_add(size).and_then(|end| value.get(src..end))
                        else {
                            per_key.push(INVALID as i64);
                            continue;
                        };
                        let Some(target) = buffer_ptrs[i].checked_add(dst) else {
                            per_key.push(INVALID as i64);
                            continue;
                        };
                        // SAFETY: upstream's contract: each destination range lies in caller
                        // memory that is writable during the call.
                        match unsafe { raw_slice_mut(target, size) } {
                            Ok(dest) => {
                                dest.copy_from_slice(source);
                                per_key.push(size as i64);
                            }
                            Err(code) => per_key.push(code as i64),
                        }
                    }
                    per_buffer.push(per_key);
                }
                out.push(per_buffer);
            }
            out
        })
    }

    /// Diagnostics: how often a call to the master read its answer on the calling thread (the
    /// busy-poll mode of `MC_RS_BUSY_POLL_US`); -1 before setup.
    fn _master_caller_reads(&self) -> i64 {
        self.conn()
            .map_or(-1, |conn| conn.client.master_caller_reads() as i64)
    }

    /// Diagnostics: how the calling threads' calls to the master waited, as a dict of
    /// `caller_reads`, `spins` (calls that spun for their answer), `skipped_host_busy` and
    /// `skipped_backing_off` (calls that did not: the host had no core to spare, or spinning
    /// had just gone badly on the thread); None before setup.
    fn _master_poll_stats(&self) -> Option<HashMap<&'static str, u64>> {
        self.conn().map(|conn| {
            let s = conn.client.master_poll_stats();
            HashMap::from([
                ("caller_reads", s.caller_reads),
                ("spins", s.spins),
                ("skipped_host_busy", s.skipped_host_busy),
                ("skipped_backing_off", s.skipped_backing_off),
            ])
        })
    }

    // ----- metadata ----------------------------------------------------------------------------

    /// 1 if the key is readable (and grants the read lease that protects it until it is read),
    /// 0 if missing or still being written, a negative code on error.
    fn is_exist(&self, py: Python<'_>, key: &str) -> i32 {
        let Some(conn) = self.conn() else {
            return NOT_READY;
        };
        py.allow_threads(|| match conn.block_on(conn.client.is_exist(key)) {
            Ok(true) => 1,
            Ok(false) => 0,
            Err(error) => code_of(&error),
        })
    }

    /// is_exist for many keys: one result per key, in order (1, 0 or a negative code).
    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        let Some(conn) = self.conn() else {
            return vec![NOT_READY; keys.len()];
        };
        if keys.is_empty() {
            return Vec::new();
        }
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        py.allow_threads(|| match conn.block_on(conn.client.batch_is_exist(&refs)) {
            Ok(results) if results.len() == refs.len() => results
                .into_iter()
                .map(|r| match r {
                    Ok(true) => 1,
                    Ok(false) => 0,
                    Err(code) => code.as_i32(),
                })
                .collect(),
            Ok(_) => vec![ErrorCode::INTERNAL_ERROR.as_i32(); refs.len()],
            Err(error) => vec![code_of(&error); refs.len()],
        })
    }

    /// The object's size in bytes, or a negative code (-704 when missing).
    fn get_size(&self, py: Python<'_>, key: &str) -> i64 {
        let Some(conn) = self.conn() else {
            return NOT_READY as i64;
        };
        py.allow_threads(|| to_i64(conn.block_on(conn.client.get_size(key))))
    }

    /// The readable replicas of `key` ([] when missing or on error).
    fn get_replica_desc(&self, py: Python<'_>, key: &str) -> Vec<ReplicaDescriptor> {
        let Some(conn) = self.conn() else {
            return Vec::new();
        };
        py.allow_threads(|| conn.block_on(conn.client.get_replica_desc(key)))
            .map(|r| r.into_iter().map(ReplicaDescriptor::from).collect())
            .unwrap_or_default()
    }

    /// {key: [ReplicaDescriptor, ...]} for every key ([] for a missing key).
    fn batch_get_replica_desc<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let conn = self.conn();
        let results: Vec<Vec<ReplicaDescriptor>> = match &conn {
            None => keys.iter().map(|_| Vec::new()).collect(),
            // One BatchGetReplicaList for all keys.
            Some(_) if keys.is_empty() => Vec::new(),
            Some(conn) => py.allow_threads(|| {
                let answer = conn.block_on(
                    conn.client
                        .master()
                        .batch_get_replica_list(keys.clone(), &conn.tenant),
                );
                match answer {
                    Ok(results) if results.len() == keys.len() => results
                        .into_iter()
                        .map(|r| {
                            r.map(|response| {
                                response
                                    .replicas
                                    .into_iter()
                                    .map(ReplicaDescriptor::from)
                                    .collect()
                            })
                            .unwrap_or_default()
                        })
                        .collect(),
                    _ => keys.iter().map(|_| Vec::new()).collect(),
                }
            }),
        };
        for (key, descs) in keys.iter().zip(results) {
            out.set_item(key, PyList::new(py, descs)?)?;
        }
        Ok(out)
    }

    /// Removes `key`: 0 or a negative code (-704 missing, -706 while a read lease is held unless
    /// force=True).
    #[pyo3(signature = (key, force=false))]
    fn remove(&self, py: Python<'_>, key: &str, force: bool) -> i32 {
        let Some(conn) = self.conn() else {
            return NOT_READY;
        };
        py.allow_threads(|| match conn.block_on(conn.client.remove(key, force)) {
            Ok(()) => 0,
            Err(error) => code_of(&error),
        })
    }

    /// remove for many keys: one result per key, in order.
    #[pyo3(signature = (keys, force=false))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> Vec<i32> {
        let Some(conn) = self.conn() else {
            return vec![NOT_READY; keys.len()];
        };
        if keys.is_empty() {
            return Vec::new();
        }
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        py.allow_threads(
            || match conn.block_on(conn.client.batch_remove(&refs, force)) {
                Ok(results) if results.len() == refs.len() => results
                    .into_iter()
                    .map(|r| match r {
                        Ok(()) => 0,
                        Err(code) => code.as_i32(),
                    })
                    .collect(),
                Ok(_) => vec![ErrorCode::INTERNAL_ERROR.as_i32(); refs.len()],
                Err(error) => vec![code_of(&error); refs.len()],
            },
        )
    }

    /// Removes every key matching `regex_pattern`; returns how many, or a negative code.
    #[pyo3(signature = (regex_pattern, force=false))]
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: &str, force: bool) -> i64 {
        let Some(conn) = self.conn() else {
            return NOT_READY as i64;
        };
        py.allow_threads(|| {
            match conn.block_on(conn.client.remove_by_regex(regex_pattern, force)) {
                Ok(n) => n,
                Err(error) => code_of(&error) as i64,
            }
        })
    }

    /// Removes every object of this client's tenant; returns how many, or a negative code.
    #[pyo3(signature = (force=false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> i64 {
        let Some(conn) = self.conn() else {
            return NOT_READY as i64;
        };
        py.allow_threads(|| match conn.block_on(conn.client.remove_all(force)) {
            Ok(n) => n,
            Err(error) => code_of(&error) as i64,
        })
    }

    /// Drops this client's replicas of `keys` on `segment_name` ("" = every segment) whose read
    /// lease has expired; returns the keys cleared ([] on error).
    #[pyo3(signature = (keys, segment_name=String::new()))]
    fn batch_replica_clear(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        segment_name: String,
    ) -> Vec<String> {
        let Some(conn) = self.conn() else {
            return Vec::new();
        };
        py.allow_threads(|| {
            let request = m::BatchReplicaClear {
                keys,
                client: conn.client.client_id(),
                segment_name,
                tenant: conn.tenant.clone(),
            };
            conn.block_on(conn.client.master().call(&request))
                .unwrap_or_default()
        })
    }

    // ----- upsert ------------------------------------------------------------------------------

    /// Insert-or-update: stores `value` under `key`, replacing an existing object (a same-size
    /// value is rewritten in place; the key is unreadable until the write ends). 0 or a
    /// negative code (-714 OBJECT_REPLICA_BUSY while another write of the key is in flight).
    #[pyo3(signature = (key, value, config=None))]
    fn upsert(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_value(py, Write::Upsert, key, value, config)
    }

    /// upsert() of the concatenation of `parts`, without concatenating them first.
    #[pyo3(signature = (key, *parts, config=None))]
    fn upsert_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_parts(py, Write::Upsert, key, parts, config)
    }

    /// upsert() of every `values[i]` under `keys[i]`. 0 when every key succeeded, else the first
    /// negative code.
    #[pyo3(signature = (keys, values, config=None))]
    fn upsert_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_batch(py, Write::Upsert, keys, values, config)
    }

    /// upsert() from caller memory `[buffer_ptr, buffer_ptr+size)`.
    #[pyo3(signature = (key, buffer_ptr, size, config=None))]
    fn upsert_from(
        &self,
        py: Python<'_>,
        key: &str,
        buffer_ptr: usize,
        size: usize,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        self.write_from(py, Write::Upsert, key, buffer_ptr, size, config)
    }

    /// upsert_from() for many keys: one code per key, in order.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, config=None))]
    fn batch_upsert_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<usize>,
        sizes: Vec<usize>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        self.write_batch_from(py, Write::Upsert, keys, buffer_ptrs, sizes, config)
    }
}

/// A new, uninitialized Python `bytes` object of `len` bytes and its contents, or `None` when
/// CPython cannot allocate it (the MemoryError is cleared: the key just fails).
///
/// # Safety
/// The slice aliases the object's storage: it must not be used once the object is dropped or
/// after the object is handed to any other Python code (then bytes are immutable).
unsafe fn new_bytes<'a>(py: Python<'_>, len: u64) -> Option<(Py<PyBytes>, &'a mut [u8])> {
    let size = isize::try_from(len).ok()?;
    // SAFETY: the GIL is held (`py`); a null source asks CPython for uninitialized contents.
    let raw = unsafe { ffi::PyBytes_FromStringAndSize(std::ptr::null(), size) };
    if raw.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    // SAFETY: `raw` is a new (owned) reference to a bytes object.
    let object: Py<PyBytes> = unsafe { Py::from_owned_ptr(py, raw) };
    if size == 0 {
        // CPython may answer with its shared empty singleton: hand out no memory at all.
        return Some((object, &mut []));
    }
    // SAFETY: `raw` is a bytes object, so this returns its `size`-byte storage (never null).
    let data = unsafe { ffi::PyBytes_AsString(raw) } as *mut u8;
    if data.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    // SAFETY: the object was created just above with refcount 1 and is visible to no other
    // Python code until our caller returns it, so writing its `size` bytes is exclusive; the
    // caller keeps `object` alive for as long as the slice is used (function contract).
    Some((object, unsafe {
        std::slice::from_raw_parts_mut(data, size as usize)
    }))
}

/// Values at least this large are read straight into their `bytes` object (the GIL is taken
/// once, mid-call, to create them). Smaller ones land in one scratch buffer and are copied into
/// `bytes` at the end: for them the copy costs less than retaking the GIL, which can also wait
/// up to the interpreter's switch interval when other threads are busy.
const DIRECT_BYTES_MIN: u64 = 64 << 10;

/// Where one key of [`read_to_bytes`] lands.
enum Landing {
    Failed,
    /// Read straight into this new object of this many bytes.
    Direct(Py<PyBytes>, u64),
    /// Read into `scratch[range]`.
    Scratch(std::ops::Range<usize>),
}

/// Hands out one destination per key: scratch space for small values, new `bytes` objects for
/// large ones when `py` is given (the GIL is held), nothing for failed lookups.
fn land<'b>(
    sizes: &[Option<u64>],
    py: Option<Python<'_>>,
    scratch: &'b mut [u8],
    landings: &mut Vec<Landing>,
) -> Vec<Option<&'b mut [u8]>> {
    let mut rest = scratch;
    let mut offset = 0usize;
    let mut destinations = Vec::with_capacity(sizes.len());
    for size in sizes {
        let (landing, destination) = match *size {
            Some(len) if len < DIRECT_BYTES_MIN => {
                let len = len as usize;
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
                rest = tail;
                offset += len;
                (Landing::Scratch(offset - len..offset), Some(head))
            }
            // SAFETY: the object stays in `landings` until the read is over and is handed to
            // Python only after that (`read_to_bytes`).
            Some(len) => match py.and_then(|py| unsafe { new_bytes(py, len) }) {
                Some((object, memory)) => (Landing::Direct(object, len), Some(memory)),
                None => (Landing::Failed, None),
            },
            None => (Landing::Failed, None),
        };
        landings.push(landing);
        destinations.push(destination);
    }
    destinations
}

/// Reads `keys` into new Python `bytes` objects: one master round trip, then one transfer batch.
/// Values of [`DIRECT_BYTES_MIN`] or more are written straight into their `bytes` object (no
/// intermediate buffer, no copy; the GIL is taken once for the whole batch to create them);
/// smaller ones go through one scratch buffer. The GIL is released for the round trip and the
/// transfer. `None` for a key that failed (missing, or any error).
fn read_to_bytes<'py>(
    py: Python<'py>,
    conn: &Connected,
    keys: &[&str],
) -> Vec<Option<Bound<'py, PyBytes>>> {
    if keys.is_empty() {
        return Vec::new();
    }
    let mut landings: Vec<Landing> = Vec::with_capacity(keys.len());
    let mut scratch: Vec<u8> = Vec::new();
    let results = {
        let landings = &mut landings;
        let scratch = &mut scratch;
        py.allow_threads(|| {
            conn.block_on(conn.client.get_batch_with(keys, move |sizes| {
                let small_bytes: u64 = sizes
                    .iter()
                    .flatten()
                    .filter(|&&len| len < DIRECT_BYTES_MIN)
                    .sum();
                *scratch = vec![0u8; small_bytes as usize];
                if sizes.iter().flatten().any(|&len| len >= DIRECT_BYTES_MIN) {
                    Python::with_gil(move |py| land(sizes, Some(py), scratch, landings))
                } else {
                    land(sizes, None, scratch, landings)
                }
            }))
        })
    };
    // The GIL is held again: failed keys' objects are released right here.
    let mut landings = landings.into_iter();
    results
        .into_iter()
        .map(|result| match (result, landings.next()?) {
            // Every byte of the object was written.
            (Ok(n), Landing::Direct(object, len)) if n == len => Some(object.into_bound(py)),
            (Ok(n), Landing::Scratch(range)) if n == range.len() as u64 => {
                Some(PyBytes::new(py, scratch.get(range)?))
            }
            _ => None,
        })
        .collect()
}

/// Where `batch_get_into_multi_buffers` puts one key's object.
enum MultiDestination<'a> {
    /// The buffers are adjacent: the transfer writes into them directly.
    Direct(&'a mut [u8]),
    /// Scattered buffers (in order) of `capacity` bytes in all: read privately, then copied.
    Scatter {
        buffers: Vec<&'a mut [u8]>,
        capacity: usize,
    },
}

/// Checks one key's buffers of `batch_get_into_multi_buffers`.
///
/// # Safety
/// Upstream's contract: each `(ptrs[j], sizes[j])` is writable caller memory during the call.
unsafe fn multi_destination<'a>(
    ptrs: &[usize],
    sizes: &[usize],
) -> Result<MultiDestination<'a>, i32> {
    if ptrs.len() != sizes.len() || ptrs.is_empty() {
        return Err(INVALID);
    }
    let capacity = sizes
        .iter()
        .try_fold(0usize, |a, &s| a.checked_add(s))
        .ok_or(INVALID)?;
    let contiguous = ptrs
        .windows(2)
        .zip(sizes)
        .all(|(w, &s)| w[0].checked_add(s) == Some(w[1]));
    if contiguous {
        // SAFETY: forwarded contract; adjacent buffers together form one writable range.
        return Ok(MultiDestination::Direct(unsafe {
            raw_slice_mut(ptrs[0], capacity)
        }?));
    }
    let buffers = ptrs
        .iter()
        .zip(sizes)
        // SAFETY: forwarded contract.
        .map(|(&p, &s)| unsafe { raw_slice_mut(p, s) })
        .collect::<Result<Vec<_>, i32>>()?;
    Ok(MultiDestination::Scatter { buffers, capacity })
}
