//! Leader election on etcd (docs/ha.md): the leader holds the key
//! `mooncake-store/<cluster_id>/master_view` (upstream's key), whose value is its RPC address
//! and which lives on a lease of [`LEASE_TTL`] kept alive by the leader. The key's create
//! revision is the **view version**: etcd's revisions only grow, so every new leader has a
//! higher one. The op-log's commits compare it ([`Fence`]), so a master that lost the key can
//! never commit again, even if it does not know yet that it lost it.

use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, KvClient, LeaseClient, LeaseKeepAliveStream,
    LeaseKeeper, PutOptions, Txn, TxnOp, TxnOpResponse,
};

use crate::etcd::EtcdError;

/// The election lease's time to live (upstream's 5 s).
pub const LEASE_TTL: Duration = Duration::from_secs(5);
/// Tries of one renewal while etcd does not answer.
pub const RENEW_ATTEMPTS: u32 = 4;

/// The leader key of cluster `cluster_id` (upstream's layout).
pub fn view_key(cluster_id: &str) -> String {
    format!("mooncake-store/{cluster_id}/master_view")
}

/// Who leads, as etcd says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// The leader's RPC address.
    pub leader: String,
    /// The leader key's create revision: higher for every later leader.
    pub version: u64,
}

/// The compare every commit of a leader's op-log carries: the leader key still exists with
/// this create revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub key: String,
    pub version: u64,
}

impl Fence {
    pub(crate) fn compare(&self) -> Compare {
        let revision = i64::try_from(self.version).unwrap_or(i64::MAX);
        Compare::create_revision(self.key.clone(), CompareOp::Equal, revision)
    }
}

/// Leadership held: the lease and the view it created.
pub struct Leadership {
    pub view: View,
    lease: i64,
    keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("view", &self.view)
            .field("lease", &self.lease)
            .finish()
    }
}

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was extended; the leadership is valid until this instant (measured from
    /// before the request was sent, so it never outlives the lease in etcd).
    Held { until: Instant },
    /// The lease expired or the key belongs to another view: leadership is gone.
    Lost,
}

/// One master's view of the election.
#[derive(Clone)]
pub struct Election {
    kv: KvClient,
    lease: LeaseClient,
    key: String,
    timeout: Duration,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election").field("key", &self.key).finish()
    }
}

fn unavailable(e: impl std::fmt::Display) -> EtcdError {
    EtcdError::Unavailable(e.to_string())
}

