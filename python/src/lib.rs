//! Python bindings of mooncake-rs: `mooncake_rs.store.MooncakeDistributedStore` with upstream
//! Mooncake's method names, arguments and return conventions, over `mooncake_client::StoreClient`;
//! plus `run_master` and `run_real_client` so `python -m mooncake_rs.master` and
//! `python -m mooncake_rs.client` run a master and a real client without other binaries.
//!
//! Files: `store.rs` (the `MooncakeDistributedStore` class: one thin method per upstream call),
//! `writes.rs` (the put and upsert families, which differ only in `WriteMode`), `landing.rs`
//! (reads landing in `bytes` objects and caller buffers), `sessions.rs` (get and put sessions,
//! ranged calls), `segments.rs` (the mount_segment family), `standalone.rs` (setup_dummy,
//! alloc_from_mem_pool, MooncakeHostMemAllocator, the real client), `setup.rs` (setup's
//! arguments and connecting), `buffer.rs` (buffer-protocol views and checked caller memory by
//! address), `codes.rs` (upstream's return codes), `config.rs` (ReplicateConfig and the
//! descriptor classes), `tasks.rs` (copy/move tasks and their classes).
//! The binding talks to the cluster only through `mooncake_client`.
//!
//! Owns: argument conversion, GIL release around every cluster call, upstream's return codes.
//! Must never: hold the GIL while waiting on the network, fake a success the client did not
//! report, or keep a pointer to caller memory after a call returns.

mod buffer;
mod codes;
mod config;
mod landing;
mod segments;
mod sessions;
mod setup;
mod standalone;
mod store;
mod tasks;
mod writes;

use pyo3::prelude::*;

/// Runs a master with `mooncake master`'s flags (argv[0] is the program name) until SIGINT or
/// SIGTERM; prints "mooncake master listening: rpc ADDR metrics URL" once serving. Returns the
/// exit code (2 for bad flags).
#[pyfunction]
fn run_master(py: Python<'_>, argv: Vec<String>) -> i32 {
    let args = std::iter::once("mooncake master".to_string()).chain(argv.into_iter().skip(1));
    match mooncake_server::MasterConfig::load(args) {
        Ok((config, resolved)) => {
            py.allow_threads(|| mooncake_server::run_until_signal(config, resolved))
        }
        Err(mooncake_server::ConfigError::Help(text)) => {
            print!("{text}");
            0
        }
        Err(error) => {
            eprintln!("mooncake master: {error}");
            error.exit_code()
        }
    }
}

/// Upstream's error code name for a number (e.g. -704 → "OBJECT_NOT_FOUND"), or None.
#[pyfunction]
fn error_name(code: i32) -> Option<&'static str> {
    mooncake_common::ErrorCode::from_i32(code).map(|c| c.name())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::Store>()?;
    m.add_class::<config::ReplicateConfig>()?;
    m.add_class::<config::SoftPinAction>()?;
    m.add_class::<config::ReplicaStatus>()?;
    m.add_class::<config::ReplicaDescriptor>()?;
    m.add_class::<config::MemoryDescriptor>()?;
    m.add_class::<config::DiskDescriptor>()?;
    m.add_class::<config::Descriptor>()?;
    m.add_class::<buffer::NativeBuffer>()?;
    m.add_class::<standalone::HostMemAllocator>()?;
    m.add_class::<tasks::TaskType>()?;
    m.add_class::<tasks::TaskStatus>()?;
    m.add_class::<tasks::QueryTaskResponse>()?;
    m.add_function(wrap_pyfunction!(run_master, m)?)?;
    m.add_function(wrap_pyfunction!(standalone::run_real_client, m)?)?;
    m.add_function(wrap_pyfunction!(error_name, m)?)?;
    Ok(())
}
