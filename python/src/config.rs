//! `ReplicateConfig`, `SoftPinAction` and the replica descriptor classes, as upstream's Python
//! module exposes them.

use mooncake_common::{
    ReplicaDescriptor as RsReplicaDescriptor, ReplicaKind, ReplicaStatus as RsReplicaStatus,
    ReplicateConfig as RsReplicateConfig, SoftPinAction as RsSoftPinAction,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyInt;

/// What a put does to the object's soft pin (upstream numbers: PRESERVE 0, ENABLE 1, DISABLE 2).
#[pyclass(eq, eq_int, module = "mooncake_rs.store")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::upper_case_acronyms)]
pub enum SoftPinAction {
    /// Keep whatever soft pin the object has (none for a new object).
    PRESERVE = 0,
    /// Pin for `soft_pin_ttl_ms`, or the master's default TTL when it is None.
    ENABLE = 1,
    /// Clear the pin.
    DISABLE = 2,
}

impl From<SoftPinAction> for RsSoftPinAction {
    fn from(action: SoftPinAction) -> Self {
        match action {
            SoftPinAction::PRESERVE => RsSoftPinAction::Preserve,
            SoftPinAction::ENABLE => RsSoftPinAction::Enable,
            SoftPinAction::DISABLE => RsSoftPinAction::Disable,
        }
    }
}

/// How a put wants its object replicated and pinned. Fields and defaults are upstream's.
///
/// `with_soft_pin` is upstream's older boolean: setting it True means
/// `soft_pin_action = SoftPinAction.ENABLE`, False means PRESERVE; reading it tells whether the
/// action is ENABLE. `soft_pin_ttl_ms` is None (master default) or an int in [0, 2**64); anything
/// else raises TypeError, as upstream. Other checks (replica_num >= 1, a TTL only with ENABLE,
/// group_ids length = number of keys) are made by the master, which answers -600
/// (INVALID_PARAMS).
#[pyclass(module = "mooncake_rs.store", subclass)]
#[derive(Debug, Clone, Default)]
pub struct ReplicateConfig {
    pub inner: RsReplicateConfig,
}

#[pymethods]
impl ReplicateConfig {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(
        _args: &Bound<'_, pyo3::types::PyTuple>,
        _kwargs: Option<&Bound<'_, pyo3::types::PyDict>>,
    ) -> Self {
        ReplicateConfig::default()
    }

    #[getter]
    fn replica_num(&self) -> usize {
        self.inner.replica_num
    }
    #[setter]
    fn set_replica_num(&mut self, value: usize) {
        self.inner.replica_num = value;
    }
    #[getter]
    fn nof_replica_num(&self) -> usize {
        self.inner.nof_replica_num
    }
    #[setter]
    fn set_nof_replica_num(&mut self, value: usize) {
        self.inner.nof_replica_num = value;
    }
    #[getter]
    fn dfs_replica_num(&self) -> usize {
        self.inner.dfs_replica_num
    }
    #[setter]
    fn set_dfs_replica_num(&mut self, value: usize) {
        self.inner.dfs_replica_num = value;
    }
    #[getter]
    fn with_soft_pin(&self) -> bool {
        self.inner.soft_pin_action == RsSoftPinAction::Enable
    }
    #[setter]
    fn set_with_soft_pin(&mut self, value: bool) {
        self.inner.soft_pin_action = if value {
            RsSoftPinAction::Enable
        } else {
            RsSoftPinAction::Preserve
        };
    }
    #[getter]
    fn soft_pin_action(&self) -> SoftPinAction {
        match self.inner.soft_pin_action {
            RsSoftPinAction::Preserve => SoftPinAction::PRESERVE,
            RsSoftPinAction::Enable => SoftPinAction::ENABLE,
            RsSoftPinAction::Disable => SoftPinAction::DISABLE,
        }
    }
    #[setter]
    fn set_soft_pin_action(&mut self, value: SoftPinAction) {
        self.inner.soft_pin_action = value.into();
    }
    #[getter]
    fn soft_pin_ttl_ms(&self) -> Option<u64> {
        self.inner.soft_pin_ttl_ms
    }
    #[setter]
    fn set_soft_pin_ttl_ms(&mut self, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.inner.soft_pin_ttl_ms = match value {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) => {
                if !v.is_instance_of::<PyInt>() {
                    return Err(PyTypeError::new_err(
                        "soft_pin_ttl_ms must be None or an int in [0, 2**64)",
                    ));
                }
                Some(v.extract::<u64>().map_err(|_| {
                    PyTypeError::new_err("soft_pin_ttl_ms must be None or an int in [0, 2**64)")
                })?)
            }
        };
        Ok(())
    }
    #[getter]
    fn with_hard_pin(&self) -> bool {
        self.inner.with_hard_pin
    }
    #[setter]
    fn set_with_hard_pin(&mut self, value: bool) {
        self.inner.with_hard_pin = value;
    }
    #[getter]
    fn preferred_segments(&self) -> Vec<String> {
        self.inner.preferred_segments.clone()
    }
    #[setter]
    fn set_preferred_segments(&mut self, value: Vec<String>) {
        self.inner.preferred_segments = value;
    }
    #[getter]
    fn preferred_segment(&self) -> String {
        self.inner.preferred_segment.clone()
    }
    #[setter]
    fn set_preferred_segment(&mut self, value: String) {
        self.inner.preferred_segment = value;
    }
    #[getter]
    fn preferred_nof_segments(&self) -> Vec<String> {
        self.inner.preferred_nof_segments.clone()
    }
    #[setter]
    fn set_preferred_nof_segments(&mut self, value: Vec<String>) {
        self.inner.preferred_nof_segments = value;
    }
    #[getter]
    fn prefer_alloc_in_same_node(&self) -> bool {
        self.inner.prefer_alloc_in_same_node
    }
    #[setter]
    fn set_prefer_alloc_in_same_node(&mut self, value: bool) {
        self.inner.prefer_alloc_in_same_node = value;
    }
    #[getter]
    fn data_type(&self) -> u8 {
        self.inner.data_type
    }
    #[setter]
    fn set_data_type(&mut self, value: u8) {
        self.inner.data_type = value;
    }
    #[getter]
    fn host_id(&self) -> String {
        self.inner.host_id.clone()
    }
    #[setter]
    fn set_host_id(&mut self, value: String) {
        self.inner.host_id = value;
    }
    /// One group name per key of a batch ("" = ungrouped); None = no groups.
    #[getter]
    fn group_ids(&self) -> Option<Vec<String>> {
        self.inner.group_ids.clone()
    }
    #[setter]
    fn set_group_ids(&mut self, value: Option<Vec<String>>) {
        self.inner.group_ids = value;
    }

    fn __repr__(&self) -> String {
        let c = &self.inner;
        format!(
            "ReplicateConfig(replica_num={}, soft_pin_action={:?}, soft_pin_ttl_ms={:?}, \
             with_hard_pin={}, preferred_segments={:?}, preferred_segment={:?}, \
             prefer_alloc_in_same_node={}, group_ids={:?})",
            c.replica_num,
            c.soft_pin_action,
            c.soft_pin_ttl_ms,
            c.with_hard_pin,
            c.preferred_segments,
            c.preferred_segment,
            c.prefer_alloc_in_same_node,
            c.group_ids
        )
    }

    fn __str__(&self) -> String {
        self.__repr__()
    }
}

