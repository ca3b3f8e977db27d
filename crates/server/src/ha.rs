//! High availability (`--enable_ha`, docs/ha.md): masters campaign for the leader key in etcd
//! (`mooncake_oplog::election`); the others are hot standbys that replay the op-log as it
//! grows. A standby that wins the key catches up to the durable prefix, rebuilds the serving
//! master from its replica (allocators from the live ranges), starts the op-log writer fenced
//! by its view, and serves. A leader that cannot renew its lease before it runs out, or whose
//! commit was fenced, stops serving for good (it must be restarted to rejoin as a standby).
//!
//! While a master does not serve, every RPC answers `UNAVAILABLE_IN_CURRENT_STATUS` and the
//! client tries another master.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mooncake_common::SystemClock;
use mooncake_master::{MasterService, MasterServiceConfig, RestoreOptions};
use mooncake_oplog::election::{Election, Leadership, Renewal, View};
use mooncake_oplog::etcd::{EtcdLog, Prefix};
use mooncake_oplog::WriterHealth;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::config::{OpLogSettings, SnapshotSettings};
use mooncake_oplog::follow::{FollowError, LogFollower};

use crate::oplog::{bootstrap_from, connect_log, OpLogHandle, OpLogSlot};

/// How often a standby reads the log and the leader key.
const STANDBY_POLL: Duration = Duration::from_millis(200);
/// How often the leader renews its lease (upstream: ttl / 3).
const RENEW_PERIOD: Duration = Duration::from_millis(1000);
/// After winning the key: the wait before serving, beyond the old leader's lease (which had
/// already run out in etcd, and which the old leader stops serving before) — for clock-rate
/// differences between machines.
const WARMUP: Duration = Duration::from_secs(1);
/// Deadline of one etcd call of the election.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the promotion's final catch-up retries an unreachable etcd.
const FINAL_CATCH_UP: Duration = Duration::from_secs(30);
/// At shutdown, how long the leader waits for its last entries before releasing the key.
const DRAIN_BEFORE_RELEASE: Duration = Duration::from_secs(10);

/// Where a master stands in the election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum HaState {
    /// Replays the log; another master leads (or nobody yet).
    Standby = 0,
    /// Won the key; reads the log up to the durable prefix.
    CatchingUp = 1,
    /// Caught up; waits before serving.
    LeaderWarmup = 2,
    /// The leader, serving.
    Serving = 3,
    /// Was the leader and lost the lease or was fenced: serves nothing any more.
    SteppedDown = 4,
    /// The log could not be followed (a gap, a bad batch): never campaigns.
    Halted = 5,
}

impl HaState {
    pub fn name(self) -> &'static str {
        match self {
            HaState::Standby => "standby",
            HaState::CatchingUp => "catching_up",
            HaState::LeaderWarmup => "leader_warmup",
            HaState::Serving => "serving",
            HaState::SteppedDown => "stepped_down",
            HaState::Halted => "halted",
        }
    }

    fn from_u8(v: u8) -> HaState {
        match v {
            0 => HaState::Standby,
            1 => HaState::CatchingUp,
            2 => HaState::LeaderWarmup,
            3 => HaState::Serving,
            4 => HaState::SteppedDown,
            _ => HaState::Halted,
        }
    }
}

/// This master's role, read by every RPC and by `/role`, `/ha_status`, `/leader`, `/health`.
#[derive(Debug)]
pub struct HaStatus {
    /// `false`: a master without election, always the serving leader.
    enabled: bool,
    state: AtomicU8,
    /// The leadership is valid until `base + until_ns` (renewals extend it).
    base: Instant,
    until_ns: AtomicU64,
    /// The last view seen in etcd.
    view: Mutex<Option<View>>,
}

impl HaStatus {
    /// A master without election.
    pub fn single() -> Arc<HaStatus> {
        Arc::new(Self::new(false))
    }

