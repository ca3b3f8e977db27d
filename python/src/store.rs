//! `MooncakeDistributedStore`: upstream's Python API over [`StoreClient`].
//!
//! Every method that talks to the cluster releases the GIL and blocks on the store's own tokio
//! runtime, so any number of Python threads can share one object. Return conventions are
//! upstream's: 0 or a negative `ErrorCode` for writes, the byte count or a negative code for
//! reads into caller memory, `b""` for a missing key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use mooncake_client::{StoreClient, WriteMode};
use mooncake_common::ErrorCode;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::buffer::{checked_slice_mut, NativeBuffer};
use crate::codes::{code_of, to_i64, unit_code, INVALID, NOT_READY};
use crate::config::{ReplicaDescriptor, ReplicateConfig};
use crate::landing::{gather_ranges, read_into_buffers, read_into_multi_buffers, read_to_bytes};
use crate::setup::{self, log};
use crate::standalone::Dummy;

const HEALTH_TIMEOUT: Duration = Duration::from_secs(3);

/// A set-up store: the client and the runtime its calls block on.
#[derive(Debug)]
pub(crate) struct Connected {
    runtime: tokio::runtime::Runtime,
    pub(crate) client: StoreClient,
    /// Set by `setup_dummy`: the real client this store is attached to.
    pub(crate) dummy: Option<Dummy>,
}

impl Connected {
    pub(crate) fn new(
        runtime: tokio::runtime::Runtime,
        client: StoreClient,
        dummy: Option<Dummy>,
    ) -> Connected {
        Connected {
            runtime,
            client,
            dummy,
        }
    }

