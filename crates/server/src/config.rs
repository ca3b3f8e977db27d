//! `mooncake master` configuration: one table of every flag upstream's `mooncake_master` takes
//! (its own, gflags' and glog's) plus ours, the typed [`MasterConfig`] it generates, and
//! validation with clear messages. Parsing (gflags syntax, config files) is in `flags.rs`.
//!
//! Each table line is `name: RustType = default, Origin UpstreamType, Status, "upstream help"`.
//! The status says what mooncake-rs does with the flag ([`Status`]):
//! - `HONOURED`: implemented; the value is read from `MasterConfig` by `process.rs`.
//! - `Refused(FEATURE)`: it turns on a feature we do not build; accepted at its default, refused
//!   otherwise (`--enable_kv_events=true: not supported by mooncake-rs (KV cache events)`).
//! - `Inert(FEATURE)`: a setting of a feature we do not build; accepted at any value, no effect.
//!
//! A feature that gets built flips its lines to `HONOURED` and reads the fields (already typed
//! here) from `MasterConfig`. Flags given that have no effect are named in one warning line at
//! start-up ([`ResolvedConfig::notice`]).

use mooncake_common::units::parse_duration_ms;
use mooncake_common::AuthToken;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use thiserror::Error;

use crate::flags::{apply_file, notice, parse_command_line, read_config_file};
pub use crate::flags::{
    find_flag, flag_table_markdown, help_text, FlagSpec, FlagType, FlagValue, Origin, Status,
};