impl Election {
    /// Connects to etcd for the election of cluster `cluster_id`.
    pub async fn connect(
        endpoints: &[String],
        cluster_id: &str,
        timeout: Duration,
    ) -> Result<Election, EtcdError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(Duration::from_secs(2), timeout);
        let client = tokio::time::timeout(timeout, Client::connect(endpoints, Some(options)))
            .await
            .map_err(|_| unavailable("connect timed out"))?
            .map_err(unavailable)?;
        Ok(Election {
            kv: client.kv_client(),
            lease: client.lease_client(),
            key: view_key(cluster_id),
            timeout,
        })
    }

    pub fn key(&self) -> &str {
        &self.key
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

    /// The current view (`None`: no leader).
    pub async fn read_view(&self) -> Result<Option<View>, EtcdError> {
        let mut kv = self.kv.clone();
        let r = self.timed(kv.get(self.key.clone(), None)).await?;
        Ok(r.kvs().first().map(|kv| View {
            leader: String::from_utf8_lossy(kv.value()).into_owned(),
            version: u64::try_from(kv.create_revision()).unwrap_or(0),
        }))
    }

    /// Creates the leader key with `address` on a fresh lease if no leader holds it. `Ok(Err)`
    /// carries the view that holds it instead.
    pub async fn try_acquire(
        &self,
        address: &str,
    ) -> Result<Result<Leadership, Option<View>>, EtcdError> {
        let mut lease_client = self.lease.clone();
        let ttl = i64::try_from(LEASE_TTL.as_secs()).unwrap_or(5);
        let lease = self.timed(lease_client.grant(ttl, None)).await?.id();
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                self.key.clone(),
                address,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(self.key.clone(), None)]);
        let mut kv = self.kv.clone();
        let r = match self.timed(kv.txn(txn)).await {
            Ok(r) => r,
            Err(e) => {
                self.revoke(lease).await;
                return Err(e);
            }
        };
        if r.succeeded() {
            let revision = r.header().map_or(0, |h| h.revision());
            let view = View {
                leader: address.to_string(),
                version: u64::try_from(revision).unwrap_or(0),
            };
            return Ok(Ok(Leadership {
                view,
                lease,
                keeper: None,
            }));
        }
        self.revoke(lease).await;
        let observed = r.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| View {
                leader: String::from_utf8_lossy(kv.value()).into_owned(),
                version: u64::try_from(kv.create_revision()).unwrap_or(0),
            }),
            _ => None,
        });
        Ok(Err(observed))
    }

    async fn revoke(&self, lease: i64) {
        let mut lease_client = self.lease.clone();
        if let Err(e) = self.timed(lease_client.revoke(lease)).await {
            tracing::debug!("election: revoking lease {lease}: {e}");
        }
    }

    /// Extends the lease and checks that the key is still this view's. A call that etcd did
    /// not answer is tried again at once, up to [`RENEW_ATTEMPTS`] times: the client spreads
    /// calls over the members, and one member being down must not cost the lease.
    pub async fn renew(&self, held: &mut Leadership) -> Result<Renewal, EtcdError> {
        let mut attempt = 1;
        loop {
            match self.renew_once(held).await {
                Err(EtcdError::Unavailable(_)) if attempt < RENEW_ATTEMPTS => attempt += 1,
                other => return other,
            }
        }
    }

    async fn renew_once(&self, held: &mut Leadership) -> Result<Renewal, EtcdError> {
        let sent = Instant::now();
        let ttl = match self.keep_alive_once(held).await {
            Ok(ttl) => ttl,
            Err(e) => {
                held.keeper = None;
                return Err(e);
            }
        };
        if ttl <= 0 {
            return Ok(Renewal::Lost);
        }
        match self.read_view().await? {
            Some(v) if v == held.view => Ok(Renewal::Held {
                until: sent + LEASE_TTL,
            }),
            _ => Ok(Renewal::Lost),
        }
    }

    /// Sends one keep-alive and returns the lease's remaining TTL (0: the lease is gone).
    async fn keep_alive_once(&self, held: &mut Leadership) -> Result<i64, EtcdError> {
        let Some((keeper, stream)) = held.keeper.as_mut() else {
            // Opening the stream sends the first keep-alive and reads its answer.
            let mut lease_client = self.lease.clone();
            return match self.timed(lease_client.keep_alive(held.lease)).await {
                Ok(opened) => {
                    held.keeper = Some(opened);
                    Ok(1)
                }
                Err(EtcdError::Unavailable(why)) if why.contains("lease not found") => Ok(0),
                Err(e) => Err(e),
            };
        };
        self.timed(keeper.keep_alive()).await?;
        match self.timed(stream.message()).await? {
            Some(r) => Ok(r.ttl()),
            None => Err(unavailable("the keep-alive stream closed")),
        }
    }

    /// Gives leadership up: deletes the key if it is still this view's and revokes the lease.
    pub async fn release(&self, held: Leadership) {
        let txn = Txn::new()
            .when([Fence {
                key: self.key.clone(),
                version: held.view.version,
            }
            .compare()])
            .and_then([TxnOp::delete(self.key.clone(), None)]);
        let mut kv = self.kv.clone();
        if let Err(e) = self.timed(kv.txn(txn)).await {
            tracing::debug!("election: releasing the leader key: {e}");
        }
        self.revoke(held.lease).await;
    }

    /// The fence of `view` for the op-log's commits.
    pub fn fence(&self, view: &View) -> Fence {
        Fence {
            key: self.key.clone(),
            version: view.version,
        }
    }
}
