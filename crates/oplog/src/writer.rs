//! The writer: one thread that group-commits the sink's queued entries into etcd. While one
//! transaction is in flight, new entries queue; the next batch takes all of them (up to the
//! batch limits). A batch that fails because etcd did not answer is retried, unchanged, with a
//! growing pause (the sink reports `Retrying` meanwhile); a refused compare (another master
//! moved the prefix) fences the sink for good and ends the thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::batch;
use crate::election::Fence;
use crate::etcd::{EtcdError, EtcdLog, Prefix};
use crate::sink::{OpLogSink, Taken, WriterHealth};

/// Where and how the writer commits.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    pub endpoints: Vec<String>,
    /// The op-log's key prefix ([`crate::etcd::oplog_root`]).
    pub root: String,
    /// The leadership view written into every batch.
    pub view: u64,
    /// The durable prefix this writer continues from (as read before the sink numbered
    /// anything).
    pub start: Option<Prefix>,
    /// Deadline of one etcd call.
    pub call_timeout: Duration,
    /// With an election: the leader key every commit must find still this writer's view's.
    pub fence: Option<Fence>,
}

/// What the writer has done (for logs and metrics).
#[derive(Debug, Default)]
pub struct WriterStats {
    pub batches: std::sync::atomic::AtomicU64,
    pub entries: std::sync::atomic::AtomicU64,
    pub retries: std::sync::atomic::AtomicU64,
}

/// The running writer thread. Dropping it stops the thread (after its current call).
#[derive(Debug)]
pub struct OpLogWriter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub stats: Arc<WriterStats>,
}

const MIN_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// Consecutive failed commits after which the writer connects afresh.
const RECONNECT_AFTER: u32 = 8;

impl OpLogWriter {
    /// Starts the writer thread.
    pub fn start(sink: Arc<OpLogSink>, config: WriterConfig) -> std::io::Result<OpLogWriter> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(WriterStats::default());
        let (s, st) = (stop.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("mc-oplog-writer".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::warn!("op-log writer: cannot start its runtime: {e}");
                        sink.set_health(WriterHealth::Fenced);
                        return;
                    }
                };
                rt.block_on(run(sink, config, s, st));
            })?;
        Ok(OpLogWriter {
            stop,
            thread: Some(thread),
            stats,
        })
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for OpLogWriter {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

async fn connect_once(config: &WriterConfig) -> Result<EtcdLog, EtcdError> {
    let log = EtcdLog::connect(&config.endpoints, config.root.clone(), config.call_timeout).await?;
    Ok(log.with_fence(config.fence.clone()))
}

async fn connect(config: &WriterConfig, stop: &AtomicBool, sink: &OpLogSink) -> Option<EtcdLog> {
    let mut backoff = MIN_BACKOFF;
    while !stop.load(Ordering::Acquire) {
        match connect_once(config).await {
            Ok(log) => return Some(log),
            Err(e) => {
                sink.set_health(WriterHealth::Retrying);
                tracing::warn!("op-log writer: {e}; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
    None
}

async fn run(
    sink: Arc<OpLogSink>,
    config: WriterConfig,
    stop: Arc<AtomicBool>,
    stats: Arc<WriterStats>,
) {
    let Some(mut log) = connect(&config, &stop, &sink).await else {
        return;
    };
    let mut failures = 0u32;
    let mut durable = config.start;
    let mut pending: Option<(Taken, Vec<u8>, Prefix)> = None;
    let mut backoff = MIN_BACKOFF;
    while !stop.load(Ordering::Acquire) {
        if pending.is_none() {
            // The sink's take blocks this thread briefly; nothing else runs on this runtime.
            let Some(t) = sink.take(Duration::from_millis(50)) else {
                continue;
            };
            let next = Prefix {
                batch_id: durable.map_or(1, |p| p.batch_id + 1),
                last_seq: t.last_seq(),
            };
            if t.first_seq != durable.map_or(0, |p| p.last_seq) + 1 {
                tracing::warn!(
                    "op-log writer: entries start at {} but the prefix ends at {:?}; stopping",
                    t.first_seq,
                    durable
                );
                sink.set_health(WriterHealth::Fenced);
                return;
            }
            let bytes = batch::seal(next.batch_id, config.view, t.first_seq, t.count, &t.entries);
            pending = Some((t, bytes, next));
        }
        let Some((t, bytes, next)) = pending.as_ref() else {
            continue;
        };
        match log.commit(durable, *next, bytes).await {
            Ok(()) => {
                durable = Some(*next);
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats
                    .entries
                    .fetch_add(u64::from(t.count), Ordering::Relaxed);
                if sink.health() != WriterHealth::Healthy {
                    tracing::warn!("op-log writer: etcd answers again; batches commit");
                    sink.set_health(WriterHealth::Healthy);
                }
                sink.mark_durable(next.last_seq);
                pending = None;
                backoff = MIN_BACKOFF;
                failures = 0;
            }
            Err(EtcdError::Unavailable(why)) => {
                if sink.health() == WriterHealth::Healthy {
                    tracing::warn!("op-log writer: {why}; retrying batch {}", next.batch_id);
                }
                stats.retries.fetch_add(1, Ordering::Relaxed);
                sink.set_health(WriterHealth::Retrying);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                failures += 1;
                if failures.is_multiple_of(RECONNECT_AFTER) {
                    // A fresh connection, in case the old one does not recover by itself.
                    if let Ok(fresh) = connect_once(&config).await {
                        log = fresh;
                    }
                }
            }
            Err(e) => {
                tracing::warn!("op-log writer: {e}; this master no longer writes the log");
                sink.set_health(WriterHealth::Fenced);
                return;
            }
        }
    }
}