/// Why a configuration was refused at start-up (or what to print instead of starting).
#[derive(Debug, Error)]
pub enum ConfigError {
    /// Command-line syntax: unknown flag, missing value, stray argument.
    #[error("{0}")]
    Flags(String),
    /// `--help` or `--version`: print this on stdout and exit 0.
    #[error("{0}")]
    Help(String),
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid value for --{flag}: {message}")]
    Invalid { flag: &'static str, message: String },
    /// Flags that ask for features mooncake-rs does not build, one line each.
    #[error("{}", .0.join("\n"))]
    Unsupported(Vec<String>),
}

impl ConfigError {
    /// The process exit code for this outcome (0 for `--help`/`--version`, 2 otherwise).
    pub fn exit_code(&self) -> i32 {
        match self {
            ConfigError::Help(_) => 0,
            _ => 2,
        }
    }
}

const HONOURED: Status = Status::Honoured;

// Features mooncake-rs does not build (yet), as flag statuses name them.
const HA: &str = "high availability (HA)";
const OPLOG: &str = "HA op-log replication";
const SNAPSHOT_CHILD: &str = "snapshot child process (snapshots are written in-process)";
const SNAPSHOT_BACKUP: &str = "snapshot backup directory (snapshots are local files already)";
const SNAPSHOT_STORES: &str = "snapshot object and catalog stores other than local files";
const OFFLOAD: &str = "SSD offload";
const PROMOTION: &str = "promotion on hit";
const KV_EVENTS: &str = "KV cache events";
const CXL: &str = "CXL memory";
const NOF: &str = "NVMe-oF segments";
const DFS: &str = "DFS/3FS storage backend";
const METADATA_CLEANUP: &str = "HTTP metadata cleanup on client timeout";
const RPC_INTERFACE: &str = "rpc_address from a network interface (give --rpc_address)";
const NO_DELAY_OFF: &str = "RPC without TCP_NODELAY";
const MMAP_ARENA: &str = "mmap arena allocator";
const COMPLETION: &str = "gflags shell completion";
const GLOG: &str = "glog output settings (mooncake-rs logs to stderr; MOONCAKE_LOG filters)";

/// Generates [`MasterConfig`], its `Default`, the static [`FLAGS`] table and by-name access from
/// one list of flags.
macro_rules! master_flags {
    ($(
        $name:ident : $ty:ty = $default:literal, $origin:ident $uty:ident, $status:expr,
            $help:literal $(, aliases = [$($alias:literal),* $(,)?])? ;
    )*) => {
        /// Every setting of the master process, one field per flag (see the table in
        /// `config.rs`). Field names are the flag names.
        #[derive(Debug, Clone, PartialEq)]
        pub struct MasterConfig {
            $( #[doc = $help] pub $name: $ty, )*
        }

        impl Default for MasterConfig {
            fn default() -> Self {
                MasterConfig { $( $name: <$ty as FlagValue>::from_lit($default), )* }
            }
        }

        /// Every flag: name, aliases, origin, upstream type, default, status, help.
        pub static FLAGS: &[FlagSpec] = &[$(
            FlagSpec {
                name: stringify!($name),
                aliases: &[$($($alias),*)?],
                origin: Origin::$origin,
                ty: FlagType::$uty,
                default_literal: stringify!($default),
                status: $status,
                help: $help,
            },
        )*];

        impl MasterConfig {
            /// Sets the flag `name` (canonical) from gflags text.
            pub(crate) fn set_text(&mut self, name: &str, text: &str) -> Result<(), String> {
                match name {
                    $( stringify!($name) => {
                        self.$name = FlagValue::parse_flag(text)?;
                        Ok(())
                    } )*
                    _ => Err(format!("no flag named {name:?}")),
                }
            }

            /// The value of flag `name` as gflags text.
            pub fn value_text(&self, name: &str) -> Option<String> {
                match name {
                    $( stringify!($name) => Some(FlagValue::to_flag_text(&self.$name)), )*
                    _ => None,
                }
            }

            /// Whether flag `name` holds its default.
            pub fn is_default(&self, name: &str) -> bool {
                match name {
                    $( stringify!($name) => {
                        self.$name == <$ty as FlagValue>::from_lit($default)
                    } )*
                    _ => true,
                }
            }
        }
    };
}

master_flags! {
    // ---- RPC server -----------------------------------------------------------------------
    port: u16 = 50051, Master Int32, HONOURED,
        "Port for master service to listen on (deprecated, use rpc_port)";
    rpc_port: u16 = 0, Master Int32, HONOURED,
        "Port for RPC server to listen on (0 = use port, preferred over port)";
    rpc_address: String = "127.0.0.1", Master String, HONOURED,
        "Address for RPC server to bind to, required in HA mode (mooncake-rs binds loopback unless told otherwise; upstream's default is 0.0.0.0)";
    rpc_thread_num: usize = 0, Master Int32, HONOURED,
        "Number of threads for RPC server (0 = use max_threads, preferred over max_threads)";
    max_threads: usize = 16, Master Int32, HONOURED,
        "Maximum number of threads to use (deprecated, use rpc_thread_num)";
    rpc_conn_timeout_seconds: u64 = 0, Master Int32, HONOURED,
        "Connection timeout in seconds (0 = no timeout)";
    rpc_enable_tcp_no_delay: bool = true, Master Bool, HONOURED,
        "Enable TCP_NODELAY for RPC connections";
    rpc_interface: String = "", Master String, Status::Refused(RPC_INTERFACE),
        "Network interface name for RPC server address resolution. When set, its IPv4 address overrides rpc_address";

    // ---- HTTP admin and metrics -------------------------------------------------------------
    metrics_port: u16 = 9003, Master Int32, HONOURED,
        "Port for HTTP metrics server to listen on";
    metrics_host: String = "127.0.0.1", Master String, HONOURED,
        "Address for the HTTP metrics/admin server to listen on. Use \"::\" to listen on IPv6 (and IPv4 on dual-stack hosts) (mooncake-rs binds loopback unless told otherwise; upstream's default is 0.0.0.0)";
    enable_metric_reporting: bool = true, Master Bool, HONOURED,
        "Enable periodic metric reporting";

    // ---- leases, soft pins, eviction --------------------------------------------------------
    default_kv_lease_ttl: String = "10000", Master String, HONOURED,
        "Default lease time for kv objects. Supports raw milliseconds or duration strings with ms, s, m, or h suffixes";
    default_kv_soft_pin_ttl: String = "1800000", Master String, HONOURED,
        "Default soft pin TTL for kv objects. Supports raw milliseconds or duration strings with ms, s, m, or h suffixes";
    max_kv_soft_pin_ttl: String = "86400000", Master String, HONOURED,
        "Maximum request-level soft pin TTL for kv objects. Supports raw milliseconds or duration strings with ms, s, m, or h suffixes";
    allow_evict_soft_pinned_objects: bool = true, Master Bool, HONOURED,
        "Whether to allow eviction of soft pinned objects during eviction";
    eviction_ratio: f64 = 0.05, Master Double, HONOURED,
        "Ratio of objects to evict when Memory space is full";
    eviction_high_watermark_ratio: f64 = 0.9, Master Double, HONOURED,
        "Ratio of high watermark trigger eviction in Memory";

    // ---- clients and puts ---------------------------------------------------------------------
    client_ttl: u64 = 10, Master Int64, HONOURED,
        "Seconds a client stays considered alive after the last heartbeat. If this TTL elapses without a refresh, the master treats the client as disconnected and may unmount its segments",
        aliases = ["client_live_ttl_sec"];
    put_start_discard_timeout_sec: u64 = 30, Master UInt64, HONOURED,
        "Timeout for discarding uncompleted PutStart operations";
    put_start_release_timeout_sec: u64 = 600, Master UInt64, HONOURED,
        "Timeout for releasing space allocated in uncompleted PutStart operations";

    // ---- allocation -----------------------------------------------------------------------------
    memory_allocator: String = "offset", Master String, HONOURED,
        "Memory allocator for global segments, cachelib | offset";
    allocation_strategy: String = "random", Master String, HONOURED,
        "Allocation strategy for segments, random | free_ratio_first | cxl | ssd_free_ratio_first | local_first";

    // ---- tenancy ----------------------------------------------------------------------------------
    enable_multi_tenants: bool = false, Master Bool, HONOURED,
        "Enable strict multi-tenant namespace and quota admission";
    tenant_quota_connector_type: String = "file", Master String, HONOURED,
        "Tenant quota policy connector type";
    tenant_quota_connector_uri: String = "", Master String, HONOURED,
        "Tenant quota policy connector URI";

    // ---- HTTP metadata server -------------------------------------------------------------------
    enable_http_metadata_server: bool = false, Master Bool, HONOURED,
        "Enable HTTP metadata server instead of etcd";
    http_metadata_server_host: String = "127.0.0.1", Master String, HONOURED,
        "Host for HTTP metadata server to bind to (mooncake-rs binds loopback unless told otherwise; upstream's default is 0.0.0.0)";
    http_metadata_server_port: u16 = 8080, Master Int32, HONOURED,
        "Port for HTTP metadata server to listen on";
    enable_metadata_cleanup_on_timeout: bool = false, Master Bool, Status::Refused(METADATA_CLEANUP),
        "Enable cleanup of HTTP metadata (mooncake/ram/*, mooncake/rpc_meta/*) when client heartbeat times out. Works in two modes: (1) co-located (enable_http_metadata_server=true) via in-process removal, or (2) separately-deployed metadata server via async HTTP DELETE.";

    // ---- copy/move task queue -----------------------------------------------------------------
    max_total_finished_tasks: u32 = 10000, Master UInt32, HONOURED,
        "Maximum number of finished tasks to keep in memory";
    max_total_pending_tasks: u32 = 10000, Master UInt32, HONOURED,
        "Maximum number of pending tasks to keep in memory";
    max_total_processing_tasks: u32 = 10000, Master UInt32, HONOURED,
        "Maximum number of processing tasks to keep in memory";
    pending_task_timeout_sec: u64 = 300, Master UInt64, HONOURED,
        "Timeout in seconds for pending tasks (0 = no timeout)";
    processing_task_timeout_sec: u64 = 300, Master UInt64, HONOURED,
        "Timeout in seconds for processing tasks (0 = no timeout)";
    max_retry_attempts: u32 = 10, Master UInt32, HONOURED,
        "Maximum number of retry attempts for failed tasks";

    // ---- cluster and config file ----------------------------------------------------------------
    cluster_id: String = "mooncake_cluster", Master String, HONOURED,
        "Cluster ID for the master service, used for kvcache persistence in HA mode";
    config_path: String = "", Master String, HONOURED,
        "master service config file path", aliases = ["config"];

    // ---- ours (no upstream flag) ------------------------------------------------------------------
    rpc_max_connections: usize = 1024, Ours UInt64, HONOURED,
        "RPC connections served at once; more are refused with one error frame";
    busy_poll_us: u64 = 0, Ours UInt64, HONOURED,
        "Opt-in low-latency mode: spin on sockets this many microseconds before parking (0 = off)";
    rpc_handshake_timeout_seconds: u64 = 10, Ours UInt64, HONOURED,
        "Close an RPC connection that has not completed a valid request this many seconds after connecting (0 = never); when the server is full such connections make room first";
    rpc_max_connections_per_address: usize = 256, Ours UInt64, HONOURED,
        "RPC connections served at once from one IP address";
    rpc_frame_timeout_seconds: u64 = 10, Ours UInt64, HONOURED,
        "Seconds every request frame (and every write of answers) may take once started, on top of its length at rpc_min_request_bytes_per_second";
    rpc_min_request_bytes_per_second: u64 = 1048576, Ours UInt64, HONOURED,
        "Slowest rate a request frame may arrive at (and answers may leave at) once started";
    auth_token_file: String = "", Ours String, HONOURED,
        "File holding the cluster's shared token (at least 16 bytes, surrounding whitespace trimmed). When set, every RPC connection must present it first (Authenticate), the admin HTTP endpoints other than /metrics, /metrics/summary, /health, /role, /ha_status and /leader (and the metadata server's /metadata) need `Authorization: Bearer TOKEN`, and store nodes given the same token serve their memory only to clients this master admitted (docs/security.md)";
    rpc_max_buffered_request_bytes: u64 = 268435456, Ours UInt64, HONOURED,
        "Bytes of request frames over 64 KiB that all RPC connections together may hold; over it the server stops reading them and sheds the oldest (at least the 16 MiB frame limit)";
    oplog_ack: String = "durable", Ours String, HONOURED,
        "With --enable_oplog: durable = PutEnd, Remove and every other acknowledged mutation reply once their op-log batch is durable in etcd; visible = they reply at once (upstream's mode; calls that hand out space still wait)";
    oplog_ack_timeout_ms: u64 = 5000, Ours UInt64, HONOURED,
        "With --enable_oplog: longest wait of one acknowledgement for etcd; past it the call fails with ETCD_OPERATION_ERROR (retryable)";
    put_start_evict_budget: usize = 4096, Ours UInt64, HONOURED,
        "Objects a PutStart that finds the store full may examine to evict inline, oldest first, what it needs (0 = refuse with NO_AVAILABLE_HANDLE at once, as upstream)";

    // ---- high availability ------------------------------------------------------------------
    enable_ha: bool = false, Master Bool, HONOURED,
        "Enable high availability using the configured HA backend (etcd; implies --enable_oplog: standbys replay the op-log)";
    ha_backend_type: String = "etcd", Master String, HONOURED,
        "HA backend type, e.g. etcd | redis | k8s";
    ha_backend_connstring: String = "", Master String, HONOURED,
        "HA backend connection string. If unset, only backend_type=etcd falls back to etcd_endpoints for backward compatibility";
    etcd_endpoints: String = "", Master String, HONOURED,
        "Endpoints of ETCD server, separated by semicolon, required in HA mode";
    pod_name: String = "", Master String, Status::Inert(HA),
        "Pod name for K8s label-based routing (default: $POD_NAME)";
    pod_namespace: String = "", Master String, Status::Inert(HA),
        "Pod namespace for K8s label-based routing (default: $POD_NAMESPACE)";
    enable_oplog: bool = false, Master Bool, HONOURED,
        "Enable HA metadata replication through batch-record OpLog";
    oplog_batch_max_entries: u32 = 1024, Master UInt32, Status::Inert(OPLOG),
        "Maximum number of committed/reserved entries in the open batch-record OpLog waiting batch.";
    oplog_poll_interval_ms: i32 = 1000, Master Int32, Status::Inert(OPLOG),
        "Batch-record standby poll interval.";
    batch_oplog_retry_timeout_sec: u32 = 180, Master UInt32, Status::Inert(OPLOG),
        "Maximum time to retry transient batch OpLog standby errors.";

    // ---- snapshots ---------------------------------------------------------------------------
    enable_snapshot: bool = false, Master Bool, HONOURED,
        "Enable periodic snapshot of master data";
    enable_snapshot_restore: bool = false, Master Bool, HONOURED,
        "enable restore from snapshot";
    snapshot_interval_seconds: u64 = 600, Master UInt64, HONOURED,
        "Interval in second between periodic snapshots of master data";
    snapshot_child_timeout_seconds: u64 = 300, Master UInt64, Status::Inert(SNAPSHOT_CHILD),
        "Timeout for snapshot child process in seconds";
    snapshot_retention_count: u32 = 2, Master UInt32, HONOURED,
        "Number of recent snapshots to keep (older snapshots will be automatically deleted)";
    snapshot_dir: String = "", Ours String, HONOURED,
        "Directory of the master's snapshot files (default: $MOONCAKE_SNAPSHOT_LOCAL_PATH); required by --enable_snapshot and --enable_snapshot_restore";
    snapshot_required: bool = false, Ours Bool, HONOURED,
        "With --enable_snapshot_restore: refuse to start when no snapshot in --snapshot_dir verifies";
    snapshot_backup_dir: String = "", Master String, Status::Inert(SNAPSHOT_BACKUP),
        "Optional local directory for snapshot and restore backup. If empty, local backup is disabled";
    snapshot_object_store_type: String = "", Master String, Status::Inert(SNAPSHOT_STORES),
        "Snapshot object store type: 'local' for local filesystem, 's3' for S3 storage";
    snapshot_payload_store_type: String = "", Master String, Status::Inert(SNAPSHOT_STORES),
        "Deprecated alias of --snapshot_object_store_type";
    snapshot_payload_backend_type: String = "", Master String, Status::Inert(SNAPSHOT_STORES),
        "Deprecated alias of --snapshot_object_store_type";
    snapshot_catalog_store_type: String = "", Master String, Status::Inert(SNAPSHOT_STORES),
        "Snapshot catalog store type: ''/'embedded' or 'redis' ('payload' is kept as a deprecated alias)";
    snapshot_catalog_backend_type: String = "", Master String, Status::Inert(SNAPSHOT_STORES),
        "Deprecated alias of --snapshot_catalog_store_type";
    snapshot_catalog_store_connstring: String = "", Master String, Status::Inert(SNAPSHOT_STORES),
        "Optional connection string for snapshot catalog store";
    snapshot_catalog_backend_connstring: String = "", Master String, Status::Inert(SNAPSHOT_STORES),
        "Deprecated alias of --snapshot_catalog_store_connstring";

    // ---- SSD offload and promotion (not built) --------------------------------------------------
    enable_offload: bool = false, Master Bool, HONOURED,
        "Enable offload availability";
    offload_on_evict: bool = false, Master Bool, HONOURED,
        "Defer LOCAL_DISK offload to eviction time instead of PutEnd";
    offload_force_evict: bool = false, Master Bool, Status::Inert(OFFLOAD),
        "Force-evict objects exceeding offload cap without disk offload";
    offloading_queue_limit: u64 = 50000, Master UInt64, HONOURED,
        "Maximum number of objects allowed in the offloading queue per local disk segment. Increase to allow more objects to be offloaded to SSD before force-eviction kicks in";
    offload_cap_ratio: f64 = 0.5, Master Double, Status::Inert(OFFLOAD),
        "Per-cycle offload cap as a fraction of offloading_queue_limit. Controls how many objects can be queued for offload in a single eviction cycle before falling back to force-evict";
    promotion_on_hit: bool = false, Master Bool, HONOURED,
        "Promote LOCAL_DISK-only keys to MEMORY on read access (mirror of offload_on_evict)";
    promotion_admission_threshold: u32 = 2, Master UInt32, HONOURED,
        "Min CountMinSketch count for a key before promotion fires (set 1 to disable second-touch gating)";
    promotion_queue_limit: u32 = 50000, Master UInt32, HONOURED,
        "Max in-flight promotion tasks across all shards";
    promotion_max_per_heartbeat: u32 = 1, Master UInt32, Status::Inert(PROMOTION),
        "Max promotion tasks returned to a single client per PromotionObjectHeartbeat call. Each task is a synchronous SSD-read + RDMA-write on the client; serializing them avoids blocking past the client-liveness window. Default 1 is conservative.";

    // ---- DFS/3FS storage backend (not built) ----------------------------------------------------
    root_fs_dir: String = "", Master String, Status::Refused(DFS),
        "Root directory for storage backend, used in HA mode";
    global_file_segment_size: i64 = 9223372036854775807, Master Int64, Status::Inert(DFS),
        "Size of global NFS/3FS segment in bytes";
    enable_disk_eviction: bool = true, Master Bool, Status::Inert(DFS),
        "Enable disk eviction feature for storage backend (default: true)";
    quota_bytes: u64 = 0, Master UInt64, Status::Inert(DFS),
        "Quota for storage backend in bytes (0 = use default 90% of capacity)";

    // ---- KV cache events (not built) ----------------------------------------------------------
    enable_kv_events: bool = false, Master Bool, Status::Refused(KV_EVENTS),
        "Enable RFC #1527 KV cache event publisher over ZMQ";
    kv_events_bind_endpoint: String = "", Master String, Status::Inert(KV_EVENTS),
        "ZMQ PUB bind endpoint for KV events, e.g. tcp://0.0.0.0:5557";
    kv_events_backend_id: String = "", Master String, Status::Inert(KV_EVENTS),
        "backend_id for published KV events (cache owner identity)";
    kv_events_queue_capacity: u32 = 65536, Master UInt32, Status::Inert(KV_EVENTS),
        "Maximum pending KV events; oldest events are dropped when the queue is full (0 = unbounded)";
    kv_events_emit_object_key: bool = true, Master Bool, Status::Inert(KV_EVENTS),
        "Include Mooncake object_key in published KV events";
    kv_events_emit_legacy_compat: bool = true, Master Bool, Status::Inert(KV_EVENTS),
        "Include vLLM/SGLang-compatible type/block_hashes fields";
    kv_events_model_name: String = "", Master String, Status::Inert(KV_EVENTS),
        "Deprecated: not emitted on events; use indexer POST /register";
    kv_events_tenant_id: String = "default", Master String, Status::Inert(KV_EVENTS),
        "Deprecated: tenant_id comes from each object on events";
    kv_events_additional_salt: String = "", Master String, Status::Inert(KV_EVENTS),
        "Deprecated: not emitted on events; use indexer POST /register";
    kv_events_lora_name: String = "", Master String, Status::Inert(KV_EVENTS),
        "Deprecated: not emitted on events (no LoRA context in master)";
    kv_events_block_size: u32 = 0, Master UInt32, Status::Inert(KV_EVENTS),
        "Deprecated: not emitted on events; use indexer POST /register";
    kv_events_dp_rank: u32 = 0, Master UInt32, Status::Inert(KV_EVENTS),
        "Deprecated: not emitted on events; use indexer POST /register";

    // ---- CXL, NoF, mmap arena (not built); dynamic replication (hot-key replicas) ----------------
    enable_cxl: bool = false, Master Bool, Status::Refused(CXL),
        "Whether to enable CXL memory support";
    cxl_path: String = "/dev/dax0.0", Master String, Status::Inert(CXL),
        "DAX device path for CXL memory";
    cxl_size: u64 = 8589934592, Master UInt64, Status::Inert(CXL),
        "CXL memory size in bytes";
    nof_eviction_ratio: f64 = 0.05, Master Double, Status::Inert(NOF),
        "Ratio of objects to evict when NoF SSD space is full";
    nof_eviction_high_watermark_ratio: f64 = 0.9, Master Double, Status::Inert(NOF),
        "Ratio of high watermark trigger eviction in NoF SSD";
    nof_heartbeat_interval_sec: i64 = 10, Master Int64, Status::Inert(NOF),
        "How often master probes each mounted NoF segment";
    nof_heartbeat_probe_timeout_ms: u32 = 1000, Master UInt32, Status::Inert(NOF),
        "Timeout in milliseconds for a single NoF heartbeat probe";
    nof_heartbeat_failures_threshold: u32 = 3, Master UInt32, Status::Inert(NOF),
        "Consecutive NoF heartbeat failures required before unmounting a NoF segment";
    dynamic_replication_mode: String = "off", Master String, HONOURED,
        "Dynamic MEMORY replica fanout mode: off, observe, or enforce";
    dynamic_replication_heat_window_seconds: u32 = 10, Master UInt32, HONOURED,
        "Heat observation window for dynamic MEMORY replication";
    dynamic_replication_admission_qps_threshold: f64 = 0.8, Master Double, HONOURED,
        "Per-key access frequency threshold for dynamic MEMORY replication";
    dynamic_replication_max_memory_replicas: u64 = 2, Master UInt64, HONOURED,
        "Maximum MEMORY replicas allowed for one dynamically replicated key";
    use_mmap_arena_allocator: bool = false, Master Bool, Status::Refused(MMAP_ARENA),
        "Enable the lock-free mmap arena allocator for mmap buffers";
    mmap_arena_pool_size: u64 = 8589934592, Master UInt64, Status::Inert(MMAP_ARENA),
        "Arena allocator pool size in bytes";

    // ---- gflags' own flags ------------------------------------------------------------------------
    flagfile: String = "", Gflags String, HONOURED,
        "load flags from file";
    fromenv: String = "", Gflags String, HONOURED,
        "set flags from the environment [use 'export FLAGS_flag1=value']";
    tryfromenv: String = "", Gflags String, HONOURED,
        "set flags from the environment if present";
    undefok: String = "", Gflags String, HONOURED,
        "comma-separated list of flag names that it is okay to specify on the command line even if the program does not define a flag with that name.  IMPORTANT: flags in this list that have arguments MUST use the flag=value format";
    help: bool = false, Gflags Bool, HONOURED,
        "show help on all flags [tip: all flags can have two dashes]";
    helpfull: bool = false, Gflags Bool, HONOURED,
        "show help on all flags -- same as -help";
    helpshort: bool = false, Gflags Bool, HONOURED,
        "show help on only the main module for this program";
    helppackage: bool = false, Gflags Bool, HONOURED,
        "show help on all modules in the main package";
    helpxml: bool = false, Gflags Bool, HONOURED,
        "produce an xml version of help";
    helpmatch: String = "", Gflags String, HONOURED,
        "show help on modules whose name contains the specified substr";
    helpon: String = "", Gflags String, HONOURED,
        "show help on the modules named by this flag value";
    version: bool = false, Gflags Bool, HONOURED,
        "show version and build info and exit";
    tab_completion_word: String = "", Gflags String, Status::Refused(COMPLETION),
        "If non-empty, HandleCommandLineCompletions() will hijack the process and attempt to do bash-style command line flag completion on this value.";
    tab_completion_columns: i32 = 80, Gflags Int32, Status::Inert(COMPLETION),
        "Number of columns to use in output for tab completion";

    // ---- glog's flags -------------------------------------------------------------------------------
    minloglevel: i32 = 0, Glog Int32, HONOURED,
        "Messages logged at a lower level than this don't actually get logged anywhere";
    v: i32 = 0, Glog Int32, HONOURED,
        "Show all VLOG(m) messages for m <= this. Overridable by --vmodule.";
    vmodule: String = "", Glog String, Status::Inert(GLOG),
        "per-module verbose level. Argument is a comma-separated list of <module name>=<log level>. <module name> is a glob pattern, matched against the filename base (that is, name ignoring .cc/.h./-inl.h). <log level> overrides any value given by --v.";
    logtostderr: bool = false, Glog Bool, Status::Inert(GLOG),
        "log messages go to stderr instead of logfiles";
    alsologtostderr: bool = false, Glog Bool, Status::Inert(GLOG),
        "log messages go to stderr in addition to logfiles";
    colorlogtostderr: bool = false, Glog Bool, Status::Inert(GLOG),
        "color messages logged to stderr (if supported by terminal)";
    stderrthreshold: i32 = 2, Glog Int32, Status::Inert(GLOG),
        "log messages at or above this level are copied to stderr in addition to logfiles.  This flag obsoletes --alsologtostderr.";
    log_dir: String = "", Glog String, Status::Inert(GLOG),
        "If specified, logfiles are written into this directory instead of the default logging directory.";
    log_link: String = "", Glog String, Status::Inert(GLOG),
        "Put additional links to the log files in this directory";
    log_prefix: bool = true, Glog Bool, Status::Inert(GLOG),
        "Prepend the log prefix to the start of each log line";
    log_backtrace_at: String = "", Glog String, Status::Inert(GLOG),
        "Emit a backtrace when logging at file:linenum.";
    logbuflevel: i32 = 0, Glog Int32, Status::Inert(GLOG),
        "Buffer log messages logged at this level or lower (-1 means don't buffer; 0 means buffer INFO only; ...)";
    logbufsecs: i32 = 30, Glog Int32, Status::Inert(GLOG),
        "Buffer log messages for at most this many seconds";
    logfile_mode: i32 = 436, Glog Int32, Status::Inert(GLOG),
        "Log file mode/permissions.";
    max_log_size: i32 = 1800, Glog Int32, Status::Inert(GLOG),
        "approx. maximum log file size (in MB). A value of 0 will be silently overridden to 1.";
    stop_logging_if_full_disk: bool = false, Glog Bool, Status::Inert(GLOG),
        "Stop attempting to log to disk if the disk is full.";
    drop_log_memory: bool = true, Glog Bool, Status::Inert(GLOG),
        "Drop in-memory buffers of log contents. Logs can grow very quickly and they are rarely read before they need to be evicted from memory. Instead, drop them from memory as soon as they are flushed to disk.";
    alsologtoemail: String = "", Glog String, Status::Inert(GLOG),
        "log messages go to these email addresses in addition to logfiles";
    logemaillevel: i32 = 999, Glog Int32, Status::Inert(GLOG),
        "Email log messages logged at this level or higher (0 means email all; 3 means email FATAL only; ...)";
    logmailer: String = "/bin/mail", Glog String, Status::Inert(GLOG),
        "Mailer used to send logging email";
    symbolize_stacktrace: bool = true, Glog Bool, Status::Inert(GLOG),
        "Symbolize the stack trace in the tombstone";
}

/// Durations and addresses resolved from a validated [`MasterConfig`].
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedConfig {
    pub rpc_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub metadata_addr: Option<SocketAddr>,
    pub rpc_threads: usize,
    pub default_kv_lease_ttl_ms: u64,
    pub default_kv_soft_pin_ttl_ms: u64,
    pub max_kv_soft_pin_ttl_ms: u64,
    /// The start-up warning line: flags given without effect, config keys that are not flags.
    pub notice: Option<String>,
    /// Where and when snapshots are taken and restored.
    pub snapshot: SnapshotSettings,
    /// The shared token read from `--auth_token_file` (`None`: no authentication).
    pub auth_token: Option<AuthToken>,
    /// `--enable_oplog`: where the op-log goes and how writes are acknowledged.
    pub oplog: Option<OpLogSettings>,
}

/// How a mutation's reply relates to its op-log batch (`--oplog_ack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpLogAck {
    /// Every acknowledged mutation replies once its batch is durable.
    Durable,
    /// Replies at once; calls that hand out space still wait (docs/oplog.md).
    Visible,
}

/// The op-log settings resolved from the flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpLogSettings {
    /// etcd client URLs.
    pub endpoints: Vec<String>,
    /// `--cluster_id`: the op-log's key prefix in etcd.
    pub cluster_id: String,
    pub ack: OpLogAck,
    pub ack_timeout: std::time::Duration,
    /// `--enable_ha`: masters elect a leader in etcd; the others are hot standbys.
    pub ha: bool,
}

