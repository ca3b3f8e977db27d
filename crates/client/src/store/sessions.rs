//! Get and put sessions (upstream's layer-wise KV calls): one master round trip up front, then
//! any number of ranged transfers without the master, then one round trip to finish.
//!
//! - A **get session** caches each key's replicas and read lease
//!   ([`StoreClient::batch_get_session_start`]); [`StoreClient::get_ranges_in_session`] reads
//!   ranges from the cached replicas (a key without a session is looked up on the spot) until
//!   the lease runs out (then LEASE_EXPIRED); [`StoreClient::batch_get_session_end`] forgets
//!   them (no master call).
//! - A **put session** reserves each object with BatchPutStart
//!   ([`StoreClient::batch_put_session_start`]); [`StoreClient::put_ranges_in_session`] writes
//!   ranges into every memory replica; [`StoreClient::batch_put_session_end`] makes the objects
//!   visible (BatchPutEnd, without a checksum: no one saw the whole object), or
//!   [`StoreClient::batch_put_session_revoke`] drops them. End and revoke first refuse new
//!   range writes and wait for the running ones, so an object never turns visible half-written
//!   by a concurrent writer. `close()` revokes every open put session.

use mooncake_common::{ObjectMeta, ReplicaDescriptor, ReplicateConfig};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ranges::{Located, RangeRead, RangeWrite};
use super::{StoreClient, StoreError};
use crate::master_client::WriteMode;

/// A put session's replicas and object size, as a range write needs them.
type SessionTarget = (Arc<Vec<ReplicaDescriptor>>, u64);

/// Open sessions one client keeps at most (each holds a few hundred bytes).
pub const MAX_SESSIONS: usize = 1 << 20;

/// How long ending a put session waits for range writes of the key that are still running
/// (every transfer has its own, shorter, deadline).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug)]
struct PutSession {
    replicas: Arc<Vec<ReplicaDescriptor>>,
    size: u64,
    /// Range writes of this key running now.
    inflight: usize,
    /// End or revoke has begun: no new range writes.
    sealed: bool,
}

/// The sessions of one client.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    gets: Mutex<HashMap<String, Arc<Located>>>,
    puts: Mutex<HashMap<String, PutSession>>,
}

/// Counts one running range write of each key until dropped (also on cancellation).
struct Writing<'a> {
    sessions: &'a Sessions,
    keys: Vec<String>,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut puts = self.sessions.puts.lock();
        for key in &self.keys {
            if let Some(session) = puts.get_mut(key) {
                session.inflight = session.inflight.saturating_sub(1);
            }
        }
    }
}

fn too_many() -> StoreError {
    StoreError::InvalidParams(format!("more than {MAX_SESSIONS} sessions are open"))
}

impl StoreClient {
    /// Starts (or renews) a get session for every key: one BatchGetReplicaList, whose replicas
    /// and lease later range reads use. One result per key: the object's size, or why it
    /// cannot be read (OBJECT_NOT_FOUND, …; such a key gets no session).
    pub async fn batch_get_session_start(&self, keys: &[&str]) -> Vec<Result<u64, StoreError>> {
        let asked = Instant::now();
        let located = match self.locate_batch(keys, false).await {
            Ok(located) => located,
            Err(error) => return keys.iter().map(|_| Err(error.clone())).collect(),
        };
        let mut gets = self.inner.sessions.gets.lock();
        keys.iter()
            .zip(located)
            .map(|(key, entry)| {
                let (size, response) = entry?;
                if gets.len() >= MAX_SESSIONS && !gets.contains_key(*key) {
                    // Sessions whose lease ran out can only fail: make room from them first.
                    gets.retain(|_, session| session.lease_expired().is_none());
                    if gets.len() >= MAX_SESSIONS {
                        return Err(too_many());
                    }
                }
                let session = Located {
                    size,
                    response,
                    asked,
                };
                gets.insert(key.to_string(), Arc::new(session));
                Ok(size)
            })
            .collect()
    }

    /// Ends the get sessions of `keys` (no master call); returns how many were open.
    pub fn batch_get_session_end(&self, keys: &[&str]) -> usize {
        let mut gets = self.inner.sessions.gets.lock();
        keys.iter().filter(|k| gets.remove(**k).is_some()).count()
    }