    /// A master in an election, starting as a standby.
    pub fn elected() -> Arc<HaStatus> {
        Arc::new(Self::new(true))
    }

    fn new(enabled: bool) -> HaStatus {
        HaStatus {
            enabled,
            state: AtomicU8::new(if enabled {
                HaState::Standby as u8
            } else {
                HaState::Serving as u8
            }),
            base: Instant::now(),
            until_ns: AtomicU64::new(0),
            view: Mutex::new(None),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn state(&self) -> HaState {
        HaState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub fn state_name(&self) -> &'static str {
        self.state().name()
    }

    /// Whether this master serves calls now: always without election; with it, only the
    /// leader in `serving` whose lease has not run out by its own clock.
    pub fn serving(&self) -> bool {
        if !self.enabled {
            return true;
        }
        self.state() == HaState::Serving
            && (self.base.elapsed().as_nanos() as u64) < self.until_ns.load(Ordering::Acquire)
    }

    /// Whether the leadership runs out within `margin` by this master's clock (never without
    /// election).
    pub fn lease_ends_within(&self, margin: Duration) -> bool {
        self.enabled
            && (self.base.elapsed() + margin).as_nanos() as u64
                >= self.until_ns.load(Ordering::Acquire)
    }

    /// `leader` or `standby`.
    pub fn role(&self) -> &'static str {
        if self.serving() {
            "leader"
        } else {
            "standby"
        }
    }

    /// The last view seen (`None` without election or before one was read).
    pub fn view(&self) -> Option<View> {
        self.view.lock().clone()
    }

    fn set_state(&self, s: HaState) {
        self.state.store(s as u8, Ordering::Release);
    }

    fn set_view(&self, v: Option<View>) {
        *self.view.lock() = v;
    }

    fn valid_until(&self, until: Instant) {
        let ns = until.saturating_duration_since(self.base).as_nanos() as u64;
        self.until_ns.store(ns, Ordering::Release);
    }

    fn expired(&self) -> bool {
        (self.base.elapsed().as_nanos() as u64) >= self.until_ns.load(Ordering::Acquire)
    }
}

/// What the election runs with.
#[derive(Debug)]
pub struct HaContext {
    /// The master that serves once this one leads (empty until then).
    pub master: Arc<MasterService>,
    /// The settings of the standby's replica master.
    pub replica_config: MasterServiceConfig,
    pub settings: OpLogSettings,
    /// Where the leader's snapshots of the log are: the standby starts from the newest.
    pub snapshot: SnapshotSettings,
    /// This master's RPC address, written into the leader key.
    pub address: String,
    pub status: Arc<HaStatus>,
    /// Where the op-log is put at promotion.
    pub oplog: Arc<OpLogSlot>,
}

/// Runs the election until `stop`: standby, promotion, leadership, step-down.
pub async fn supervise(ctx: HaContext, mut stop: watch::Receiver<bool>) {
    let Some((election, log)) = connect(&ctx.settings, &mut stop).await else {
        return;
    };
    let replica = match MasterService::new(ctx.replica_config.clone(), Arc::new(SystemClock::new()))
    {
        Ok(m) => m,
        Err(e) => {
            tracing::error!("HA: cannot create the standby's replica: {e}");
            ctx.status.set_state(HaState::Halted);
            return;
        }
    };
    let started = tokio::select! {
        started = bootstrap_from(&replica, &log, &ctx.snapshot) => started,
        _ = stop.changed() => return,
    };
    let mut follower = match started {
        Ok(follower) => follower,
        Err(why) => {
            tracing::error!("HA: the standby cannot start from the log: {why}; it halts");
            ctx.status.set_state(HaState::Halted);
            let _ = stop.changed().await;
            return;
        }
    };
    let held = tokio::select! {
        held = stand_by(&ctx, &election, &log, &mut follower) => held,
        _ = stop.changed() => return,
    };
    let Some(held) = held else {
        let _ = stop.changed().await;
        return;
    };
    let held = tokio::select! {
        r = promote(&ctx, &election, &log, &mut follower, &replica, held) => r,
        _ = stop.changed() => return,
    };
    drop(follower);
    drop(replica);
    match held {
        Ok(held) => lead(&ctx, &election, held, &mut stop).await,
        Err((held, why)) => {
            tracing::error!("HA: promotion failed: {why}; this master steps down");
            step_down(&ctx).await;
            election.release(held).await;
        }
    }
}

/// Connects to etcd for the election and the log, retrying until it answers or `stop`.
async fn connect(
    settings: &OpLogSettings,
    stop: &mut watch::Receiver<bool>,
) -> Option<(Election, EtcdLog)> {
    loop {
        let attempt = async {
            let election =
                Election::connect(&settings.endpoints, &settings.cluster_id, CALL_TIMEOUT)
                    .await
                    .map_err(|e| e.to_string())?;
            let log = connect_log(settings).await?;
            Ok::<_, String>((election, log))
        };
        match attempt.await {
            Ok(both) => return Some(both),
            Err(e) => tracing::warn!("HA: cannot reach etcd: {e}; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(STANDBY_POLL) => {}
            _ = stop.changed() => return None,
        }
    }
}

/// Replays the log as it grows and campaigns when nobody leads. Returns the leadership won,
/// or `None` when replay halted (this master never leads then).
async fn stand_by(
    ctx: &HaContext,
    election: &Election,
    log: &EtcdLog,
    follower: &mut LogFollower<'_>,
) -> Option<Leadership> {
    let mut last_warning = None::<String>;
    loop {
        match follower.catch_up(log).await {
            Ok(_) => {}
            Err(FollowError::Halted(why)) => {
                tracing::error!("HA: {why}; this standby halts and will never lead");
                ctx.status.set_state(HaState::Halted);
                return None;
            }
            Err(e) => warn_once(&mut last_warning, e.to_string()),
        }
        match campaign(ctx, election).await {
            Ok(Some(held)) => return Some(held),
            Ok(None) => {}
            Err(why) => warn_once(&mut last_warning, why),
        }
        tokio::time::sleep(STANDBY_POLL).await;
    }
}

fn warn_once(last: &mut Option<String>, why: String) {
    if last.as_deref() != Some(why.as_str()) {
        tracing::warn!("HA standby: {why}");
        *last = Some(why);
    }
}

/// Reads the leader key and tries to take it when it is free.
async fn campaign(ctx: &HaContext, election: &Election) -> Result<Option<Leadership>, String> {
    if let Some(view) = election.read_view().await.map_err(|e| e.to_string())? {
        ctx.status.set_view(Some(view));
        return Ok(None);
    }
    match election
        .try_acquire(&ctx.address)
        .await
        .map_err(|e| e.to_string())?
    {
        Ok(held) => {
            tracing::info!(
                view = held.view.version,
                "HA: won the leader key; catching up"
            );
            ctx.status.set_view(Some(held.view.clone()));
            Ok(Some(held))
        }
        Err(observed) => {
            ctx.status.set_view(observed);
            Ok(None)
        }
    }
}

/// Final catch-up, warm-up, rebuild of the serving master, op-log writer, first renewal.
async fn promote(
    ctx: &HaContext,
    election: &Election,
    log: &EtcdLog,
    follower: &mut LogFollower<'_>,
    replica: &MasterService,
    mut held: Leadership,
) -> Result<Leadership, (Leadership, String)> {
    ctx.status.set_state(HaState::CatchingUp);
    // Nobody else can commit any more (every commit compares the leader key), so what is
    // durable now is final.
    let prefix = match final_catch_up(follower, log).await {
        Ok(p) => p,
        Err(why) => return Err((held, why)),
    };
    ctx.status.set_state(HaState::LeaderWarmup);
    tokio::time::sleep(WARMUP).await;
    let state = replica.export_state();
    let options = RestoreOptions {
        join: Some(mooncake_snapshot::join_on_threads),
        ..RestoreOptions::default()
    };
    let restored = tokio::task::block_in_place(|| ctx.master.restore(state, options));
    if let Err(e) = restored {
        return Err((held, format!("cannot rebuild the serving state: {e}")));
    }
    let fence = election.fence(&held.view);
    let handle = match OpLogHandle::start(
        &ctx.master,
        &ctx.settings,
        prefix,
        held.view.version,
        Some(fence),
    ) {
        Ok(h) => h,
        Err(why) => return Err((held, why)),
    };
    let _ = ctx.oplog.set(handle);
    match election.renew(&mut held).await {
        Ok(Renewal::Held { until }) => {
            ctx.status.valid_until(until);
            ctx.status.set_state(HaState::Serving);
            tracing::info!(
                view = held.view.version,
                applied = prefix.map_or(0, |p| p.last_seq),
                "HA: this master leads and serves"
            );
            Ok(held)
        }
        Ok(Renewal::Lost) => Err((held, "the lease ran out during promotion".into())),
        Err(e) => Err((held, format!("cannot renew the lease: {e}"))),
    }
}

async fn final_catch_up(
    follower: &mut LogFollower<'_>,
    log: &EtcdLog,
) -> Result<Option<Prefix>, String> {
    let deadline = Instant::now() + FINAL_CATCH_UP;
    loop {
        match follower.catch_up(log).await {
            Ok(prefix) => return Ok(prefix),
            Err(FollowError::Unavailable(why)) if Instant::now() < deadline => {
                tracing::warn!("HA: final catch-up: {why}; retrying");
                tokio::time::sleep(STANDBY_POLL).await;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Renews the lease until it is lost, the op-log is fenced, or `stop`.
async fn lead(
    ctx: &HaContext,
    election: &Election,
    mut held: Leadership,
    stop: &mut watch::Receiver<bool>,
) {
    let why = loop {
        tokio::select! {
            _ = tokio::time::sleep(RENEW_PERIOD) => {}
            _ = stop.changed() => {
                ctx.status.set_state(HaState::SteppedDown);
                drain(ctx).await;
                election.release(held).await;
                return;
            }
        }
        let fenced = ctx
            .oplog
            .get()
            .is_some_and(|h| h.sink().health() == WriterHealth::Fenced);
        if fenced {
            break "its op-log commit was fenced (another master leads)".to_string();
        }
        match election.renew(&mut held).await {
            Ok(Renewal::Held { until }) => ctx.status.valid_until(until),
            Ok(Renewal::Lost) => break "its lease ran out".to_string(),
            Err(e) if ctx.status.expired() => break format!("it could not renew its lease: {e}"),
            Err(e) => tracing::warn!("HA: renewing the lease: {e}; retrying"),
        }
        if ctx.status.expired() {
            break "its lease ran out before it was renewed".to_string();
        }
    };
    step_down(ctx).await;
    tracing::error!(
        view = held.view.version,
        "HA: this master stepped down: {why}; it serves nothing more (restart it to rejoin as a standby)"
    );
    election.release(held).await;
}

/// Stops serving and stops the op-log writer for good: nothing this master observes from now
/// on (its background sweeps still run, on a state no longer the cluster's: a client it stops
/// hearing from expires) may reach the log, even while its leader key still exists in etcd
/// (an etcd that was down and came back restores the key's lease for a full TTL).
async fn step_down(ctx: &HaContext) {
    ctx.status.set_state(HaState::SteppedDown);
    if let Some(h) = ctx.oplog.get().cloned() {
        let _ = tokio::task::spawn_blocking(move || h.fence()).await;
    }
}

/// Waits for the leader's last entries to be durable before the key is given up.
async fn drain(ctx: &HaContext) {
    if let Some(h) = ctx.oplog.get().cloned() {
        let _ = tokio::task::spawn_blocking(move || h.stop(DRAIN_BEFORE_RELEASE)).await;
    }
}