impl ResolvedConfig {
    /// The start-up warning for every listener bound to a non-loopback address while no token
    /// is configured (`None` when there is nothing to warn about): one line.
    pub fn exposure_warning(&self) -> Option<String> {
        if self.auth_token.is_some() {
            return None;
        }
        let exposed: Vec<String> = [
            ("rpc", Some(self.rpc_addr)),
            ("metrics/admin http", Some(self.metrics_addr)),
            ("metadata http", self.metadata_addr),
        ]
        .into_iter()
        .filter_map(|(what, addr)| addr.map(|addr| (what, addr)))
        .filter(|(_, addr)| !addr.ip().is_loopback())
        .map(|(what, addr)| format!("{what} {addr}"))
        .collect();
        (!exposed.is_empty()).then(|| {
            format!(
                "warning: listening on a non-loopback address without --auth_token_file ({}): \
                 anyone who reaches it can read, overwrite and remove every object \
                 (docs/security.md)",
                exposed.join(", ")
            )
        })
    }
}

/// The environment variable upstream reads for its local snapshot directory.
pub const SNAPSHOT_DIR_ENV: &str = "MOONCAKE_SNAPSHOT_LOCAL_PATH";

/// Snapshot settings resolved from the flags and the environment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotSettings {
    /// `--snapshot_dir`, else `$MOONCAKE_SNAPSHOT_LOCAL_PATH`; `None` when neither is set (no
    /// snapshot can be taken or restored).
    pub dir: Option<PathBuf>,
    /// The period of snapshots (`--enable_snapshot`), also taken once more at SIGTERM/SIGINT.
    pub periodic: Option<std::time::Duration>,
    /// How many snapshot files to keep.
    pub retention: usize,
    /// Restore the newest snapshot that verifies before serving.
    pub restore: bool,
    /// Refuse to start when restore finds no snapshot that verifies.
    pub required: bool,
}