    pub(crate) fn block_on<T>(&self, future: impl std::future::Future<Output = T>) -> T {
        self.runtime.block_on(future)
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
    /// The connection, or `None` before setup and after close.
    pub(crate) fn conn(&self) -> Option<Arc<Connected>> {
        match self.conn.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Serialises setup and close.
    pub(crate) fn lock_lifecycle(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lifecycle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn set_conn(&self, value: Option<Arc<Connected>>) -> Option<Arc<Connected>> {
        match self.conn.write() {
            Ok(mut guard) => std::mem::replace(&mut *guard, value),
            Err(poisoned) => std::mem::replace(&mut *poisoned.into_inner(), value),
        }
    }
}

/// Drains this client's segments for at most `within`; (nothing was left, the line to log).
fn drain_line(conn: &Connected, within: Duration) -> (bool, String) {
    match conn.block_on(conn.client.drain_segments(within)) {
        Ok(report) => (
            report.left == 0,
            format!(
                "close: moved {} of {} objects to other segments; dropping {} not moved within \
                 {} s ({} had no room elsewhere)",
                report.moved,
                report.objects,
                report.left,
                within.as_secs(),
                report.unmovable
            ),
        ),
        Err(error) => (
            false,
            format!("close: moving this segment's objects failed ({error}); unmounting now"),
        ),
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
    /// them, as does enable_client_http_server=True. enable_ssd_offload=True with
    /// ssd_offload_path=DIR (or MOONCAKE_OFFLOAD_FILE_STORAGE_PATH) gives this client a disk tier
    /// in its own subdirectory DIR/client-N (docs/disk-tier.md; the master needs
    /// --enable_offload); the MOONCAKE_OFFLOAD_* knobs that apply are read, a bad one fails setup.
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
        let settings = setup::EnvSettings::read(py);
        let outcome = py.allow_threads(|| setup::connect(&params, settings));
        match outcome {
            Ok((runtime, client)) => {
                self.set_conn(Some(Arc::new(Connected::new(runtime, client, None))));
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

    /// Unmounts this client's segment and stops the client. Returns 0 (also when not set up);
    /// setup() may be called again afterwards.
    ///
    /// With grace_period_seconds=0 (upstream's close) objects stored only on this client's
    /// segment are gone at once. With grace_period_seconds=N > 0 the unmount is graceful, as
    /// SIGTERM on `mooncake store`: new puts avoid the segment, its objects are moved to other
    /// segments for at most N seconds (reads go on meanwhile), then it unmounts; objects not
    /// moved in time are dropped with a count in the log.
    #[pyo3(signature = (grace_period_seconds=0))]
    fn close(&self, py: Python<'_>, grace_period_seconds: u64) -> i32 {
        let _lifecycle = self
            .lifecycle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(conn) = self.set_conn(None) else {
            return 0;
        };
        if grace_period_seconds > 0 {
            let within = Duration::from_secs(grace_period_seconds);
            let line = py.allow_threads(|| drain_line(&conn, within));
            log(py, if line.0 { "info" } else { "warning" }, &line.1);
        }
        py.allow_threads(move || {
            let rc = unit_code(&conn.block_on(conn.client.close()));
            drop(conn);
            rc
        })
    }

    /// create_copy_task(key, targets) -> ((first, second), code)
    ///
    /// Queues a copy of `key` to the segments named in `targets` (segment names as get_hostname
    /// answers them); the node holding the source runs it. Answers the task id and 0, or
    /// ((0, 0), negative code): -600 for no target, an unknown target or a target already
    /// holding the key, -704 for a missing key, -1401 when too many tasks are pending.
    fn create_copy_task(
        &self,
        py: Python<'_>,
        key: &str,
        targets: Vec<String>,
    ) -> ((u64, u64), i32) {
        self.create_copy_task_impl(py, key, &targets)
    }

    /// create_move_task(key, source, target) -> ((first, second), code)
    ///
    /// Queues a move of `key` from segment `source` to segment `target`: the target gets a
    /// replica, then the source's is freed. Codes as create_copy_task (-600 also for
    /// source == target or a source holding no replica).
    fn create_move_task(
        &self,
        py: Python<'_>,
        key: &str,
        source: &str,
        target: &str,
    ) -> ((u64, u64), i32) {
        self.create_move_task_impl(py, key, source, target)
    }

    /// query_task(task_id) -> (QueryTaskResponse | None, code)
    ///
    /// The state of the task `task_id` (the tuple a create call answered): (response, 0), or
    /// (None, -1400 TASK_NOT_FOUND) for an id the master does not know (or has pruned).
    fn query_task(
        &self,
        py: Python<'_>,
        task_id: (u64, u64),
    ) -> (Option<crate::tasks::QueryTaskResponse>, i32) {
        self.query_task_impl(py, task_id)
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

    /// This client's segment name ("host:port"), usable as `ReplicateConfig.preferred_segment`;
    /// for a store set up with setup_dummy, the real client's. Without a port in
    /// `local_hostname`, the port is taken from upstream's client range 12300-14300. "" before
    /// setup.
    fn get_hostname(&self) -> String {
        self.conn()
            .map(|c| match &c.dummy {
                Some(dummy) => dummy.segment.clone(),
                None => c.client.segment_name(),
            })
            .unwrap_or_default()
    }

    /// setup_dummy(mem_pool_size, local_buffer_size, server_address) -> int
    ///
    /// Attaches to the real client process (`mooncake_client`) at `server_address`
    /// ("host:port", its `--port`, 50052 by default) on this host and joins its cluster as a
    /// client without memory of its own: one attach round trip gives the master, the tenant
    /// and the real client's segment; later calls go to the master directly and move bytes to
    /// and from the real client's segment over shared memory. `mem_pool_size` caps what
    /// alloc_from_mem_pool hands out; `local_buffer_size` caps objects in unregistered memory,
    /// as in setup(). 0, or a negative code (-900 when nothing answers at the address).
    fn setup_dummy(
        &self,
        py: Python<'_>,
        mem_pool_size: u64,
        local_buffer_size: u64,
        server_address: &str,
    ) -> i32 {
        self.setup_dummy_impl(py, mem_pool_size, local_buffer_size, server_address)
    }

    /// init_all(protocol, device_name, mount_segment_size=16 MiB) -> int
    ///
    /// Upstream's legacy one-call setup: setup("localhost", "P2PHANDSHAKE",
    /// mount_segment_size, 1 GiB, protocol, device_name, "127.0.0.1:50051"). Returns 1 when the
    /// store is already set up (as upstream), else setup()'s result.
    #[pyo3(signature = (protocol, device_name, mount_segment_size=16 << 20))]
    fn init_all(
        &self,
        py: Python<'_>,
        protocol: &str,
        device_name: &str,
        mount_segment_size: u64,
    ) -> PyResult<i32> {
        if self.conn().is_some() {
            return Ok(1);
        }
        let args = PyTuple::new(
            py,
            [
                "localhost".into_pyobject(py)?.into_any(),
                "P2PHANDSHAKE".into_pyobject(py)?.into_any(),
                mount_segment_size.into_pyobject(py)?.into_any(),
                (1u64 << 30).into_pyobject(py)?.into_any(),
                protocol.into_pyobject(py)?.into_any(),
                device_name.into_pyobject(py)?.into_any(),
                "127.0.0.1:50051".into_pyobject(py)?.into_any(),
            ],
        )?;
        self.setup(py, &args, None)
    }

    /// The address of `size` bytes of registered shared memory (zero-copy calls on it need no
    /// per-call registration), from the `mem_pool_size` of setup_dummy; 0 when the pool is
    /// used up, on a store not set up with setup_dummy, or before setup. Freed at close().
    fn alloc_from_mem_pool(&self, py: Python<'_>, size: u64) -> u64 {
        self.alloc_from_mem_pool_impl(py, size)
    }

    // ----- segments ----------------------------------------------------------------------------

    /// mount_segment(path, size, offset=0, protocol="tcp", location="") -> dict
    ///
    /// Maps `size` bytes of the file at `path` (e.g. /dev/shm/NAME) from `offset` (a multiple
    /// of the page size) and contributes them to the cluster as another segment of this
    /// client. Returns {"ret": 0 or a negative code, "segment_ids": [id]}. Peers reach such a
    /// segment over TCP (a file cannot be sealed against shrinking like our memfd segments).
    /// `location` (a NUMA/device hint) is accepted and not used.
    #[pyo3(signature = (path, size, offset=0, protocol="tcp", location=""))]
    fn mount_segment<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        size: u64,
        offset: u64,
        protocol: &str,
        location: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let _ = location;
        self.mount_file_impl(py, path, size, offset, protocol)
    }

    /// allocate_and_mount_segment(size, protocol="tcp", location="") -> dict
    ///
    /// Allocates `size` bytes of shared memory and contributes them as another segment.
    /// Returns {"ret", "segment_ids": [id], "allocated_size"}.
    #[pyo3(signature = (size, protocol="tcp", location=""))]
    fn allocate_and_mount_segment<'py>(
        &self,
        py: Python<'py>,
        size: u64,
        protocol: &str,
        location: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let _ = location;
        self.allocate_and_mount_impl(py, size, protocol)
    }

    /// Unmounts segments of this store by id (from mount_segment or
    /// allocate_and_mount_segment): objects stored only there are gone at once, or after
    /// `grace_period_seconds` during which they stay readable and nothing new is placed
    /// there. 0 or the first negative code (-600 for an id that is not a segment of this
    /// store). The memory is released with the segment.
    #[pyo3(signature = (segment_ids, grace_period_seconds=0))]
    fn unmount_segment(
        &self,
        py: Python<'_>,
        segment_ids: Vec<String>,
        grace_period_seconds: i64,
    ) -> i32 {
        self.unmount_impl(py, segment_ids, grace_period_seconds)
    }

    /// unmount_segment() (the memory is always released with its segment here).
    #[pyo3(signature = (segment_ids, grace_period_seconds=0))]
    fn unmount_and_free_segment(
        &self,
        py: Python<'_>,
        segment_ids: Vec<String>,
        grace_period_seconds: i64,
    ) -> i32 {
        self.unmount_impl(py, segment_ids, grace_period_seconds)
    }

    /// Unmounts this client's local-disk (SSD offload) segment. This client mounts none, so
    /// there is nothing to do: 0 (-1010 before setup).
    #[pyo3(signature = (grace_period_seconds=0))]
    fn unmount_local_disk_segment(&self, grace_period_seconds: i64) -> i32 {
        let _ = grace_period_seconds;
        if self.conn().is_some() {
            0
        } else {
            NOT_READY
        }
    }

    /// Reads of local-disk replicas served through their owner (upstream's offload RPC).
    /// This client reads memory replicas only, so the count stays 0; 0 before setup.
    fn get_offload_rpc_read_count(&self) -> u64 {
        self.conn().map_or(0, |c| {
            c.client
                .stats()
                .offload_rpc_reads
                .load(std::sync::atomic::Ordering::Relaxed)
        })
    }

    /// Diagnostics: peer segments this store maps over shared memory (-1 before setup).
    fn _shm_mapped_segments(&self) -> i64 {
        self.conn()
            .map_or(-1, |c| c.client.shm_mapped_segments() as i64)
    }

    // ----- sessions ----------------------------------------------------------------------------

    /// Starts a get session per key: one master query whose replicas and read lease later
    /// batch_get_into_multi_buffer_ranges calls use without asking the master again. One
    /// result per key: 0 or a negative code (-704 missing).
    fn batch_get_session_start(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        self.get_session_start_impl(py, keys)
    }

    /// Ends the get sessions of `keys` (drops the cached replicas; no master call). 0.
    fn batch_get_session_end(&self, keys: Vec<String>) -> i32 {
        self.get_session_end_impl(keys)
    }

    /// For each key i, reads `all_sizes[i][j]` bytes from object offset
    /// `all_src_offsets[i][j]` into `all_buffer_ptrs[i][j]`, using the replicas of the key's
    /// get session (a key without one is looked up now), all in one transfer batch of ranged
    /// reads. One result per key: the bytes read (the sum of its sizes) or a negative code
    /// (-600 for lists of different lengths or a range past the end of the object, -707 once
    /// the session's lease ran out).
    fn batch_get_into_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        all_src_offsets: Vec<Vec<usize>>,
    ) -> Vec<i64> {
        self.get_ranges_impl(py, keys, all_buffer_ptrs, all_sizes, all_src_offsets)
    }

    /// Starts a put session per key: reserves objects of `sizes[i]` bytes (not readable until
    /// batch_put_session_end). One result per key: 0, -705 when the key exists or is being
    /// written, -600 when a session of the key is open here.
    #[pyo3(signature = (keys, sizes, config=None))]
    fn batch_put_session_start(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        sizes: Vec<u64>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        self.put_session_start_impl(py, keys, sizes, config)
    }

    /// For each key i, writes `all_sizes[i][j]` bytes from `all_buffer_ptrs[i][j]` at object
    /// offset `all_dst_offsets[i][j]` of the key's open put session, to every replica, in one
    /// transfer batch. One result per key: the bytes written or a negative code.
    fn batch_put_from_multi_buffer_ranges(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        all_dst_offsets: Vec<Vec<usize>>,
    ) -> Vec<i64> {
        self.put_ranges_impl(py, keys, all_buffer_ptrs, all_sizes, all_dst_offsets)
    }

    /// Ends the put sessions of `keys`: waits for their running range writes, then makes the
    /// objects readable (recorded without a checksum: no one read them whole). 0 per key or a
    /// negative code; a failed key keeps its session (retry, or revoke it).
    fn batch_put_session_end(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        self.put_session_finish_impl(py, keys, true)
    }

    /// Revokes the put sessions of `keys`: the reserved objects are dropped. 0 per key or a
    /// negative code.
    fn batch_put_session_revoke(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        self.put_session_finish_impl(py, keys, false)
    }

    /// put_from_with_metadata(key, buffer_ptr, metadata_buffer_ptr, size, metadata_size,
    /// config=None) -> int
    ///
    /// Stores the `metadata_size` bytes at `metadata_buffer_ptr` followed by the `size` bytes
    /// at `buffer_ptr` as one object (no concatenation copy). 0 or a negative code; a `size`
    /// of 0 stores nothing and returns 0, as upstream.
    #[pyo3(signature = (key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config=None))]
    #[allow(clippy::too_many_arguments)]
    fn put_from_with_metadata(
        &self,
        py: Python<'_>,
        key: &str,
        buffer_ptr: usize,
        metadata_buffer_ptr: usize,
        size: usize,
        metadata_size: usize,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        self.write_with_metadata(
            py,
            key,
            (metadata_buffer_ptr, metadata_size),
            (buffer_ptr, size),
            config,
        )
    }

    // ----- copying writes ----------------------------------------------------------------------

    /// Stores `value` (any bytes-like object) under `key`. 0 on success, also when the key exists
    /// (the first write stays); negative code otherwise: -703 (REPLICA_IS_NOT_READY) when another
    /// write of the key is still in flight (nothing stored), -200 when the store is full and
    /// eviction cannot make room.
    #[pyo3(signature = (key, value, config=None))]
    fn put(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        self.write_value(py, WriteMode::Put, key, value, config)
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
        self.write_parts(py, WriteMode::Put, key, parts, config)
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
        self.write_batch(py, WriteMode::Put, keys, values, config)
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
    /// until unregister_buffer() or close(). 0, or a negative code: -600 when the range is not
    /// mapped readable and writable in this process (checked once, here), so a bad address is
    /// refused instead of crashing a later call. A range inside an already registered buffer
    /// (e.g. memory from alloc_from_mem_pool) is accepted as is.
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
            unit_code(&unsafe { conn.client.register_buffer(buffer_ptr as *mut u8, size) })
        })
    }

    /// Unregisters a buffer registered at `buffer_ptr` (waits for transfers using it).
    fn unregister_buffer(&self, py: Python<'_>, buffer_ptr: usize) -> i32 {
        let Some(conn) = self.conn() else {
            return NOT_READY;
        };
        py.allow_threads(|| unit_code(&conn.client.unregister_buffer(buffer_ptr as *mut u8)))
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
        self.write_from(py, WriteMode::Put, key, buffer_ptr, size, config)
    }

    /// Reads the object into `[buffer_ptr, buffer_ptr+size)`: returns its length in bytes, or a
    /// negative code (-704 missing, -600 when `size` is smaller than the object).
    fn get_into(&self, py: Python<'_>, key: &str, buffer_ptr: usize, size: usize) -> i64 {
        let Some(conn) = self.conn() else {
            return NOT_READY as i64;
        };
        py.allow_threads(|| {
            // SAFETY: upstream's contract: the caller's range is writable during the call; it is
            // checked to be mapped (or inside a registered buffer) first.
            let buffer = match unsafe { checked_slice_mut(&conn.client, buffer_ptr, size) } {
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
        self.write_batch_from(py, WriteMode::Put, keys, buffer_ptrs, sizes, config)
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
        py.allow_threads(|| read_into_buffers(&conn, &keys, &buffer_ptrs, &sizes))
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
        self.put_multi_buffers(py, keys, all_buffer_ptrs, all_sizes, config)
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
        py.allow_threads(|| read_into_multi_buffers(&conn, &keys, &all_buffer_ptrs, &all_sizes))
    }

    /// Gathers byte ranges of objects into buffers: for buffer i, key `all_keys[i][j]` and range k,
    /// reads `all_sizes[i][j][k]` bytes from object offset `all_src_offsets[i][j][k]` straight
    /// into `buffer_ptrs[i] + all_dst_offsets[i][j][k]` (one master round trip, one transfer
    /// batch of ranged reads). Results have the same shape: bytes read or a negative code. A
    /// key whose three lists differ in length gets -600 in every slot; a range past the end of
    /// its object, a missing key or a bad destination fails only its own slot.
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
            gather_ranges(
                &conn,
                &buffer_ptrs,
                &all_keys,
                &all_dst_offsets,
                &all_src_offsets,
                &all_sizes,
            )
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

    /// 1 if the key is readable (and protects it until this store's next lookup, which loads
    /// it), 0 if missing or still being written, a negative code on error.
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
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                match conn.block_on(conn.client.batch_get_replica_desc(&refs)) {
                    Ok(results) => results
                        .into_iter()
                        .map(|r| {
                            r.map(|replicas| {
                                replicas.into_iter().map(ReplicaDescriptor::from).collect()
                            })
                            .unwrap_or_default()
                        })
                        .collect(),
                    Err(_) => keys.iter().map(|_| Vec::new()).collect(),
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
        py.allow_threads(|| unit_code(&conn.block_on(conn.client.remove(key, force))))
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
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        py.allow_threads(|| {
            conn.block_on(conn.client.batch_replica_clear(&refs, &segment_name))
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
        self.write_value(py, WriteMode::Upsert, key, value, config)
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
        self.write_parts(py, WriteMode::Upsert, key, parts, config)
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
        self.write_batch(py, WriteMode::Upsert, keys, values, config)
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
        self.write_from(py, WriteMode::Upsert, key, buffer_ptr, size, config)
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
        self.write_batch_from(py, WriteMode::Upsert, keys, buffer_ptrs, sizes, config)
    }
}
