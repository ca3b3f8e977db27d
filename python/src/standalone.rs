//! Standalone mode (SGLang's `standalone_storage`): `setup_dummy` attaches this store to a
//! real client process (`mooncake_client`) on the same host, `alloc_from_mem_pool` hands out
//! registered shared memory, `MooncakeHostMemAllocator` allocates host memory for KV pools, and
//! `run_real_client` runs the real client itself (the `mooncake_client` console script).
//!
//! A dummy here is a full store client without a segment: it learns the master, the tenant
//! and the real client's segment from one attach round trip
//! (`mooncake_client::standalone::attach`), then calls the master directly and moves bytes to
//! and from the real client's segment over shared memory. See docs/python.md.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use mooncake_client::standalone::{self, ArgsError, RealClientArgs};
use mooncake_client::HostMemory;
use mooncake_common::ErrorCode;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::codes::{code_of, INVALID, NOT_READY};
use crate::setup::{self, log, SetupParams};
use crate::store::{Connected, Store};

/// What a store set up with `setup_dummy` remembers.
#[derive(Debug)]
pub(crate) struct Dummy {
    /// The real client's segment name (this store's `get_hostname`).
    pub segment: String,
    /// `mem_pool_size`: the most `alloc_from_mem_pool` hands out.
    pub pool_budget: u64,
    pub pool_used: Mutex<u64>,
}

/// Alignment of `alloc_from_mem_pool` blocks (whole pages: they come from their own mapping).
const POOL_ALIGN: u64 = 4096;

/// The host part of `host:port` (brackets of an IPv6 literal removed); an unspecified address
/// becomes loopback (a dummy only connects out).
fn host_of(server_address: &str) -> String {
    let host = match server_address.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => server_address,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host {
        "" | "0.0.0.0" | "::" => "127.0.0.1".to_string(),
        other => other.to_string(),
    }
}

impl Store {
    /// `setup_dummy`: attach to the real client at `server_address`, then join its cluster as a
    /// client without a segment. 0 or a negative code.
    pub(crate) fn setup_dummy_impl(
        &self,
        py: Python<'_>,
        mem_pool_size: u64,
        local_buffer_size: u64,
        server_address: &str,
    ) -> i32 {
        let _lifecycle = self.lock_lifecycle();
        if self.conn().is_some() {
            log(
                py,
                "error",
                "setup_dummy: this store is already set up; close() it first",
            );
            return NOT_READY;
        }
        let settings = setup::EnvSettings::read(py);
        let address = server_address.to_string();
        let outcome = py.allow_threads(move || {
            let attach_runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| (ErrorCode::INTERNAL_ERROR.as_i32(), e.to_string()))?;
            let info = attach_runtime
                .block_on(standalone::attach(&address))
                .map_err(|e| (code_of(&e), e.to_string()))?;
            let params = SetupParams {
                local_hostname: host_of(&address),
                metadata_server: "P2PHANDSHAKE".into(),
                global_segment_size: 0,
                local_buffer_size,
                protocol: "tcp".into(),
                master_server_addr: info.master.clone(),
                tenant_id: info.tenant.clone(),
                ssd_offload_path: None,
            };
            let (runtime, client) = setup::connect(&params, settings)?;
            Ok::<_, (i32, String)>((runtime, client, info))
        });
        match outcome {
            Ok((runtime, client, info)) => {
                let here = mooncake_client::store::local_host_id();
                if !info.host_id.is_empty() && info.host_id != here {
                    log(
                        py,
                        "warning",
                        &format!(
                            "setup_dummy: the real client at {server_address} runs on another \
                             host ({}); its memory is reached over TCP, not shared",
                            info.host_id
                        ),
                    );
                }
                let dummy = Dummy {
                    segment: info.segment,
                    pool_budget: mem_pool_size,
                    pool_used: Mutex::new(0),
                };
                self.set_conn(Some(Arc::new(Connected::new(runtime, client, Some(dummy)))));
                0
            }
            Err((code, message)) => {
                log(
                    py,
                    "error",
                    &format!(
                        "setup_dummy failed ({code}): {message} [server_address={server_address}]"
                    ),
                );
                code
            }
        }
    }

    /// `alloc_from_mem_pool`: `size` bytes of registered shared memory from the
    /// `mem_pool_size` budget of a dummy store; 0 when it does not fit, before setup_dummy, or
    /// on a store set up with setup().
    pub(crate) fn alloc_from_mem_pool_impl(&self, py: Python<'_>, size: u64) -> u64 {
        let Some(conn) = self.conn() else { return 0 };
        let Some(dummy) = conn.dummy.as_ref() else {
            log(
                py,
                "error",
                "alloc_from_mem_pool needs a store set up with setup_dummy()",
            );
            return 0;
        };
        let Ok(len) = usize::try_from(size) else {
            return 0;
        };
        if size == 0 {
            return 0;
        }
        let rounded = size.div_ceil(POOL_ALIGN).saturating_mul(POOL_ALIGN);
        {
            let mut used = dummy.pool_used.lock().unwrap_or_else(|p| p.into_inner());
            if used.saturating_add(rounded) > dummy.pool_budget {
                drop(used);
                log(
                    py,
                    "error",
                    &format!(
                        "alloc_from_mem_pool({size}): the pool of {} bytes is used up",
                        dummy.pool_budget
                    ),
                );
                return 0;
            }
            *used += rounded;
        }
        match py.allow_threads(|| conn.client.allocate_registered(len)) {
            Ok(addr) => addr as u64,
            Err(error) => {
                let mut used = dummy.pool_used.lock().unwrap_or_else(|p| p.into_inner());
                *used = used.saturating_sub(rounded);
                log(
                    py,
                    "error",
                    &format!("alloc_from_mem_pool({size}): {error}"),
                );
                0
            }
        }
    }
}

