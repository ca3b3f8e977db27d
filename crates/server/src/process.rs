//! Starting and stopping a whole master: the core, the RPC server, the HTTP endpoints and the
//! background workers, all on one tokio runtime.

use mooncake_common::SystemClock;
use mooncake_master::{
    AllocationStrategy, MasterService, MasterServiceConfig, MasterState, RestoreOptions, TaskLimits,
};
use mooncake_proto::Limits;
use mooncake_rpc::{RpcServer, ServerConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::{MasterConfig, ResolvedConfig};
use crate::ha::{supervise, HaContext, HaStatus};
use crate::http::{admin_router, metadata_router, AdminState, MetadataStore};
use crate::metrics::{RpcMetrics, WorkerMetrics};
use crate::oplog::{read_log, OpLogHandle, OpLogSlot};
use crate::rpc_dispatch::MasterRpc;
use crate::snapshot::{LogSnapshots, PeriodicSnapshots, SnapshotMetrics, Snapshotter};

/// Why a master could not start.
#[derive(Debug, Error)]
pub enum StartError {
    #[error("invalid master settings: {0}")]
    Core(#[from] mooncake_master::ConfigError),
    #[error("cannot restore: {0}")]
    Restore(#[from] mooncake_master::RestoreError),
    #[error("cannot load the tenant policy {path}: {message}")]
    TenantPolicy {
        path: std::path::PathBuf,
        message: String,
    },
    #[error("{0}")]
    Snapshot(String),
    #[error("op-log: {0}")]
    OpLog(String),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The core's settings from the process configuration.
pub fn core_config(config: &MasterConfig, resolved: &ResolvedConfig) -> MasterServiceConfig {
    let allocation_strategy = match config.allocation_strategy.as_str() {
        "free_ratio_first" => AllocationStrategy::FreeRatioFirst,
        "local_first" => AllocationStrategy::LocalFirst,
        _ => AllocationStrategy::Random,
    };
    MasterServiceConfig {
        default_kv_lease_ttl_ms: resolved.default_kv_lease_ttl_ms,
        default_kv_soft_pin_ttl_ms: resolved.default_kv_soft_pin_ttl_ms,
        max_kv_soft_pin_ttl_ms: resolved.max_kv_soft_pin_ttl_ms,
        allow_evict_soft_pinned_objects: config.allow_evict_soft_pinned_objects,
        put_start_discard_timeout_sec: config.put_start_discard_timeout_sec,
        put_start_release_timeout_sec: config.put_start_release_timeout_sec,
        allocation_strategy,
        enable_multi_tenants: config.enable_multi_tenants,
        client_live_ttl_sec: config.client_ttl,
        eviction_ratio: config.eviction_ratio,
        eviction_high_watermark_ratio: config.eviction_high_watermark_ratio,
        put_start_evict_budget: config.put_start_evict_budget,
        enable_offload: config.enable_offload,
        offload_on_evict: config.offload_on_evict,
        offloading_queue_limit: config.offloading_queue_limit,
        promotion_on_hit: config.promotion_on_hit,
        promotion_admission_threshold: config.promotion_admission_threshold,
        promotion_queue_limit: config.promotion_queue_limit,
        // validate() has checked the mode.
        dynamic_replication_mode: config.dynamic_replication_mode.parse().unwrap_or_default(),
        dynamic_replication_heat_window_sec: config.dynamic_replication_heat_window_seconds,
        dynamic_replication_admission_qps_threshold: config
            .dynamic_replication_admission_qps_threshold,
        dynamic_replication_max_memory_replicas: config.dynamic_replication_max_memory_replicas,
    }
}

/// The RPC server's limits from the process configuration.
pub fn rpc_server_config(config: &MasterConfig) -> ServerConfig {
    let seconds = |s: u64| (s > 0).then(|| Duration::from_secs(s));
    ServerConfig {
        max_connections: config.rpc_max_connections,
        max_connections_per_address: config.rpc_max_connections_per_address,
        max_request_frame_bytes: Some(mooncake_proto::max_request_frame_bytes),
        busy_poll: (config.busy_poll_us > 0).then(|| Duration::from_micros(config.busy_poll_us)),
        idle_timeout: seconds(config.rpc_conn_timeout_seconds),
        handshake_timeout: seconds(config.rpc_handshake_timeout_seconds),
        frame_timeout: Duration::from_secs(config.rpc_frame_timeout_seconds),
        min_request_bytes_per_sec: config.rpc_min_request_bytes_per_second,
        max_buffered_request_bytes: usize::try_from(config.rpc_max_buffered_request_bytes)
            .unwrap_or(usize::MAX),
        ..ServerConfig::default()
    }
}

/// The copy/move task queue's limits from the process configuration (0 s = no timeout).
pub fn task_limits(config: &MasterConfig) -> TaskLimits {
    let timeout_ms = |sec: u64| match sec {
        0 => u64::MAX,
        s => s.saturating_mul(1000),
    };
    TaskLimits {
        max_pending: config.max_total_pending_tasks as usize,
        max_processing: config.max_total_processing_tasks as usize,
        max_finished: config.max_total_finished_tasks as usize,
        pending_timeout_ms: timeout_ms(config.pending_task_timeout_sec),
        processing_timeout_ms: timeout_ms(config.processing_task_timeout_sec),
        max_retry_attempts: config.max_retry_attempts,
    }
}

/// A running master. Stop it with [`RunningMaster::shutdown`].
#[derive(Debug)]
pub struct RunningMaster {
    master: Arc<MasterService>,
    rpc: RpcServer,
    rpc_addr: SocketAddr,
    metrics_addr: SocketAddr,
    metadata_addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    snapshotter: Option<Arc<Snapshotter>>,
    periodic: Option<PeriodicSnapshots>,
    final_snapshot: bool,
    oplog: Arc<OpLogSlot>,
}

/// Longest wait at shutdown for the op-log's last entries to become durable.
const OPLOG_DRAIN_AT_SHUTDOWN: Duration = Duration::from_secs(10);
/// How often each background step runs.
const PUT_TIMEOUT_PERIOD: Duration = Duration::from_secs(1);
const SOFT_PIN_EXPIRY_PERIOD: Duration = Duration::from_secs(1);
const GRACEFUL_UNMOUNT_PERIOD: Duration = Duration::from_millis(200);
/// Upstream's eviction loop period.
const EVICTION_PERIOD: Duration = Duration::from_millis(10);
/// Upstream's client monitor period.
const CLIENT_MONITOR_PERIOD: Duration = Duration::from_secs(1);
/// Task pruning and timeouts (upstream: 30 s, together with soft-pin expiry).
const TASK_CLEANUP_PERIOD: Duration = Duration::from_secs(1);
/// Drain jobs follow their tasks and plan again this often.
const DRAIN_JOB_PERIOD: Duration = Duration::from_millis(50);
/// Upstream's period of the `--enable_metric_reporting` log line.
const METRIC_REPORT_PERIOD: Duration = Duration::from_secs(10);

impl RunningMaster {
    /// Binds every port and starts serving. Must be called inside a tokio runtime.
    pub async fn start(
        config: &MasterConfig,
        resolved: &ResolvedConfig,
    ) -> Result<RunningMaster, StartError> {
        Self::start_with(config, resolved, None).await
    }

    /// [`RunningMaster::start`], restoring `initial` (a snapshot's state) into the new master
    /// before anything is served; the tenant policy file, when configured, is applied after it.
    pub async fn start_with(
        config: &MasterConfig,
        resolved: &ResolvedConfig,
        initial: Option<(MasterState, RestoreOptions)>,
    ) -> Result<RunningMaster, StartError> {
        let (initial, log_prefix) = match &resolved.oplog {
            Some(settings) if !settings.ha => {
                let start = read_log(settings, &resolved.snapshot, core_config(config, resolved))
                    .await
                    .map_err(StartError::OpLog)?;
                let options = RestoreOptions {
                    join: Some(mooncake_snapshot::join_on_threads),
                    ..RestoreOptions::default()
                };
                (start.state.map(|s| (s, options)), start.prefix)
            }
            _ => (initial, None),
        };
        let master = Arc::new(MasterService::new(
            core_config(config, resolved),
            Arc::new(SystemClock::new()),
        )?);
        master.set_task_limits(task_limits(config));
        let snapshot_metrics = Arc::new(SnapshotMetrics::default());
        if let Some((state, options)) = initial {
            restore_into(&master, state, options, &snapshot_metrics)?;
        }
        let oplog: Arc<OpLogSlot> = Arc::default();
        let ha = match &resolved.oplog {
            Some(settings) if settings.ha => HaStatus::elected(),
            Some(settings) => {
                let handle = OpLogHandle::start(&master, settings, log_prefix, 1, None)
                    .map_err(StartError::OpLog)?;
                let _ = oplog.set(handle);
                HaStatus::single()
            }
            None => HaStatus::single(),
        };
        let policy_path = load_tenant_policy(config, &master)?;
        let tenant_policy = Arc::new(crate::tenant_policy::TenantPolicyStore::new(policy_path));
        let snapshotter = open_snapshotter(&master, config, resolved, &oplog, &snapshot_metrics)?;
        let metrics = Arc::new(RpcMetrics::default());
        let mut rpc_config = rpc_server_config(config);
        rpc_config.auth_token = resolved.auth_token.clone();
        let handler = Arc::new(
            MasterRpc::new(master.clone(), metrics.clone(), Limits::default())
                .with_snapshots(snapshotter.clone())
                .with_oplog(oplog.clone())
                .with_ha(ha.clone()),
        );
        let rpc = RpcServer::bind(resolved.rpc_addr, handler, rpc_config)
            .await
            .map_err(|source| StartError::Bind {
                what: "rpc",
                addr: resolved.rpc_addr,
                source,
            })?;
        let rpc_addr = rpc.local_addr();

        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();

        let workers = Arc::new(WorkerMetrics::default());
        let admin = admin_router(AdminState {
            master: master.clone(),
            metrics,
            rpc_stats: Some(rpc.stats().clone()),
            workers: workers.clone(),
            cluster_id: config.cluster_id.clone(),
            tenant_policy,
            snapshots: snapshotter.clone(),
            snapshot_metrics,
            auth_token: resolved.auth_token.clone(),
            ha: ha.clone(),
        });
        let metrics_addr = serve_http(
            &mut tasks,
            "metrics",
            resolved.metrics_addr,
            admin,
            stop_rx.clone(),
        )
        .await?;
        let metadata_addr = match resolved.metadata_addr {
            Some(addr) => Some(
                serve_http(
                    &mut tasks,
                    "metadata",
                    addr,
                    metadata_router(MetadataStore::default(), resolved.auth_token.as_ref()),
                    stop_rx.clone(),
                )
                .await?,
            ),
            None => None,
        };

        spawn_background_workers(&mut tasks, &master, &stop_rx, &workers);
        if let Some(settings) = resolved.oplog.as_ref().filter(|s| s.ha) {
            let ctx = HaContext {
                master: master.clone(),
                replica_config: core_config(config, resolved),
                settings: settings.clone(),
                snapshot: resolved.snapshot.clone(),
                address: rpc_addr.to_string(),
                status: ha.clone(),
                oplog: oplog.clone(),
            };
            tasks.spawn(supervise(ctx, stop_rx.clone()));
        }
        if config.enable_metric_reporting {
            spawn_metric_reporter(&mut tasks, &master, &ha, stop_rx);
        }

        let periodic = match (&snapshotter, resolved.snapshot.periodic) {
            (Some(snapshotter), Some(period)) => Some(
                PeriodicSnapshots::start(snapshotter.clone(), period).map_err(|e| {
                    StartError::Snapshot(format!("cannot start the snapshot thread: {e}"))
                })?,
            ),
            _ => None,
        };
        tracing::info!(%rpc_addr, %metrics_addr, ?metadata_addr, "master serving");
        Ok(RunningMaster {
            master,
            rpc,
            rpc_addr,
            metrics_addr,
            metadata_addr,
            stop,
            tasks,
            snapshotter,
            final_snapshot: periodic.is_some(),
            periodic,
            oplog,
        })
    }

    pub fn rpc_addr(&self) -> SocketAddr {
        self.rpc_addr
    }

    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr
    }

    pub fn metadata_addr(&self) -> Option<SocketAddr> {
        self.metadata_addr
    }

    /// The core (for embedding and tests).
    pub fn master(&self) -> &Arc<MasterService> {
        &self.master
    }

    /// The snapshot writer, when a snapshot directory is configured.
    pub fn snapshotter(&self) -> Option<&Arc<Snapshotter>> {
        self.snapshotter.as_ref()
    }

    /// Stops accepting, closes connections, stops the workers, and waits for all of it. With
    /// `--enable_snapshot`, a final snapshot is then taken of the state no call can change any
    /// more.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        self.rpc.shutdown().await;
        while self.tasks.join_next().await.is_some() {}
        let periodic = self.periodic.take();
        let snapshotter = self.snapshotter.take().filter(|_| self.final_snapshot);
        let oplog = self.oplog.get().cloned();
        let joined = tokio::task::spawn_blocking(move || {
            if let Some(oplog) = oplog {
                oplog.stop(OPLOG_DRAIN_AT_SHUTDOWN);
            }
            if let Some(periodic) = periodic {
                periodic.stop();
            }
            if let Some(snapshotter) = snapshotter {
                let _ = snapshotter.take_final();
            }
        })
        .await;
        if joined.is_err() {
            tracing::error!("the final snapshot panicked");
        }
        tracing::info!("master stopped");
    }
}

async fn serve_http(
    tasks: &mut JoinSet<()>,
    what: &'static str,
    addr: SocketAddr,
    router: axum::Router,
    mut stop: watch::Receiver<bool>,
) -> Result<SocketAddr, StartError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { what, addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| StartError::Bind { what, addr, source })?;
    tasks.spawn(async move {
        let shutdown = async move {
            let _ = stop.changed().await;
        };
        if let Err(error) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(%error, what, "http server failed");
        }
    });
    Ok(local)
}