/// Allocation strategies of upstream that need a feature we do not build.
const STRATEGIES_NOT_BUILT: &[(&str, &str)] = &[("cxl", CXL), ("ssd_free_ratio_first", OFFLOAD)];

impl MasterConfig {
    /// Parses the command line (program name first), reads `--config_path` if given, and
    /// validates. Command-line flags override the file. `--help`/`--version` come back as
    /// [`ConfigError::Help`].
    pub fn load<I, S>(args: I) -> Result<(MasterConfig, ResolvedConfig), ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let args: Vec<String> = args.into_iter().map(Into::into).collect();
        let command_line = parse_command_line(&args)?;
        if let Some(text) = command_line.print {
            return Err(ConfigError::Help(text));
        }
        let mut config = command_line.config;
        let mut given: BTreeSet<&'static str> = command_line.given;
        let file = if config.config_path.is_empty() {
            None
        } else {
            let path = PathBuf::from(&config.config_path);
            let values = read_config_file(&path)?;
            let applied = apply_file(&mut config, &path, &values, &given)?;
            given.extend(applied);
            Some((path, values))
        };
        let mut resolved = config.validate()?;
        resolved.notice = notice(&config, &given, file.as_ref().map(|(p, v)| (p, v)));
        Ok((config, resolved))
    }

    /// The `tracing` filter glog's `--minloglevel` and `--v` ask for (0 INFO, 1 WARNING, 2 ERROR,
    /// 3 FATAL; `--v` ≥ 1 adds debug, ≥ 2 trace). `MOONCAKE_LOG` overrides it.
    pub fn log_filter(&self) -> &'static str {
        match (self.minloglevel, self.v) {
            (i32::MIN..=0, 2..) => "trace",
            (i32::MIN..=0, 1) => "debug",
            (i32::MIN..=0, _) => "info",
            (1, _) => "warn",
            _ => "error",
        }
    }

    /// Lines for the flags that ask for a feature mooncake-rs does not build.
    fn unsupported(&self) -> Vec<String> {
        let mut lines: Vec<String> = FLAGS
            .iter()
            .filter_map(|f| match f.status {
                Status::Refused(feature) if !self.is_default(f.name) => Some(format!(
                    "--{}={}: not supported by mooncake-rs ({feature})",
                    f.name,
                    self.value_text(f.name).unwrap_or_default()
                )),
                _ => None,
            })
            .collect();
        if !self.rpc_enable_tcp_no_delay {
            lines.push(format!(
                "--rpc_enable_tcp_no_delay=false: not supported by mooncake-rs ({NO_DELAY_OFF}; \
                 TCP_NODELAY is always on)"
            ));
        }
        for (flag, value) in [
            (
                "snapshot_object_store_type",
                &self.snapshot_object_store_type,
            ),
            (
                "snapshot_payload_store_type",
                &self.snapshot_payload_store_type,
            ),
            (
                "snapshot_payload_backend_type",
                &self.snapshot_payload_backend_type,
            ),
        ] {
            if !["", "local"].contains(&value.as_str()) {
                lines.push(format!(
                    "--{flag}={value}: not supported by mooncake-rs ({SNAPSHOT_STORES}; \
                     snapshots are files in --snapshot_dir)"
                ));
            }
        }
        for (flag, value) in [
            (
                "snapshot_catalog_store_type",
                &self.snapshot_catalog_store_type,
            ),
            (
                "snapshot_catalog_backend_type",
                &self.snapshot_catalog_backend_type,
            ),
        ] {
            if !["", "embedded", "payload"].contains(&value.as_str()) {
                lines.push(format!(
                    "--{flag}={value}: not supported by mooncake-rs ({SNAPSHOT_STORES}; \
                     the file names in --snapshot_dir are the catalog)"
                ));
            }
        }
        if let Some((_, feature)) = STRATEGIES_NOT_BUILT
            .iter()
            .find(|(s, _)| *s == self.allocation_strategy)
        {
            lines.push(format!(
                "--allocation_strategy={}: not supported by mooncake-rs ({feature})",
                self.allocation_strategy
            ));
        }
        lines
    }

    /// Checks every value; returns the resolved addresses and durations.
    pub fn validate(&self) -> Result<ResolvedConfig, ConfigError> {
        let unsupported = self.unsupported();
        if !unsupported.is_empty() {
            return Err(ConfigError::Unsupported(unsupported));
        }
        let invalid = |flag: &'static str, message: String| ConfigError::Invalid { flag, message };
        let duration = |flag: &'static str, text: &str| {
            parse_duration_ms(text).map_err(|e| invalid(flag, e.to_string()))
        };
        let default_kv_lease_ttl_ms = duration("default_kv_lease_ttl", &self.default_kv_lease_ttl)?;
        let default_kv_soft_pin_ttl_ms =
            duration("default_kv_soft_pin_ttl", &self.default_kv_soft_pin_ttl)?;
        let max_kv_soft_pin_ttl_ms = duration("max_kv_soft_pin_ttl", &self.max_kv_soft_pin_ttl)?;
        if default_kv_lease_ttl_ms == 0 {
            return Err(invalid("default_kv_lease_ttl", "must be positive".into()));
        }
        if default_kv_soft_pin_ttl_ms > max_kv_soft_pin_ttl_ms {
            return Err(invalid(
                "default_kv_soft_pin_ttl",
                format!("{default_kv_soft_pin_ttl_ms} ms exceeds max_kv_soft_pin_ttl ({max_kv_soft_pin_ttl_ms} ms)"),
            ));
        }
        if !(0.0..=1.0).contains(&self.eviction_ratio) {
            return Err(invalid(
                "eviction_ratio",
                format!("{} is not in [0, 1]", self.eviction_ratio),
            ));
        }
        if !(self.eviction_high_watermark_ratio > 0.0 && self.eviction_high_watermark_ratio <= 1.0)
        {
            return Err(invalid(
                "eviction_high_watermark_ratio",
                format!("{} is not in (0, 1]", self.eviction_high_watermark_ratio),
            ));
        }
        if self.client_ttl == 0 {
            return Err(invalid("client_ttl", "must be at least 1 second".into()));
        }
        if self.put_start_release_timeout_sec <= self.put_start_discard_timeout_sec {
            return Err(invalid(
                "put_start_release_timeout_sec",
                format!(
                    "{} must be greater than put_start_discard_timeout_sec ({})",
                    self.put_start_release_timeout_sec, self.put_start_discard_timeout_sec
                ),
            ));
        }
        match self.memory_allocator.as_str() {
            "offset" => {}
            "cachelib" => {
                return Err(invalid(
                    "memory_allocator",
                    "cachelib is deprecated upstream and not implemented; use offset".into(),
                ))
            }
            other => {
                return Err(invalid(
                    "memory_allocator",
                    format!("unknown allocator {other:?} (offset)"),
                ))
            }
        }
        if !["random", "free_ratio_first", "local_first"]
            .contains(&self.allocation_strategy.as_str())
        {
            return Err(invalid(
                "allocation_strategy",
                format!(
                    "unknown strategy {:?} (random, free_ratio_first, local_first)",
                    self.allocation_strategy
                ),
            ));
        }
        if let Err(message) = self
            .dynamic_replication_mode
            .parse::<mooncake_master::DynamicReplicationMode>()
        {
            return Err(invalid("dynamic_replication_mode", message));
        }
        if self.dynamic_replication_heat_window_seconds == 0 {
            return Err(invalid(
                "dynamic_replication_heat_window_seconds",
                "must be at least 1 second".into(),
            ));
        }
        let qps = self.dynamic_replication_admission_qps_threshold;
        if !(qps.is_finite() && qps > 0.0) {
            return Err(invalid(
                "dynamic_replication_admission_qps_threshold",
                format!("{qps} is not a positive number"),
            ));
        }
        if self.tenant_quota_connector_type != "file" {
            return Err(invalid(
                "tenant_quota_connector_type",
                format!(
                    "unknown connector {:?} (file)",
                    self.tenant_quota_connector_type
                ),
            ));
        }
        if self.rpc_max_connections == 0 {
            return Err(invalid("rpc_max_connections", "must be at least 1".into()));
        }
        self.validate_connection_limits()?;
        let ip = |flag: &'static str, text: &str| {
            text.parse::<IpAddr>()
                .map_err(|_| invalid(flag, format!("{text:?} is not an IP address")))
        };
        let rpc_port = if self.rpc_port != 0 {
            self.rpc_port
        } else {
            self.port
        };
        let rpc_addr = SocketAddr::new(ip("rpc_address", &self.rpc_address)?, rpc_port);
        let metrics_addr =
            SocketAddr::new(ip("metrics_host", &self.metrics_host)?, self.metrics_port);
        let metadata_addr = if self.enable_http_metadata_server {
            Some(SocketAddr::new(
                ip("http_metadata_server_host", &self.http_metadata_server_host)?,
                self.http_metadata_server_port,
            ))
        } else {
            None
        };
        // Upstream: rpc_thread_num, else max_threads capped at the core count.
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let rpc_threads = match (self.rpc_thread_num, self.max_threads) {
            (0, 0) => cores,
            (0, max) => max.min(cores),
            (n, _) => n,
        };
        let snapshot = self.snapshot_settings(std::env::var_os(SNAPSHOT_DIR_ENV))?;
        let auth_token = if self.auth_token_file.is_empty() {
            None
        } else {
            let path = std::path::Path::new(&self.auth_token_file);
            let bytes = std::fs::read(path).map_err(|error| {
                invalid(
                    "auth_token_file",
                    format!("cannot read {}: {error}", path.display()),
                )
            })?;
            Some(AuthToken::from_bytes(&bytes).map_err(|error| {
                invalid("auth_token_file", format!("{}: {error}", path.display()))
            })?)
        };
        Ok(ResolvedConfig {
            rpc_addr,
            metrics_addr,
            metadata_addr,
            rpc_threads,
            default_kv_lease_ttl_ms,
            default_kv_soft_pin_ttl_ms,
            max_kv_soft_pin_ttl_ms,
            notice: None,
            snapshot,
            auth_token,
            oplog: self.oplog_settings()?,
        })
    }

    /// The op-log settings (`None` without `--enable_oplog`).
    pub fn oplog_settings(&self) -> Result<Option<OpLogSettings>, ConfigError> {
        let invalid = |flag: &'static str, message: String| ConfigError::Invalid { flag, message };
        let ack = match self.oplog_ack.as_str() {
            "durable" => OpLogAck::Durable,
            "visible" => OpLogAck::Visible,
            other => {
                return Err(invalid(
                    "oplog_ack",
                    format!("unknown mode {other:?} (durable, visible)"),
                ))
            }
        };
        if !self.enable_oplog && !self.enable_ha {
            return Ok(None);
        }
        if self.ha_backend_type != "etcd" {
            return Err(invalid(
                "ha_backend_type",
                format!(
                    "{:?}: the op-log is kept in etcd only",
                    self.ha_backend_type
                ),
            ));
        }
        let conn = if self.ha_backend_connstring.is_empty() {
            &self.etcd_endpoints
        } else {
            &self.ha_backend_connstring
        };
        let endpoints = mooncake_oplog::etcd::parse_endpoints(conn);
        if endpoints.is_empty() {
            return Err(invalid(
                "enable_oplog",
                "needs etcd: give --etcd_endpoints or --ha_backend_connstring".into(),
            ));
        }
        let id_ok = !self.cluster_id.is_empty()
            && self.cluster_id.len() <= 128
            && self
                .cluster_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !id_ok {
            return Err(invalid(
                "cluster_id",
                "1 to 128 characters of [A-Za-z0-9_.-] with --enable_oplog".into(),
            ));
        }
        // Bounded: a reply waits this long on a deadline computed from now.
        if self.oplog_ack_timeout_ms == 0 || self.oplog_ack_timeout_ms > MAX_OPLOG_ACK_TIMEOUT_MS {
            return Err(invalid(
                "oplog_ack_timeout_ms",
                format!("must be 1 to {MAX_OPLOG_ACK_TIMEOUT_MS}"),
            ));
        }
        Ok(Some(OpLogSettings {
            endpoints,
            cluster_id: self.cluster_id.clone(),
            ack,
            ack_timeout: std::time::Duration::from_millis(self.oplog_ack_timeout_ms),
            ha: self.enable_ha,
        }))
    }

    /// The snapshot settings; `env_dir` is `$MOONCAKE_SNAPSHOT_LOCAL_PATH`.
    pub fn snapshot_settings(
        &self,
        env_dir: Option<std::ffi::OsString>,
    ) -> Result<SnapshotSettings, ConfigError> {
        let invalid = |flag: &'static str, message: String| ConfigError::Invalid { flag, message };
        let dir = if !self.snapshot_dir.is_empty() {
            Some(PathBuf::from(&self.snapshot_dir))
        } else {
            env_dir.filter(|d| !d.is_empty()).map(PathBuf::from)
        };
        for (flag, on) in [
            ("enable_snapshot", self.enable_snapshot),
            ("enable_snapshot_restore", self.enable_snapshot_restore),
        ] {
            if on && dir.is_none() {
                return Err(invalid(
                    flag,
                    format!(
                        "needs a snapshot directory: give --snapshot_dir=DIR or set \
                         {SNAPSHOT_DIR_ENV}"
                    ),
                ));
            }
        }
        if self.enable_snapshot && self.snapshot_interval_seconds == 0 {
            return Err(invalid(
                "snapshot_interval_seconds",
                "must be at least 1 second".into(),
            ));
        }
        if self.snapshot_retention_count == 0 {
            return Err(invalid(
                "snapshot_retention_count",
                "must be at least 1".into(),
            ));
        }
        if self.snapshot_required && !self.enable_snapshot_restore {
            return Err(invalid(
                "snapshot_required",
                "needs --enable_snapshot_restore".into(),
            ));
        }
        Ok(SnapshotSettings {
            dir,
            periodic: self
                .enable_snapshot
                .then(|| std::time::Duration::from_secs(self.snapshot_interval_seconds)),
            retention: self.snapshot_retention_count as usize,
            restore: self.enable_snapshot_restore,
            required: self.snapshot_required,
        })
    }
}