/// Host memory handed out by `MooncakeHostMemAllocator`, by address. Each block is its own
/// memfd mapping (zeroed, page aligned, shareable), unmapped by `free`.
static HOST_MEMORY: Mutex<BTreeMap<usize, HostMemory>> = Mutex::new(BTreeMap::new());

/// Upstream's `MooncakeHostMemAllocator`: `alloc(size)` returns the address of `size` bytes of
/// zeroed shared host memory (0 on failure), `free(ptr)` releases it (0, or -600 for an
/// address `alloc` did not return). Register the memory with `register_buffer` for zero-copy
/// calls. Constructor arguments (upstream's hugepage options) are accepted and not used.
#[pyclass(module = "mooncake_rs.store", name = "MooncakeHostMemAllocator")]
#[derive(Debug, Default)]
pub struct HostMemAllocator;

#[pymethods]
impl HostMemAllocator {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        HostMemAllocator
    }

    /// Address of `size` bytes of zeroed shared memory, or 0 when it cannot be allocated.
    fn alloc(&self, py: Python<'_>, size: usize) -> usize {
        if size == 0 || size > isize::MAX as usize {
            return 0;
        }
        match py.allow_threads(|| HostMemory::allocate("mooncake-host-memory", size, false)) {
            Ok(memory) => {
                let addr = memory.as_ptr() as usize;
                HOST_MEMORY
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(addr, memory);
                addr
            }
            Err(error) => {
                log(
                    py,
                    "error",
                    &format!("MooncakeHostMemAllocator.alloc({size}): {error}"),
                );
                0
            }
        }
    }

    /// Releases memory `alloc` returned: 0, or -600 for any other address. Unregister it from
    /// every store first (a registered buffer must stay mapped).
    fn free(&self, ptr: usize) -> i32 {
        let memory = HOST_MEMORY
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ptr);
        match memory {
            Some(memory) => {
                drop(memory);
                0
            }
            None => INVALID,
        }
    }
}

/// Runs a real client with upstream `mooncake_client`'s flags (`argv[0]` is the program name)
/// until SIGINT or SIGTERM; prints `mooncake_client: attach ADDR segment NAME ...` once
/// serving. Returns the exit code (2 for bad flags).
#[pyfunction]
pub fn run_real_client(py: Python<'_>, argv: Vec<String>) -> i32 {
    match RealClientArgs::parse(argv.into_iter().skip(1)) {
        Ok(args) => py.allow_threads(|| standalone::run_until_signal(args)),
        Err(ArgsError::Help(usage)) => {
            print!("{usage}");
            0
        }
        Err(ArgsError::Bad(message)) => {
            eprintln!("mooncake_client: {message}\n{}", RealClientArgs::usage());
            2
        }
    }
}