    /// Reads ranges of objects (`fragments[f].key` indexes `keys`) from the replicas their get
    /// sessions cached, in one transfer batch; keys without a session are looked up now (one
    /// BatchGetReplicaList for all of them). A session whose lease ran out fails its ranges
    /// with LEASE_EXPIRED: start a new one. One result per fragment.
    pub async fn get_ranges_in_session(
        &self,
        keys: &[&str],
        fragments: &mut [RangeRead<'_>],
    ) -> Vec<Result<u64, StoreError>> {
        let cached: Vec<Option<Arc<Located>>> = {
            let gets = self.inner.sessions.gets.lock();
            keys.iter().map(|k| gets.get(*k).cloned()).collect()
        };
        let missing: Vec<&str> = keys
            .iter()
            .zip(&cached)
            .filter(|(_, c)| c.is_none())
            .map(|(k, _)| *k)
            .collect();
        let asked = Instant::now();
        let mut looked_up = if missing.is_empty() {
            Vec::new()
        } else {
            match self.locate_batch(&missing, false).await {
                Ok(located) => located
                    .into_iter()
                    .map(|entry| {
                        entry.map(|(size, response)| {
                            Arc::new(Located {
                                size,
                                response,
                                asked,
                            })
                        })
                    })
                    .collect(),
                Err(error) => missing.iter().map(|_| Err(error.clone())).collect(),
            }
        }
        .into_iter();
        let located: Vec<Result<Arc<Located>, StoreError>> = cached
            .into_iter()
            .map(|c| match c {
                Some(session) => Ok(session),
                None => looked_up
                    .next()
                    .unwrap_or_else(|| Err(StoreError::InvalidParams("lost lookup".into()))),
            })
            .collect();
        let refs: Vec<Result<&Located, StoreError>> = located
            .iter()
            .map(|l| l.as_deref().map_err(Clone::clone))
            .collect();
        self.read_ranges(keys, &refs, fragments).await
    }

    /// Starts a put session for every `(key, size)`: one BatchPutStart reserves the objects
    /// (not yet visible). One result per item: `Ok`, OBJECT_ALREADY_EXISTS for a key that
    /// exists, REPLICA_IS_NOT_READY for a key another client is writing, `InvalidParams` for a
    /// key with a session open here.
    pub async fn batch_put_session_start(
        &self,
        items: &[(&str, u64)],
        config: &ReplicateConfig,
    ) -> Vec<Result<(), StoreError>> {
        if let Err(error) = self.check_open() {
            return items.iter().map(|_| Err(error.clone())).collect();
        }
        let mut results: Vec<Option<Result<(), StoreError>>> = vec![None; items.len()];
        let mut asked = Vec::new();
        {
            let puts = self.inner.sessions.puts.lock();
            for (i, (key, _)) in items.iter().enumerate() {
                if puts.contains_key(*key) {
                    results[i] = Some(Err(StoreError::InvalidParams(format!(
                        "a put session for {key:?} is already open"
                    ))));
                } else if puts.len() + asked.len() >= MAX_SESSIONS {
                    results[i] = Some(Err(too_many()));
                } else {
                    asked.push(i);
                }
            }
        }
        if !asked.is_empty() {
            let keys: Vec<String> = asked.iter().map(|&i| items[i].0.to_string()).collect();
            let sizes: Vec<u64> = asked.iter().map(|&i| items[i].1).collect();
            let inner = &self.inner;
            let started = inner
                .master
                .batch_write_start(
                    WriteMode::Put,
                    inner.client_id,
                    keys,
                    sizes,
                    config,
                    self.tenant(),
                )
                .await;
            match started {
                Ok(started) if started.len() == asked.len() => {
                    let mut puts = inner.sessions.puts.lock();
                    for (&i, answer) in asked.iter().zip(started) {
                        results[i] = Some(match answer {
                            Ok(replicas) => {
                                let session = PutSession {
                                    replicas: Arc::new(replicas),
                                    size: items[i].1,
                                    inflight: 0,
                                    sealed: false,
                                };
                                puts.insert(items[i].0.to_string(), session);
                                Ok(())
                            }
                            Err(code) => Err(code.into()),
                        });
                    }
                }
                Ok(_) => {
                    for &i in &asked {
                        results[i] = Some(Err(StoreError::InvalidParams(
                            "master answered a batch of the wrong length".into(),
                        )));
                    }
                }
                Err(error) => {
                    for &i in &asked {
                        results[i] = Some(Err(error.clone().into()));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(StoreError::InvalidParams("lost entry".into()))))
            .collect()
    }

    /// Writes ranges (`fragments[f].key` indexes `keys`) into the objects of open put sessions:
    /// each range to every memory replica, all in one transfer batch. One result per fragment:
    /// its length, or why it failed (no open session, a session being ended, a range past the
    /// end of the object).
    pub async fn put_ranges_in_session(
        &self,
        keys: &[&str],
        fragments: &[RangeWrite<'_>],
    ) -> Vec<Result<u64, StoreError>> {
        let mut writing = Writing {
            sessions: &self.inner.sessions,
            keys: Vec::new(),
        };
        let targets: Vec<Result<SessionTarget, StoreError>> = {
            let mut puts = self.inner.sessions.puts.lock();
            keys.iter()
                .map(|key| match puts.get_mut(*key) {
                    Some(session) if !session.sealed => {
                        session.inflight += 1;
                        writing.keys.push(key.to_string());
                        Ok((Arc::clone(&session.replicas), session.size))
                    }
                    Some(_) => Err(StoreError::InvalidParams(format!(
                        "the put session of {key:?} is being ended"
                    ))),
                    None => Err(StoreError::InvalidParams(format!(
                        "no put session is open for {key:?}"
                    ))),
                })
                .collect()
        };
        let refs: Vec<Result<(&[ReplicaDescriptor], u64), StoreError>> = targets
            .iter()
            .map(|t| match t {
                Ok((replicas, size)) => Ok((replicas.as_slice(), *size)),
                Err(error) => Err(error.clone()),
            })
            .collect();
        let results = self.write_ranges(&refs, fragments).await;
        drop(writing);
        results
    }

    /// Ends the put sessions of `keys`: waits for their running range writes, then one
    /// BatchPutEnd makes the objects visible. One result per key. A key whose end failed keeps
    /// its session (retry the end, or revoke it).
    pub async fn batch_put_session_end(&self, keys: &[&str]) -> Vec<Result<(), StoreError>> {
        self.finish_put_sessions(keys, true).await
    }

    /// Revokes the put sessions of `keys` (BatchPutRevoke): the reserved objects are dropped.
    pub async fn batch_put_session_revoke(&self, keys: &[&str]) -> Vec<Result<(), StoreError>> {
        self.finish_put_sessions(keys, false).await
    }

    /// Revokes every open put session (at close).
    pub(super) async fn revoke_all_put_sessions(&self) {
        let keys: Vec<String> = self.inner.sessions.puts.lock().keys().cloned().collect();
        if keys.is_empty() {
            return;
        }
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let _ = self.finish_put_sessions(&refs, false).await;
    }

    async fn finish_put_sessions(&self, keys: &[&str], end: bool) -> Vec<Result<(), StoreError>> {
        let sessions = &self.inner.sessions;
        let mut results: Vec<Option<Result<(), StoreError>>> = vec![None; keys.len()];
        let mut sealed = Vec::new();
        {
            let mut puts = sessions.puts.lock();
            for (i, key) in keys.iter().enumerate() {
                match puts.get_mut(*key) {
                    Some(session) if !session.sealed => {
                        session.sealed = true;
                        sealed.push(i);
                    }
                    Some(_) => {
                        results[i] = Some(Err(StoreError::InvalidParams(format!(
                            "the put session of {key:?} is already being ended"
                        ))))
                    }
                    None => {
                        results[i] = Some(Err(StoreError::InvalidParams(format!(
                            "no put session is open for {key:?}"
                        ))))
                    }
                }
            }
        }
        // Wait out range writes that started before the seal.
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        loop {
            let busy = {
                let puts = sessions.puts.lock();
                sealed
                    .iter()
                    .any(|&i| puts.get(keys[i]).is_some_and(|s| s.inflight > 0))
            };
            if !busy || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if sealed.is_empty() {
            return collect(results);
        }
        let inner = &self.inner;
        let (client, tenant) = (inner.client_id, self.tenant());
        let names: Vec<String> = sealed.iter().map(|&i| keys[i].to_string()).collect();
        let answers = if end {
            let metas = names
                .iter()
                .map(|key| ObjectMeta {
                    key: key.clone(),
                    object_checksum: None,
                })
                .collect();
            inner
                .master
                .batch_write_end(WriteMode::Put, client, metas, tenant)
                .await
        } else {
            inner
                .master
                .batch_write_revoke(WriteMode::Put, client, names.clone(), tenant)
                .await
        };
        let mut puts = sessions.puts.lock();
        match answers {
            Ok(answers) if answers.len() == sealed.len() => {
                for (&i, answer) in sealed.iter().zip(answers) {
                    let keep = end && answer.is_err();
                    if keep {
                        // A failed end keeps the session for a retry or a revoke.
                        if let Some(session) = puts.get_mut(keys[i]) {
                            session.sealed = false;
                        }
                    } else {
                        puts.remove(keys[i]);
                    }
                    results[i] = Some(answer.map_err(StoreError::from));
                }
            }
            other => {
                let error = match other {
                    Err(error) => StoreError::from(error),
                    Ok(_) => StoreError::InvalidParams(
                        "master answered a batch of the wrong length".into(),
                    ),
                };
                for &i in &sealed {
                    if let Some(session) = puts.get_mut(keys[i]) {
                        session.sealed = false;
                    }
                    results[i] = Some(Err(error.clone()));
                }
            }
        }
        collect(results)
    }
}

fn collect(results: Vec<Option<Result<(), StoreError>>>) -> Vec<Result<(), StoreError>> {
    results
        .into_iter()
        .map(|r| r.unwrap_or(Err(StoreError::InvalidParams("lost entry".into()))))
        .collect()
}