/// Restores a snapshot's state into the new master and records the outcome in the metrics.
fn restore_into(
    master: &MasterService,
    state: MasterState,
    options: RestoreOptions,
    snapshot_metrics: &SnapshotMetrics,
) -> Result<(), StartError> {
    let report = master.restore(state, options)?;
    snapshot_metrics.record_restore(&report);
    tracing::info!(
        segments = report.segments,
        objects = report.objects,
        unverified_replicas = report.unverified_replicas,
        dropped_objects = report.dropped.objects(),
        dropped = ?report.dropped,
        "restored the master's state; segments wait for their owners to re-mount"
    );
    Ok(())
}

/// Loads and applies the tenant policy file when multi-tenancy names one; returns its path
/// (where admin changes are written back).
fn load_tenant_policy(
    config: &MasterConfig,
    master: &MasterService,
) -> Result<Option<std::path::PathBuf>, StartError> {
    let mut policy_path = None;
    if config.enable_multi_tenants && !config.tenant_quota_connector_uri.is_empty() {
        let path = std::path::PathBuf::from(&config.tenant_quota_connector_uri);
        let policy =
            crate::tenant_policy::load(&path).map_err(|error| StartError::TenantPolicy {
                path: path.clone(),
                message: error.to_string(),
            })?;
        master
            .apply_tenant_policy(policy)
            .map_err(|code| StartError::TenantPolicy {
                path: path.clone(),
                message: code.to_string(),
            })?;
        policy_path = Some(path);
    }
    Ok(policy_path)
}

