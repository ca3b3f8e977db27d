//! The op-log in etcd (docs/oplog.md, "In etcd"): batches under
//! `<root>batches/<20-digit batch id>` and the durable prefix under `<root>prefix`, written
//! together by one transaction that compares the prefix with the one the writer last committed.
//! A writer whose idea of the prefix is stale (another master wrote since) can never commit.

use std::time::Duration;

use crate::election::Fence;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KvClient, Txn, TxnOp,
    TxnOpResponse,
};

/// The durable prefix: the last committed batch and the last sequence number it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prefix {
    pub batch_id: u64,
    pub last_seq: u64,
}

impl Prefix {
    /// The stored value: `v1 <batch id> <last seq>` in ASCII decimal.
    pub fn encode(&self) -> String {
        format!("v1 {} {}", self.batch_id, self.last_seq)
    }

    pub fn parse(value: &[u8]) -> Option<Prefix> {
        let text = std::str::from_utf8(value).ok()?;
        let mut parts = text.split(' ');
        if parts.next()? != "v1" {
            return None;
        }
        let batch_id = parts.next()?.parse().ok()?;
        let last_seq = parts.next()?.parse().ok()?;
        parts
            .next()
            .is_none()
            .then_some(Prefix { batch_id, last_seq })
    }
}

/// Why an etcd call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    /// etcd did not answer (unreachable, timed out, no quorum): the call may be retried.
    #[error("etcd unavailable: {0}")]
    Unavailable(String),
    /// The prefix moved (another writer committed) or this writer's view is no longer the
    /// leader's. This writer may never commit again.
    #[error("op-log fenced: the durable prefix is {found:?}, this writer expected {expected:?} (or its leadership view ended)")]
    Fenced {
        expected: Option<Prefix>,
        found: Option<Prefix>,
    },
    /// What etcd holds is not an op-log this build can read.
    #[error("op-log in etcd is unusable: {0}")]
    Invalid(String),
}

/// Most batches one [`EtcdLog::read_batches`] call returns: a batch is at most
/// [`crate::batch::MAX_ENTRY_BYTES`] of entries plus 44 bytes, so a full read stays below
/// [`MAX_RESPONSE_BYTES`].
pub const MAX_BATCHES_PER_READ: i64 = 64;
/// The largest etcd answer the log's client accepts (gRPC's default is 4 MiB: four batches of a
/// busy leader did not fit, and a follower could never read past them).
pub const MAX_RESPONSE_BYTES: usize = 80 << 20;

/// The op-log's keys in one etcd cluster.
#[derive(Clone)]
pub struct EtcdLog {
    kv: KvClient,
    root: String,
    timeout: Duration,
    fence: Option<Fence>,
}

impl std::fmt::Debug for EtcdLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLog").field("root", &self.root).finish()
    }
}

/// The key prefix of cluster `cluster_id`'s op-log.
pub fn oplog_root(cluster_id: &str) -> String {
    format!("/mooncake-rs/{cluster_id}/oplog/")
}

/// Splits `--etcd_endpoints` / `--ha_backend_connstring` (comma or semicolon separated, with
/// or without `http://`, optionally prefixed `etcd://`) into endpoint URLs.
pub fn parse_endpoints(s: &str) -> Vec<String> {
    let s = s.trim().strip_prefix("etcd://").unwrap_or(s.trim());
    s.split([',', ';'])
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            if e.contains("://") {
                e.to_string()
            } else {
                format!("http://{e}")
            }
        })
        .collect()
}

fn unavailable(e: impl std::fmt::Display) -> EtcdError {
    EtcdError::Unavailable(e.to_string())
}

