//! Upstream's segment calls (its REST service mounts and unmounts memory at run time):
//! `mount_segment` (a file, e.g. in /dev/shm), `allocate_and_mount_segment`,
//! `unmount_segment`, `unmount_and_free_segment`, `unmount_local_disk_segment`.
//!
//! Mount calls answer a dict `{"ret": code, "segment_ids": [uuid, ...]}` (plus
//! `"allocated_size"` for `allocate_and_mount_segment`), unmount calls an int, as upstream.

use std::time::Duration;

use mooncake_common::SegmentId;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::codes::{code_of, unit_code, INVALID, NOT_READY};
use crate::store::Store;

/// Upstream accepts these protocols for a mounted segment; we serve every segment over TCP
/// (and shared memory), so rdma is taken as tcp.
fn protocol_ok(protocol: &str) -> bool {
    matches!(
        protocol.trim().to_ascii_lowercase().as_str(),
        "tcp" | "rdma" | ""
    )
}

fn mount_answer<'py>(
    py: Python<'py>,
    ret: i32,
    ids: Vec<String>,
    allocated: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("ret", ret)?;
    out.set_item("segment_ids", PyList::new(py, ids)?)?;
    if let Some(size) = allocated {
        out.set_item("allocated_size", size)?;
    }
    Ok(out)
}

impl Store {
    /// `mount_segment(path, size, offset, protocol, location)`.
    pub(crate) fn mount_file_impl<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        size: u64,
        offset: u64,
        protocol: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let Some(conn) = self.conn() else {
            return mount_answer(py, NOT_READY, Vec::new(), None);
        };
        if !protocol_ok(protocol) || size == 0 || path.is_empty() {
            return mount_answer(py, INVALID, Vec::new(), None);
        }
        let path = std::path::PathBuf::from(path);
        let mounted =
            py.allow_threads(|| conn.block_on(conn.client.mount_file_segment(&path, offset, size)));
        match mounted {
            Ok(segment) => mount_answer(py, 0, vec![segment.id.to_string()], None),
            Err(error) => mount_answer(py, code_of(&error), Vec::new(), None),
        }
    }

    /// `allocate_and_mount_segment(size, protocol, location)`.
    pub(crate) fn allocate_and_mount_impl<'py>(
        &self,
        py: Python<'py>,
        size: u64,
        protocol: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let Some(conn) = self.conn() else {
            return mount_answer(py, NOT_READY, Vec::new(), Some(0));
        };
        if !protocol_ok(protocol) || size == 0 {
            return mount_answer(py, INVALID, Vec::new(), Some(0));
        }
        let mounted = py.allow_threads(|| conn.block_on(conn.client.mount_segment(size)));
        match mounted {
            Ok(segment) => mount_answer(py, 0, vec![segment.id.to_string()], Some(segment.size)),
            Err(error) => mount_answer(py, code_of(&error), Vec::new(), Some(0)),
        }
    }

    /// `unmount_segment` / `unmount_and_free_segment`: 0 or the first negative code (-600 for
    /// an id that is not a segment of this store). Either way our memory is freed with the
    /// segment (after the grace period).
    pub(crate) fn unmount_impl(
        &self,
        py: Python<'_>,
        segment_ids: Vec<String>,
        grace_period_seconds: i64,
    ) -> i32 {
        let Some(conn) = self.conn() else {
            return NOT_READY;
        };
        let Ok(grace) = u64::try_from(grace_period_seconds) else {
            return INVALID;
        };
        let ids: Result<Vec<SegmentId>, _> =
            segment_ids.iter().map(|id| id.trim().parse()).collect();
        let Ok(ids) = ids else {
            return INVALID;
        };
        py.allow_threads(|| {
            unit_code(
                &conn.block_on(
                    conn.client
                        .unmount_segments(&ids, Duration::from_secs(grace)),
                ),
            )
        })
    }
}