/// Opens the snapshot directory when snapshots are configured.
/// With the op-log, its snapshots are of the log (docs/oplog.md, "Compaction").
fn open_snapshotter(
    master: &Arc<MasterService>,
    config: &MasterConfig,
    resolved: &ResolvedConfig,
    oplog: &Arc<OpLogSlot>,
    snapshot_metrics: &Arc<SnapshotMetrics>,
) -> Result<Option<Arc<Snapshotter>>, StartError> {
    let Some(dir) = &resolved.snapshot.dir else {
        return Ok(None);
    };
    let of_log = resolved.oplog.as_ref().map(|settings| LogSnapshots {
        slot: oplog.clone(),
        settings: settings.clone(),
        config: core_config(config, resolved),
    });
    let snapshotter = Snapshotter::open(
        master.clone(),
        dir,
        resolved.snapshot.retention,
        snapshot_metrics.clone(),
    )
    .map(|s| s.of_log(of_log))
    .map_err(|e| {
        StartError::Snapshot(format!(
            "cannot open the snapshot directory {}: {e}",
            dir.display()
        ))
    })?;
    Ok(Some(Arc::new(snapshotter)))
}

/// The master's periodic steps, each on its own timer: put timeouts, soft-pin expiry,
/// graceful unmounts, eviction, the client monitor, task cleanup and drain jobs.
fn spawn_background_workers(
    tasks: &mut JoinSet<()>,
    master: &Arc<MasterService>,
    stop_rx: &watch::Receiver<bool>,
    workers: &Arc<WorkerMetrics>,
) {
    spawn_worker(tasks, master, stop_rx.clone(), PUT_TIMEOUT_PERIOD, |m| {
        m.run_put_timeouts_once();
    });
    spawn_worker(tasks, master, stop_rx.clone(), DRAIN_JOB_PERIOD, |m| {
        m.run_drain_jobs_once();
    });
    spawn_worker(
        tasks,
        master,
        stop_rx.clone(),
        SOFT_PIN_EXPIRY_PERIOD,
        |m| {
            m.run_soft_pin_expiry_once();
        },
    );
    spawn_worker(
        tasks,
        master,
        stop_rx.clone(),
        GRACEFUL_UNMOUNT_PERIOD,
        |m| {
            m.run_graceful_unmounts_once();
        },
    );
    let counters = workers.clone();
    spawn_worker(tasks, master, stop_rx.clone(), EVICTION_PERIOD, move |m| {
        let report = m.run_eviction_once();
        use std::sync::atomic::Ordering::Relaxed;
        if report.triggered {
            counters.eviction_attempts.fetch_add(1, Relaxed);
        }
        if report.evicted_objects > 0 {
            counters.eviction_cycles.fetch_add(1, Relaxed);
            counters
                .evicted_objects
                .fetch_add(report.evicted_objects as u64, Relaxed);
            counters
                .evicted_bytes
                .fetch_add(report.freed_bytes, Relaxed);
        }
    });
    let counters = workers.clone();
    spawn_worker(
        tasks,
        master,
        stop_rx.clone(),
        CLIENT_MONITOR_PERIOD,
        move |m| {
            let expired = m.run_client_monitor_once();
            if expired > 0 {
                let expired_u64 = expired as u64;
                counters
                    .expired_clients
                    .fetch_add(expired_u64, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(expired, "clients expired: their segments were unmounted");
            }
        },
    );
    spawn_worker(tasks, master, stop_rx.clone(), TASK_CLEANUP_PERIOD, |m| {
        m.run_task_cleanup_once();
    });
}

/// Logs the summary line of `/metrics` every `METRIC_REPORT_PERIOD` (`--enable_metric_reporting`).
fn spawn_metric_reporter(
    tasks: &mut JoinSet<()>,
    master: &Arc<MasterService>,
    ha: &Arc<HaStatus>,
    stop_rx: watch::Receiver<bool>,
) {
    let master = master.clone();
    let ha = ha.clone();
    let mut stop = stop_rx;
    tasks.spawn(async move {
        let mut ticker = tokio::time::interval(METRIC_REPORT_PERIOD);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.changed() => return,
            }
            tracing::info!(
                "Master Metrics: {}",
                crate::http::summary_text(&master, &ha)
            );
        }
    });
}