/// A replica's state (upstream numbers).
#[pyclass(eq, eq_int, module = "mooncake_rs.store")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::upper_case_acronyms)]
pub enum ReplicaStatus {
    UNDEFINED = 0,
    INITIALIZED = 1,
    PROCESSING = 2,
    COMPLETE = 3,
    REMOVED = 4,
    FAILED = 5,
}

impl From<RsReplicaStatus> for ReplicaStatus {
    fn from(s: RsReplicaStatus) -> Self {
        match s {
            RsReplicaStatus::UNDEFINED => ReplicaStatus::UNDEFINED,
            RsReplicaStatus::INITIALIZED => ReplicaStatus::INITIALIZED,
            RsReplicaStatus::PROCESSING => ReplicaStatus::PROCESSING,
            RsReplicaStatus::COMPLETE => ReplicaStatus::COMPLETE,
            RsReplicaStatus::REMOVED => ReplicaStatus::REMOVED,
            RsReplicaStatus::FAILED => ReplicaStatus::FAILED,
        }
    }
}

/// Where a memory replica's bytes are (upstream's `Descriptor`).
#[pyclass(module = "mooncake_rs.store", get_all)]
#[derive(Debug, Clone)]
pub struct Descriptor {
    pub size: u64,
    pub buffer_address: u64,
    pub transport_endpoint: String,
}

#[pymethods]
impl Descriptor {
    fn __repr__(&self) -> String {
        format!(
            "<Descriptor size={} buffer_address={} transport_endpoint={}>",
            self.size, self.buffer_address, self.transport_endpoint
        )
    }
}

/// A memory replica (upstream: `buffer_descriptor`).
#[pyclass(module = "mooncake_rs.store", get_all)]
#[derive(Debug, Clone)]
pub struct MemoryDescriptor {
    pub buffer_descriptor: Descriptor,
}

/// A disk replica.
#[pyclass(module = "mooncake_rs.store", get_all)]
#[derive(Debug, Clone)]
pub struct DiskDescriptor {
    pub file_path: String,
    pub object_size: u64,
}

/// One replica of an object, as `get_replica_desc` returns it.
#[pyclass(module = "mooncake_rs.store")]
#[derive(Debug, Clone)]
pub struct ReplicaDescriptor {
    inner: RsReplicaDescriptor,
}

impl From<RsReplicaDescriptor> for ReplicaDescriptor {
    fn from(inner: RsReplicaDescriptor) -> Self {
        ReplicaDescriptor { inner }
    }
}

#[pymethods]
impl ReplicaDescriptor {
    #[getter]
    fn status(&self) -> ReplicaStatus {
        self.inner.status.into()
    }

    fn is_memory_replica(&self) -> bool {
        matches!(self.inner.kind, ReplicaKind::Memory(_))
    }

    fn is_disk_replica(&self) -> bool {
        matches!(self.inner.kind, ReplicaKind::Disk(_))
    }

    /// True for a replica on a client's local disk (the SSD offload tier), read from the
    /// descriptor the master sent.
    fn is_local_disk_replica(&self) -> bool {
        matches!(self.inner.kind, ReplicaKind::LocalDisk(_))
    }

    fn get_memory_descriptor(&self) -> PyResult<MemoryDescriptor> {
        match &self.inner.kind {
            ReplicaKind::Memory(m) | ReplicaKind::NoF(m) => Ok(MemoryDescriptor {
                buffer_descriptor: Descriptor {
                    size: m.size,
                    buffer_address: m.buffer_address,
                    transport_endpoint: m.transport_endpoint.to_string(),
                },
            }),
            _ => Err(PyValueError::new_err("not a memory replica")),
        }
    }

    fn get_disk_descriptor(&self) -> PyResult<DiskDescriptor> {
        match &self.inner.kind {
            ReplicaKind::Disk(d) => Ok(DiskDescriptor {
                file_path: d.file_path.clone(),
                object_size: d.object_size,
            }),
            _ => Err(PyValueError::new_err("not a disk replica")),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "ReplicaDescriptor(status={:?}, kind={:?})",
            self.inner.status, self.inner.kind
        )
    }
}