impl EtcdLog {
    /// Connects (lazily: an unreachable etcd fails the first call, not this one).
    pub async fn connect(
        endpoints: &[String],
        root: String,
        timeout: Duration,
    ) -> Result<EtcdLog, EtcdError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(Duration::from_secs(2), timeout);
        let connect = Client::connect(endpoints, Some(options));
        let client = tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| unavailable("connect timed out"))?
            .map_err(unavailable)?;
        Ok(EtcdLog {
            kv: client
                .kv_client()
                .max_decoding_message_size(MAX_RESPONSE_BYTES),
            root,
            timeout,
            fence: None,
        })
    }

    /// Every commit also requires `fence` (the leader key of this writer's view): a leader
    /// that lost the election can never commit.
    pub fn with_fence(mut self, fence: Option<Fence>) -> Self {
        self.fence = fence;
        self
    }

    pub fn prefix_key(&self) -> String {
        format!("{}prefix", self.root)
    }

    pub fn batch_key(&self, batch_id: u64) -> String {
        format!("{}batches/{batch_id:020}", self.root)
    }

    async fn timed<T, F>(&self, f: F) -> Result<T, EtcdError>
    where
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        tokio::time::timeout(self.timeout, f)
            .await
            .map_err(|_| unavailable("timed out"))?
            .map_err(unavailable)
    }

    /// `compaction/latest`: the prefix of the newest snapshot compaction published.
    pub fn latest_key(&self) -> String {
        format!("{}compaction/latest", self.root)
    }

    /// `compaction/floor`: every batch up to this prefix's batch id is deleted.
    pub fn floor_key(&self) -> String {
        format!("{}compaction/floor", self.root)
    }

    /// The durable prefix (`None` before the first commit).
    pub async fn read_prefix(&self) -> Result<Option<Prefix>, EtcdError> {
        self.read_prefix_at(self.prefix_key()).await
    }

    /// The compaction floor (`None`: nothing was ever deleted).
    pub async fn read_floor(&self) -> Result<Option<Prefix>, EtcdError> {
        self.read_prefix_at(self.floor_key()).await
    }

    /// The prefix of the newest snapshot a compaction published (`None`: none yet).
    pub async fn read_latest(&self) -> Result<Option<Prefix>, EtcdError> {
        self.read_prefix_at(self.latest_key()).await
    }

    async fn read_prefix_at(&self, key: String) -> Result<Option<Prefix>, EtcdError> {
        let mut kv = self.kv.clone();
        let r = self.timed(kv.get(key.clone(), None)).await?;
        match r.kvs().first() {
            None => Ok(None),
            Some(kv) => Prefix::parse(kv.value())
                .map(Some)
                .ok_or_else(|| EtcdError::Invalid(format!("{key} value {:?}", kv.value()))),
        }
    }

    /// Publishes `latest` (the prefix a new snapshot includes) and moves the compaction floor
    /// from `old_floor` to `floor` (if any), deleting every batch up to its batch id, in one
    /// transaction. It succeeds only if the floor is still `old_floor` and, with a fence, this
    /// writer's view still leads. Returns the transaction's revision (for
    /// [`EtcdLog::compact_history`]).
    pub async fn compact(
        &self,
        latest: Prefix,
        old_floor: Option<Prefix>,
        floor: Option<Prefix>,
    ) -> Result<i64, EtcdError> {
        let fk = self.floor_key();
        let guard = match old_floor {
            None => Compare::create_revision(fk.clone(), CompareOp::Equal, 0),
            Some(p) => Compare::value(fk.clone(), CompareOp::Equal, p.encode()),
        };
        let guards: Vec<Compare> = std::iter::once(guard)
            .chain(self.fence.as_ref().map(Fence::compare))
            .collect();
        let mut ops = vec![TxnOp::put(self.latest_key(), latest.encode(), None)];
        if let Some(floor) = floor {
            let first = format!("{}batches/", self.root);
            let end = self.batch_key(floor.batch_id.saturating_add(1));
            ops.push(TxnOp::put(fk, floor.encode(), None));
            ops.push(TxnOp::delete(
                first,
                Some(DeleteOptions::new().with_range(end)),
            ));
        }
        let txn = Txn::new().when(guards).and_then(ops);
        let mut kv = self.kv.clone();
        let r = self.timed(kv.txn(txn)).await?;
        if !r.succeeded() {
            return Err(EtcdError::Fenced {
                expected: old_floor,
                found: None,
            });
        }
        Ok(r.header().map_or(0, |h| h.revision()))
    }

    /// Compacts etcd's history (MVCC) up to `revision`: the deleted batches and every older
    /// value of the prefix stop taking space in etcd's database (the file itself shrinks only
    /// at a defragmentation; docs/oplog.md, "Compaction"). A revision already compacted is not
    /// an error.
    pub async fn compact_history(&self, revision: i64) -> Result<(), EtcdError> {
        let mut kv = self.kv.clone();
        match self.timed(kv.compact(revision, None)).await {
            Err(EtcdError::Unavailable(why)) if why.contains("compacted") => Ok(()),
            other => other.map(drop),
        }
    }

    /// Commits `bytes` as batch `new.batch_id` and moves the prefix from `expected` to `new`, in
    /// one transaction that succeeds only if the prefix is still `expected`. A commit that
    /// failed ambiguously earlier and is retried is recognised (the prefix is `new` and the
    /// stored batch is these bytes) and reported as success.
    pub async fn commit(
        &self,
        expected: Option<Prefix>,
        new: Prefix,
        bytes: &[u8],
    ) -> Result<(), EtcdError> {
        let pk = self.prefix_key();
        let bk = self.batch_key(new.batch_id);
        let guard = match expected {
            None => Compare::create_revision(pk.clone(), CompareOp::Equal, 0),
            Some(p) => Compare::value(pk.clone(), CompareOp::Equal, p.encode()),
        };
        let guards: Vec<Compare> = std::iter::once(guard)
            .chain(self.fence.as_ref().map(Fence::compare))
            .collect();
        let txn = Txn::new()
            .when(guards)
            .and_then([
                TxnOp::put(bk.clone(), bytes.to_vec(), None),
                TxnOp::put(pk.clone(), new.encode(), None),
            ])
            .or_else([TxnOp::get(pk, None), TxnOp::get(bk, None)]);
        let mut kv = self.kv.clone();
        let r = self.timed(kv.txn(txn)).await?;
        if r.succeeded() {
            return Ok(());
        }
        let mut found = None;
        let mut stored: Option<Vec<u8>> = None;
        for (i, op) in r.op_responses().into_iter().enumerate() {
            if let TxnOpResponse::Get(g) = op {
                let value = g.kvs().first().map(|kv| kv.value().to_vec());
                if i == 0 {
                    found = value.as_deref().and_then(Prefix::parse);
                } else {
                    stored = value;
                }
            }
        }
        if found == Some(new) && stored.as_deref() == Some(bytes) {
            return Ok(());
        }
        Err(EtcdError::Fenced { expected, found })
    }

    /// Up to `limit` (at most [`MAX_BATCHES_PER_READ`]) batches with ids above `after`, in id
    /// order: `(batch id, bytes)`.
    pub async fn read_batches(
        &self,
        after: u64,
        limit: i64,
    ) -> Result<Vec<(u64, Vec<u8>)>, EtcdError> {
        let from = self.batch_key(after.saturating_add(1));
        let to = format!("{}batches0", self.root); // '0' follows '/'
        let limit = limit.clamp(1, MAX_BATCHES_PER_READ);
        let options = GetOptions::new().with_range(to).with_limit(limit);
        let mut kv = self.kv.clone();
        let r = self.timed(kv.get(from, Some(options))).await?;
        let prefix_len = format!("{}batches/", self.root).len();
        r.kvs()
            .iter()
            .map(|kv| {
                let id = kv
                    .key()
                    .get(prefix_len..)
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .and_then(|k| k.parse::<u64>().ok())
                    .ok_or_else(|| EtcdError::Invalid(format!("batch key {:?}", kv.key())))?;
                Ok((id, kv.value().to_vec()))
            })
            .collect()
    }

    /// The number of keys under the op-log's root (for tests and the benchmark).
    pub async fn key_count(&self) -> Result<i64, EtcdError> {
        let options = GetOptions::new().with_prefix().with_count_only();
        let mut kv = self.kv.clone();
        let r = self.timed(kv.get(self.root.clone(), Some(options))).await?;
        Ok(r.count())
    }
}