fn spawn_worker(
    tasks: &mut JoinSet<()>,
    master: &Arc<MasterService>,
    mut stop: watch::Receiver<bool>,
    period: Duration,
    step: impl Fn(&MasterService) + Send + Sync + 'static,
) {
    let step = Arc::new(step);
    let master = master.clone();
    tasks.spawn(async move {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.changed() => return,
            }
            let master = master.clone();
            let step = step.clone();
            // Sweeps may walk many shards: keep them off the I/O threads.
            if tokio::task::spawn_blocking(move || step(&master))
                .await
                .is_err()
            {
                tracing::error!("background step panicked");
            }
        }
    });
}

/// Runs a master until SIGINT or SIGTERM, on a runtime with the configured thread count.
/// Returns the process exit code.
pub fn run_until_signal(config: MasterConfig, resolved: ResolvedConfig) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(resolved.rpc_threads.max(1))
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            return 1;
        }
    };
    runtime.block_on(async move {
        // Before binding: an operator sees it even when a bind then fails.
        if let Some(warning) = resolved.exposure_warning() {
            tracing::warn!("{warning}");
        }
        // With the op-log the start loads the newest snapshot of the log itself.
        let mut at_start = resolved.snapshot.clone();
        at_start.restore &= resolved.oplog.is_none();
        let (initial, skipped, clean) = match crate::snapshot::load_at_start(&at_start) {
            Ok(start) => (
                start.loaded.map(|(_, state, options)| (state, options)),
                Some(start.skipped),
                start.clean_shutdown,
            ),
            Err(message) => {
                tracing::error!("{message}");
                eprintln!("mooncake master: {message}");
                return 1;
            }
        };
        let master = match RunningMaster::start_with(&config, &resolved, initial).await {
            Ok(master) => master,
            Err(error) => {
                eprintln!("mooncake master: {error}");
                return 1;
            }
        };
        if let (Some(snapshotter), Some(skipped)) = (master.snapshotter(), skipped) {
            let metrics = snapshotter.metrics();
            let relaxed = std::sync::atomic::Ordering::Relaxed;
            metrics.restore_skipped_files.store(skipped as u64, relaxed);
            metrics
                .restore_clean_shutdown
                .store(u64::from(clean), relaxed);
        }
        if let Some(notice) = &resolved.notice {
            tracing::warn!("{notice}");
        }
        println!(
            "mooncake master listening: rpc {} metrics http://{}{}",
            master.rpc_addr(),
            master.metrics_addr(),
            master
                .metadata_addr()
                .map(|a| format!(" metadata http://{a}/metadata"))
                .unwrap_or_default()
        );
        wait_for_signal().await;
        master.shutdown().await;
        0
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut interrupt), Ok(mut terminate)) => {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