impl MasterConfig {
    /// The limits against idle, slow and hostile peers.
    fn validate_connection_limits(&self) -> Result<(), ConfigError> {
        let invalid = |flag: &'static str, message: String| ConfigError::Invalid { flag, message };
        if self.rpc_max_connections_per_address == 0 {
            return Err(invalid(
                "rpc_max_connections_per_address",
                "must be at least 1".into(),
            ));
        }
        if self.rpc_frame_timeout_seconds == 0 {
            return Err(invalid(
                "rpc_frame_timeout_seconds",
                "must be at least 1 second".into(),
            ));
        }
        if self.rpc_min_request_bytes_per_second == 0 {
            return Err(invalid(
                "rpc_min_request_bytes_per_second",
                "must be at least 1".into(),
            ));
        }
        let frame_limit = mooncake_proto::DEFAULT_MAX_FRAME_BYTES as u64;
        if self.rpc_max_buffered_request_bytes < frame_limit {
            return Err(invalid(
                "rpc_max_buffered_request_bytes",
                format!(
                    "{} is below the {frame_limit}-byte frame limit (one frame must fit)",
                    self.rpc_max_buffered_request_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// Largest `--oplog_ack_timeout_ms` (one hour).
const MAX_OPLOG_ACK_TIMEOUT_MS: u64 = 3_600_000;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn load(args: &[&str]) -> Result<(MasterConfig, ResolvedConfig), ConfigError> {
        let mut all = vec!["mooncake-master"];
        all.extend_from_slice(args);
        MasterConfig::load(all)
    }

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let dir = std::env::temp_dir().join(format!("mc-config-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
        fn file(&self, name: &str, text: &str) -> String {
            let path = self.0.join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn defaults_are_upstreams_except_loopback_binds() {
        let (config, resolved) = load(&[]).unwrap();
        // Loopback unless told otherwise (upstream binds 0.0.0.0).
        assert_eq!(resolved.rpc_addr, "127.0.0.1:50051".parse().unwrap());
        assert_eq!(resolved.metrics_addr, "127.0.0.1:9003".parse().unwrap());
        assert_eq!(resolved.auth_token, None);
        assert_eq!(resolved.exposure_warning(), None);
        assert_eq!(resolved.default_kv_lease_ttl_ms, 10_000);
        assert_eq!(resolved.default_kv_soft_pin_ttl_ms, 1_800_000);
        assert_eq!(resolved.max_kv_soft_pin_ttl_ms, 86_400_000);
        assert_eq!(config.eviction_ratio, 0.05);
        assert_eq!(config.eviction_high_watermark_ratio, 0.90);
        assert_eq!(config.client_ttl, 10);
        assert_eq!(config.put_start_discard_timeout_sec, 30);
        assert_eq!(config.put_start_release_timeout_sec, 600);
        assert!(config.allow_evict_soft_pinned_objects);
        assert!(!config.enable_multi_tenants);
        assert_eq!(config.allocation_strategy, "random");
        assert_eq!(config.max_threads, 16);
        assert_eq!(resolved.metadata_addr, None);
        assert_eq!(resolved.notice, None);
        assert_eq!(config, MasterConfig::default());
    }

    #[test]
    fn every_table_default_parses_back_to_the_typed_default() {
        let defaults = MasterConfig::default();
        let mut names = BTreeSet::new();
        for f in FLAGS {
            assert!(names.insert(f.name), "{} is in the table twice", f.name);
            for alias in f.aliases {
                assert!(names.insert(alias), "alias {alias} is taken");
            }
            let mut c = MasterConfig::default();
            c.set_text(f.name, f.default_text()).unwrap();
            assert_eq!(c, defaults, "default of {} does not round-trip", f.name);
            assert!(defaults.is_default(f.name));
            assert!(find_flag(f.name).is_some_and(|found| found.name == f.name));
        }
        let count = |o: Origin| FLAGS.iter().filter(|f| f.origin == o).count();
        assert_eq!(count(Origin::Master), 99, "mooncake_master's own flags");
        assert_eq!(
            count(Origin::Gflags) + count(Origin::Glog),
            35,
            "gflags' and glog's"
        );
    }

    #[test]
    fn gflags_forms_and_spellings_are_accepted() {
        let (config, resolved) = load(&[
            "--rpc-port=6000",
            "-metrics_port",
            "7000",
            "--default-kv-lease-ttl",
            "5s",
            "--enable_multi_tenants",
            "--noallow_evict_soft_pinned_objects",
            "--client_live_ttl_sec=60",
            "-enable_http_metadata_server=yes",
            "--config_path=",
        ])
        .unwrap();
        assert_eq!(resolved.rpc_addr.port(), 6000);
        assert_eq!(resolved.metrics_addr.port(), 7000);
        assert_eq!(resolved.default_kv_lease_ttl_ms, 5000);
        assert!(config.enable_multi_tenants);
        assert!(!config.allow_evict_soft_pinned_objects);
        assert!(config.enable_http_metadata_server);
        assert_eq!(config.client_ttl, 60);
        // The last value wins, as in gflags.
        let (config, _) = load(&["--client_ttl=5", "--client_ttl", "7"]).unwrap();
        assert_eq!(config.client_ttl, 7);
        // Negative values after a space are values, not flags.
        let (config, _) = load(&["--logbuflevel", "-1"]).unwrap();
        assert_eq!(config.logbuflevel, -1);
    }

    #[test]
    fn a_non_default_flag_of_a_feature_not_built_is_refused_naming_it() {
        let err = load(&["--enable_kv_events=true"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--enable_kv_events=true: not supported by mooncake-rs (KV cache events)"
        );
        assert_eq!(err.exit_code(), 2);
        let err = load(&["--enable_kv_events", "--root_fs_dir=/mnt/3fs"]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("--enable_kv_events=true: not supported by mooncake-rs"),
            "{text}"
        );
        assert!(
            text.contains("--root_fs_dir=/mnt/3fs: not supported"),
            "{text}"
        );
        let err = load(&["--allocation_strategy=cxl"]).unwrap_err();
        assert!(err.to_string().contains("CXL memory"), "{err}");
        let err = load(&["--rpc_enable_tcp_no_delay=false"]).unwrap_err();
        assert!(
            err.to_string().contains("TCP_NODELAY is always on"),
            "{err}"
        );
        let err = load(&["--rpc_interface=eth0"]).unwrap_err();
        assert!(err.to_string().contains("--rpc_interface=eth0"), "{err}");
    }

    #[test]
    fn oplog_flags_resolve_to_endpoints_and_an_ack_mode_and_bad_combinations_are_refused() {
        let (_, resolved) = load(&[]).unwrap();
        assert_eq!(resolved.oplog, None);
        let (_, resolved) = load(&[
            "--enable_oplog",
            "--etcd_endpoints=127.0.0.1:2379;http://h2:2379",
            "--cluster_id=c-1.x",
        ])
        .unwrap();
        let oplog = resolved.oplog.unwrap();
        assert_eq!(oplog.endpoints, ["http://127.0.0.1:2379", "http://h2:2379"]);
        assert_eq!(oplog.ack, OpLogAck::Durable);
        assert_eq!(oplog.cluster_id, "c-1.x");
        let (_, resolved) = load(&[
            "--enable_oplog",
            "--etcd_endpoints=a:1",
            "--ha_backend_connstring=etcd://b:2,c:3",
            "--oplog_ack=visible",
        ])
        .unwrap();
        let oplog = resolved.oplog.unwrap();
        assert_eq!(
            oplog.endpoints,
            ["http://b:2", "http://c:3"],
            "the connstring wins"
        );
        assert_eq!(oplog.ack, OpLogAck::Visible);
        assert!(!oplog.ha);
        // Snapshots and their restore go with the op-log (a start loads the newest snapshot
        // of the log and follows the log after it).
        let (_, resolved) = load(&[
            "--enable_oplog",
            "--etcd_endpoints=a:1",
            "--enable_snapshot_restore",
            "--snapshot_dir=/tmp",
        ])
        .unwrap();
        assert!(resolved.oplog.is_some() && resolved.snapshot.restore);
        // --enable_ha implies the op-log (its standbys replay it).
        let (_, resolved) = load(&["--enable_ha", "--etcd_endpoints=a:1"]).unwrap();
        let oplog = resolved.oplog.unwrap();
        assert!(oplog.ha);
        assert_eq!(oplog.cluster_id, "mooncake_cluster");
        for (args, flag) in [
            (&["--enable_ha"][..], "enable_oplog"),
            (&["--enable_oplog"][..], "enable_oplog"),
            (&["--oplog_ack=sometimes"][..], "oplog_ack"),
            (
                &[
                    "--enable_oplog",
                    "--etcd_endpoints=a:1",
                    "--ha_backend_type=redis",
                ][..],
                "ha_backend_type",
            ),
            (
                &["--enable_oplog", "--etcd_endpoints=a:1", "--cluster_id=a/b"][..],
                "cluster_id",
            ),
            (
                &[
                    "--enable_oplog",
                    "--etcd_endpoints=a:1",
                    "--oplog_ack_timeout_ms=18446744073709551615",
                ][..],
                "oplog_ack_timeout_ms",
            ),
            (
                &[
                    "--enable_oplog",
                    "--etcd_endpoints=a:1",
                    "--oplog_ack_timeout_ms=0",
                ][..],
                "oplog_ack_timeout_ms",
            ),
        ] {
            let err = load(args).unwrap_err();
            assert!(
                matches!(&err, ConfigError::Invalid { flag: f, .. } if *f == flag),
                "{args:?}: {err}"
            );
        }
    }

    #[test]
    fn flags_of_features_not_built_at_their_defaults_are_accepted_with_one_warning() {
        let (_, resolved) = load(&[
            "--enable_ha=false",
            "--pod_name=p1",
            "--snapshot_child_timeout_seconds=300",
            "--logtostderr",
        ])
        .unwrap();
        let notice = resolved.notice.unwrap();
        assert!(!notice.contains('\n'), "one line: {notice}");
        for part in [
            "high availability (HA): pod_name=\"p1\"",
            "snapshot child process (snapshots are written in-process): snapshot_child_timeout_seconds",
            "logtostderr=\"true\"",
        ] {
            assert!(notice.contains(part), "{part} missing in {notice}");
        }
        // Honoured flags are not in it.
        let (_, resolved) = load(&["--rpc_port=7000", "--v=0"]).unwrap();
        assert_eq!(resolved.notice, None);
    }

    #[test]
    fn unknown_flags_and_bad_syntax_are_refused() {
        let err = load(&["--no_such_flag=1"]).unwrap_err();
        assert!(matches!(err, ConfigError::Flags(_)));
        assert!(err.to_string().contains("--no_such_flag"), "{err}");
        assert_eq!(err.exit_code(), 2);
        // gflags' --undefok lets named unknown flags through.
        load(&[
            "--undefok=no_such_flag,other",
            "--no_such_flag=1",
            "--other",
        ])
        .unwrap();
        // Booleans take their value only after '='.
        let err = load(&["--enable_multi_tenants", "false"]).unwrap_err();
        assert!(
            err.to_string().contains("unexpected argument \"false\""),
            "{err}"
        );
        let err = load(&["--rpc_port"]).unwrap_err();
        assert!(
            err.to_string().contains("--rpc_port is missing its value"),
            "{err}"
        );
        assert!(matches!(
            load(&["--rpc_port=70000"]),
            Err(ConfigError::Invalid {
                flag: "rpc_port",
                ..
            })
        ));
        assert!(matches!(
            load(&["--enable_ha=maybe"]),
            Err(ConfigError::Invalid {
                flag: "enable_ha",
                ..
            })
        ));
        let err = load(&["--noenable_ha=1"]).unwrap_err();
        assert!(err.to_string().contains("takes no value"), "{err}");
    }

    #[test]
    fn invalid_values_are_refused_with_the_flag_named() {
        let cases: &[(&[&str], &str)] = &[
            (&["--eviction_ratio=1.5"], "eviction_ratio"),
            (
                &["--eviction_high_watermark_ratio=0"],
                "eviction_high_watermark_ratio",
            ),
            (
                &["--put_start_release_timeout_sec=10"],
                "put_start_release_timeout_sec",
            ),
            (&["--allocation_strategy=best"], "allocation_strategy"),
            (
                &["--dynamic_replication_mode=on"],
                "dynamic_replication_mode",
            ),
            (
                &["--dynamic_replication_heat_window_seconds=0"],
                "dynamic_replication_heat_window_seconds",
            ),
            (
                &["--dynamic_replication_admission_qps_threshold=0"],
                "dynamic_replication_admission_qps_threshold",
            ),
            (&["--memory_allocator=cachelib"], "memory_allocator"),
            (&["--default_kv_lease_ttl=soon"], "default_kv_lease_ttl"),
            (
                &["--default_kv_soft_pin_ttl=2h", "--max_kv_soft_pin_ttl=1h"],
                "default_kv_soft_pin_ttl",
            ),
            (&["--rpc_address=localhost"], "rpc_address"),
            (&["--client_ttl=0"], "client_ttl"),
            (&["--rpc_thread_num=-1"], "rpc_thread_num"),
        ];
        for (args, flag) in cases {
            let err = load(args).unwrap_err();
            assert!(err.to_string().contains(flag), "{args:?} gave {err}");
        }
    }

    #[test]
    fn connection_limits_have_their_documented_defaults_and_are_checked() {
        let (config, _) = load(&[]).unwrap();
        assert_eq!(config.rpc_conn_timeout_seconds, 0);
        assert_eq!(config.rpc_handshake_timeout_seconds, 10);
        assert_eq!(config.rpc_max_connections, 1024);
        assert_eq!(config.rpc_max_connections_per_address, 256);
        assert_eq!(config.rpc_frame_timeout_seconds, 10);
        assert_eq!(config.rpc_min_request_bytes_per_second, 1 << 20);
        assert_eq!(config.rpc_max_buffered_request_bytes, 256 << 20);
        let (config, _) = load(&[
            "--rpc-handshake-timeout-seconds=0",
            "--rpc_conn_timeout_seconds=30",
        ])
        .unwrap();
        assert_eq!(config.rpc_handshake_timeout_seconds, 0);
        assert_eq!(config.rpc_conn_timeout_seconds, 30);
        let cases: &[(&str, &str)] = &[
            (
                "--rpc_max_connections_per_address=0",
                "rpc_max_connections_per_address",
            ),
            ("--rpc_frame_timeout_seconds=0", "rpc_frame_timeout_seconds"),
            (
                "--rpc_min_request_bytes_per_second=0",
                "rpc_min_request_bytes_per_second",
            ),
            (
                "--rpc_max_buffered_request_bytes=1048576",
                "rpc_max_buffered_request_bytes",
            ),
        ];
        for (arg, flag) in cases {
            let err = load(&[arg]).unwrap_err();
            assert!(err.to_string().contains(flag), "{arg} gave {err}");
        }
    }

    #[test]
    fn help_and_version_print_and_exit_zero() {
        for arg in ["--help", "-help", "--helpfull", "-h", "--helpshort"] {
            let err = load(&[arg]).unwrap_err();
            assert_eq!(err.exit_code(), 0, "{arg}");
            let text = err.to_string();
            assert!(text.starts_with("Usage: mooncake master"), "{arg}: {text}");
            assert!(text.contains("--enable_kv_events (bool, default \"false\") [KV cache events]"));
        }
        let text = load(&["--helpmatch=snapshot"]).unwrap_err().to_string();
        assert!(text.contains("--snapshot_interval_seconds") && !text.contains("--rpc_port"));
        let err = load(&["--version"]).unwrap_err();
        assert_eq!(err.exit_code(), 0);
        assert!(err.to_string().contains("mooncake-rs"));
        assert!(load(&["--help=false"]).is_ok());
    }

    #[test]
    fn flagfile_and_environment_give_flags() {
        let dir = TempDir::new("flagfile");
        let inner = dir.file("inner.flags", "--metrics_port=7100\n");
        let outer = dir.file(
            "outer.flags",
            &format!("# a comment\n--rpc_port=6100\n\n--flagfile={inner}\n--client_ttl=3\n"),
        );
        let (config, resolved) = load(&[&format!("--flagfile={outer}"), "--client_ttl=4"]).unwrap();
        assert_eq!(resolved.rpc_addr.port(), 6100);
        assert_eq!(resolved.metrics_addr.port(), 7100);
        assert_eq!(config.client_ttl, 4, "a later command-line flag wins");
        let looping = dir.file("loop.flags", "");
        std::fs::write(&looping, format!("--flagfile={looping}\n")).unwrap();
        let err = load(&[&format!("--flagfile={looping}")]).unwrap_err();
        assert!(err.to_string().contains("nested"), "{err}");
        let bad = dir.file("bad.flags", "rpc_port=1\n");
        let err = load(&[&format!("--flagfile={bad}")]).unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");

        // No other test reads FLAGS_cluster_id.
        std::env::set_var("FLAGS_cluster_id", "from-env-cluster");
        let (config, _) = load(&["--fromenv=cluster_id"]).unwrap();
        assert_eq!(config.cluster_id, "from-env-cluster");
        std::env::remove_var("FLAGS_cluster_id");
        assert!(load(&["--fromenv=cluster_id"]).is_err());
        let (config, _) = load(&["--tryfromenv=cluster_id"]).unwrap();
        assert_eq!(config.cluster_id, "mooncake_cluster");
    }

    #[test]
    fn yaml_and_json_files_apply_and_the_command_line_overrides_them() {
        let dir = TempDir::new("files");
        let yaml = dir.file(
            "master.yaml",
            "rpc_port: 6100\neviction_ratio: 0.1\neviction_high_watermark_ratio: 1.0\n\
             client_live_ttl_sec: 60\nrpc_address: \"127.0.0.1\"\ndefault_kv_lease_ttl: 5000\n\
             enable_ha: false\netcd_endpoints: \"http://localhost:2379\"\n\
             tenant_eviction_high_watermark_ratio: 0.9\nsome:\n  nested: 1\n",
        );
        let (config, resolved) =
            load(&[&format!("--config_path={yaml}"), "--client_ttl=5"]).unwrap();
        assert_eq!(resolved.rpc_addr, "127.0.0.1:6100".parse().unwrap());
        assert_eq!(config.eviction_ratio, 0.1);
        assert_eq!(config.eviction_high_watermark_ratio, 1.0);
        assert_eq!(resolved.default_kv_lease_ttl_ms, 5000);
        assert_eq!(config.client_ttl, 5, "the command line wins over the file");
        let notice = resolved.notice.unwrap();
        assert!(!config.enable_ha);
        assert!(!notice.contains("enable_ha"), "{notice}");
        assert!(
            notice
                .contains("not flags, ignored: tenant_eviction_high_watermark_ratio, some.nested"),
            "{notice}"
        );

        let json = dir.file(
            "master.json",
            r#"{"rpc_port": 6200, "enable_metric_reporting": false, "cluster_id": "c1",
                "max_threads": "4", "eviction_ratio": 0.2}"#,
        );
        let (config, resolved) = load(&["--config", &json, "--rpc_port=6300"]).unwrap();
        assert_eq!(resolved.rpc_addr.port(), 6300);
        assert!(!config.enable_metric_reporting);
        assert_eq!(config.cluster_id, "c1");
        assert_eq!(config.max_threads, 4);
        assert_eq!(config.eviction_ratio, 0.2);

        // A file asking for a feature not built is refused like the flag.
        let events = dir.file("events.yaml", "enable_kv_events: true\n");
        let err = load(&[&format!("--config_path={events}")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("--enable_kv_events=true: not supported"),
            "{err}"
        );
    }

    #[test]
    fn file_errors_name_the_file_and_the_key() {
        let dir = TempDir::new("errors");
        let cases = [
            ("bad-type.yaml", "rpc_port: fifty\n", "key `rpc_port`"),
            (
                "bad-type.json",
                r#"{"eviction_ratio": "lots"}"#,
                "key `eviction_ratio`",
            ),
            (
                "bad-bool.json",
                r#"{"enable_multi_tenants": 3}"#,
                "key `enable_multi_tenants`",
            ),
            ("list.yaml", "cluster_id: [a, b]\n", "key `cluster_id`"),
            ("null.json", r#"{"cluster_id": null}"#, "key `cluster_id`"),
            ("syntax.yaml", "rpc_port: [\n", "invalid YAML"),
            ("syntax.json", "{\"rpc_port\": ", "invalid JSON"),
            (
                "twice.yaml",
                "client_ttl: 1\nclient_live_ttl_sec: 2\n",
                "client_live_ttl_sec",
            ),
            (
                "nested.yaml",
                "config_path: other.yaml\n",
                "key `config_path`",
            ),
            ("top.json", "[1, 2]", "top level"),
            ("unknown.toml", "rpc_portt = 1\n", "key `rpc_portt`"),
            (
                "master.ini",
                "rpc_port=1\n",
                "unsupported config file format",
            ),
        ];
        for (name, text, expected) in cases {
            let path = dir.file(name, text);
            let err = load(&[&format!("--config_path={path}")]).unwrap_err();
            let message = err.to_string();
            assert!(
                matches!(err, ConfigError::Parse { .. }),
                "{name}: not a parse error: {message}"
            );
            assert!(
                message.contains(&path),
                "{name}: file not named in {message}"
            );
            assert!(
                message.contains(expected),
                "{name}: {expected:?} not in {message}"
            );
        }
        let missing = format!("--config_path={}", dir.0.join("nope.yaml").display());
        assert!(matches!(load(&[&missing]), Err(ConfigError::Read { .. })));
    }

    #[test]
    fn toml_files_keep_working() {
        let dir = TempDir::new("toml");
        let path = dir.file(
            "master.toml",
            "rpc_port = 6100\neviction_ratio = 0.1\neviction_high_watermark_ratio = 1.0\nclient_ttl = 60\n",
        );
        let (config, resolved) = load(&[&format!("--config={path}"), "--client_ttl=5"]).unwrap();
        assert_eq!(resolved.rpc_addr.port(), 6100);
        assert_eq!(config.eviction_ratio, 0.1);
        assert_eq!(config.client_ttl, 5);
    }

    #[test]
    fn auth_token_file_is_read_trimmed_and_checked() {
        let dir = TempDir::new("token");
        let good = dir.file("token", "0123456789abcdef0123456789abcdef\n");
        let (_, resolved) = load(&[&format!("--auth_token_file={good}")]).unwrap();
        let token = resolved.auth_token.unwrap();
        assert!(token.verify(b"0123456789abcdef0123456789abcdef"));
        let short = dir.file("short", "secret\n");
        let err = load(&[&format!("--auth_token_file={short}")]).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("auth_token_file") && message.contains("16"),
            "{message}"
        );
        let missing = dir.0.join("missing").display().to_string();
        let err = load(&[&format!("--auth_token_file={missing}")]).unwrap_err();
        assert!(err.to_string().contains(&missing), "{err}");
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn exposure_warning_names_each_non_loopback_listener_without_a_token() {
        let (_, resolved) = load(&["--rpc_address=0.0.0.0"]).unwrap();
        let warning = resolved.exposure_warning().unwrap();
        assert!(warning.contains("rpc 0.0.0.0:50051"), "{warning}");
        assert!(!warning.contains("metrics"), "{warning}");
        assert!(!warning.contains('\n'), "one line: {warning}");
        let (_, resolved) = load(&[
            "--metrics_host=::",
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=10.1.2.3",
        ])
        .unwrap();
        let warning = resolved.exposure_warning().unwrap();
        assert!(
            warning.contains("metrics/admin http [::]:9003")
                && warning.contains("metadata http 10.1.2.3:8080")
                && !warning.contains("rpc "),
            "{warning}"
        );
        for loopback in [
            "--rpc_address=127.0.0.1",
            "--rpc_address=::1",
            "--rpc_address=127.0.0.2",
        ] {
            assert_eq!(
                load(&[loopback]).unwrap().1.exposure_warning(),
                None,
                "{loopback}"
            );
        }
        let dir = TempDir::new("token-warning");
        let token = dir.file("token", "0123456789abcdef0123456789abcdef");
        let (_, resolved) = load(&[
            "--rpc_address=0.0.0.0",
            &format!("--auth_token_file={token}"),
        ])
        .unwrap();
        assert_eq!(resolved.exposure_warning(), None, "a token silences it");
    }

    #[test]
    fn glog_levels_choose_the_log_filter() {
        let filter = |args: &[&str]| load(args).unwrap().0.log_filter();
        assert_eq!(filter(&[]), "info");
        assert_eq!(filter(&["--minloglevel=1"]), "warn");
        assert_eq!(filter(&["--minloglevel=2"]), "error");
        assert_eq!(filter(&["--v=1"]), "debug");
        assert_eq!(filter(&["--v=3"]), "trace");
    }

    /// `MC_WRITE_DOCS=1 cargo test -p mooncake-server docs_carry` rewrites the doc's table.
    #[test]
    fn docs_carry_the_flag_table() {
        const BEGIN: &str = "<!-- flag table: generated from crates/server/src/config.rs -->\n";
        const END: &str = "<!-- end of flag table -->";
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/master-server.md");
        let doc = std::fs::read_to_string(&path).unwrap();
        let start = doc.find(BEGIN).expect("begin marker") + BEGIN.len();
        let end = doc.find(END).expect("end marker");
        let table = flag_table_markdown();
        if std::env::var_os("MC_WRITE_DOCS").is_some() {
            let updated = format!("{}{table}{}", &doc[..start], &doc[end..]);
            std::fs::write(&path, updated).unwrap();
        } else {
            assert_eq!(
                &doc[start..end],
                table,
                "docs/master-server.md's flag table is stale: rerun with MC_WRITE_DOCS=1"
            );
        }
    }

    #[test]
    fn rpc_threads_follow_upstream() {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = |args: &[&str]| load(args).unwrap().1.rpc_threads;
        assert_eq!(threads(&[]), cores.min(16));
        assert_eq!(threads(&["--rpc_thread_num=3"]), 3);
        assert_eq!(threads(&["--max_threads=1"]), 1);
    }
}
