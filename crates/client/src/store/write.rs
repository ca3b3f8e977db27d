//! Writes: the two-phase put and upsert, one object or a batch.
//!
//! Every write is start → write leg → end, or revoke on any failure; [`WriteMode`] picks put's
//! or upsert's master requests (built in [`crate::MasterClient`]). The write leg:
//! - `write_replicas` (one object) and `write_many` (a batch) pin the caller's memory and move
//!   every replica in one transfer batch, checksumming the first replica's bytes on the way;
//! - `write_target` says where one replica's bytes go (the one place that knows how a replica
//!   kind is written: memory today).

use mooncake_common::{ErrorCode, ObjectMeta, ReplicaDescriptor, ReplicaKind, ReplicateConfig};
use mooncake_transfer::{crc32c_combine, Endpoint, TransferError, TransferRequest};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::addressing::split_address;
use super::{checksum_of, PutOutcome, StoreClient, StoreError};
use crate::master_client::{MasterError, WriteMode};

/// Where one replica's bytes are written: the endpoint serving its segment, the segment (region)
/// id there and the offset in it.
type WriteTarget = (Arc<Endpoint>, u64, u64);

/// A failed write leg: the error the caller sees, and the endpoints (as the master knows them)
/// whose transfers failed for reasons of their node.
pub(super) struct LegFailure {
    pub(super) error: StoreError,
    pub(super) peers: Vec<Arc<str>>,
}

impl LegFailure {
    /// Adds `endpoint` when `error` lies with its node.
    fn add_peer(&mut self, error: &TransferError, endpoint: &Option<Arc<str>>) {
        if let (true, Some(endpoint)) = (error.is_peer_failure(), endpoint) {
            if !self.peers.contains(endpoint) {
                self.peers.push(endpoint.clone());
            }
        }
    }
}

impl From<StoreError> for LegFailure {
    fn from(error: StoreError) -> LegFailure {
        LegFailure {
            error,
            peers: Vec::new(),
        }
    }
}

/// How one write attempt failed: `Retry` when its nodes were at fault and the key is free again.
enum Attempt {
    Retry(StoreError),
    Final(StoreError),
}

/// What [`StoreClient::write_batch`] writes a second time: item indices, and the endpoints to
/// report first.
#[derive(Default)]
struct BatchRetry {
    items: Vec<usize>,
    peers: Vec<Arc<str>>,
}

/// The endpoint string of a memory replica, as its segment was mounted.
fn endpoint_text(replica: &ReplicaDescriptor) -> Option<Arc<str>> {
    match &replica.kind {
        ReplicaKind::Memory(memory) => Some(memory.transport_endpoint.clone()),
        _ => None,
    }
}

impl StoreClient {
    /// Stores `value` under `key` unless the key exists or is being written.
    pub async fn put(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
    ) -> Result<PutOutcome, StoreError> {
        self.put_parts(key, &[value], config).await
    }

    /// [`StoreClient::put`] that also says how many replicas it wrote: the number the master
    /// placed, which may be fewer than `config.replica_num` (one per node at most, and only
    /// where there is room); 0 when the key was already present.
    pub async fn put_counted(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
    ) -> Result<(PutOutcome, usize), StoreError> {
        self.write_parts_counted(WriteMode::Put, key, &[value], config)
            .await
    }

    /// Stores the concatenation of `parts` (no concatenation copy is made).
    pub async fn put_parts(
        &self,
        key: &str,
        parts: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Result<PutOutcome, StoreError> {
        self.write_parts(WriteMode::Put, key, parts, config).await
    }

    /// Stores many objects: one PutStart batch, one transfer batch, one PutEnd batch.
    pub async fn put_batch(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<PutOutcome, StoreError>> {
        self.write_batch(WriteMode::Put, items, config).await
    }

    /// Stores `value` under `key`, replacing an existing value (upstream's `upsert`). The key
    /// is unreadable between the start and the end; on any failure the write is revoked.
    pub async fn upsert(
        &self,
        key: &str,
        value: &[u8],
        config: &ReplicateConfig,
    ) -> Result<(), StoreError> {
        self.upsert_parts(key, &[value], config).await
    }

    /// [`StoreClient::upsert`] of the concatenation of `parts`.
    pub async fn upsert_parts(
        &self,
        key: &str,
        parts: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Result<(), StoreError> {
        self.write_parts(WriteMode::Upsert, key, parts, config)
            .await
            .map(|_| ())
    }

    /// Upserts many objects: one start batch, one transfer batch, one end batch.
    pub async fn upsert_batch(
        &self,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<(), StoreError>> {
        self.write_batch(WriteMode::Upsert, items, config)
            .await
            .into_iter()
            .map(|r| r.map(|_| ()))
            .collect()
    }

    /// The two-phase write of the concatenation of `parts` shared by put and upsert: start
    /// (allocate) → write every replica → end, or revoke on any failure. A put of a key that
    /// exists (OBJECT_ALREADY_EXISTS) is `AlreadyPresent`; of a key another write holds in
    /// flight, the error REPLICA_IS_NOT_READY (nothing stored); an upsert that succeeds is
    /// `Stored`.
    ///
    /// When a replica's transfer fails for reasons of its node (see
    /// [`TransferError::is_peer_failure`]) and the revoke succeeded, the node's endpoint is
    /// reported to the master (which stops placing there) and the write starts once more on a
    /// new allocation. Success is reported only after every replica of an allocation was
    /// written and ended.
    pub async fn write_parts(
        &self,
        mode: WriteMode,
        key: &str,
        parts: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Result<PutOutcome, StoreError> {
        self.write_parts_counted(mode, key, parts, config)
            .await
            .map(|(outcome, _)| outcome)
    }

    /// [`StoreClient::write_parts`] with the number of replicas written (0 when none).
    async fn write_parts_counted(
        &self,
        mode: WriteMode,
        key: &str,
        parts: &[&[u8]],
        config: &ReplicateConfig,
    ) -> Result<(PutOutcome, usize), StoreError> {
        self.check_open()?;
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        // Refused before the master hears of it: nothing is reserved, no key left behind.
        self.check_staging(parts.iter().map(|p| (p.as_ptr() as usize, p.len())), total)?;
        match self.write_once(mode, key, parts, total, config).await {
            Err(Attempt::Retry(_)) => {
                self.inner
                    .stats
                    .write_retries
                    .fetch_add(1, Ordering::Relaxed);
                match self.write_once(mode, key, parts, total, config).await {
                    Err(Attempt::Retry(error) | Attempt::Final(error)) => Err(error),
                    Ok(outcome) => Ok(outcome),
                }
            }
            Err(Attempt::Final(error)) => Err(error),
            Ok(outcome) => Ok(outcome),
        }
    }

    /// One start → write → end (or revoke) of [`StoreClient::write_parts`]. A write leg that
    /// failed for reasons of its nodes reports them and is `Attempt::Retry` when the revoke
    /// went through (the key is free again). With the number of replicas written.
    async fn write_once(
        &self,
        mode: WriteMode,
        key: &str,
        parts: &[&[u8]],
        total: u64,
        config: &ReplicateConfig,
    ) -> Result<(PutOutcome, usize), Attempt> {
        let inner = &self.inner;
        let (master, client, tenant) = (&inner.master, inner.client_id, self.tenant());
        let replicas = match master
            .write_start(mode, client, key, total, config, tenant)
            .await
        {
            Ok(replicas) => replicas,
            Err(MasterError::Master(ErrorCode::OBJECT_ALREADY_EXISTS))
                if mode == WriteMode::Put =>
            {
                return Ok((PutOutcome::AlreadyPresent, 0))
            }
            Err(error) => return Err(Attempt::Final(error.into())),
        };
        match self.write_replicas(&replicas, parts, total).await {
            Ok(crc) => {
                let checksum = inner
                    .config
                    .verify_checksums
                    .then(|| crc.map_or_else(|| checksum_of(parts), u64::from));
                let meta = ObjectMeta {
                    key: key.to_string(),
                    object_checksum: checksum,
                };
                master
                    .write_end(mode, client, meta, tenant)
                    .await
                    .map_err(|e| Attempt::Final(e.into()))?;
                Ok((PutOutcome::Stored, replicas.len()))
            }
            Err(failure) => {
                let revoked = master.write_revoke(mode, client, key, tenant).await.is_ok();
                self.report_peers(&failure.peers).await;
                Err(if revoked && !failure.peers.is_empty() {
                    Attempt::Retry(failure.error)
                } else {
                    Attempt::Final(failure.error)
                })
            }
        }
    }

    /// Tells the master about every endpoint a transfer failed to (errors are ignored: a
    /// master without the method, or unreachable, only means placement learns later).
    pub(super) async fn report_peers(&self, peers: &[Arc<str>]) {
        let (master, client) = (&self.inner.master, self.inner.client_id);
        for endpoint in peers {
            let _ = master.report_transfer_failure(client, endpoint).await;
        }
    }

    /// The batch form of [`StoreClient::write_parts`]: one start batch, one transfer batch for
    /// every replica of every started key, one end batch and one revoke batch. One result per
    /// item, in order. Items whose transfer failed for reasons of a node (and were revoked)
    /// are written once more, as one batch, after the nodes were reported.
    pub async fn write_batch(
        &self,
        mode: WriteMode,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> Vec<Result<PutOutcome, StoreError>> {
        if let Err(error) = self.check_open() {
            return items.iter().map(|_| Err(error.clone())).collect();
        }
        let (mut results, retry) = self.write_batch_once(mode, items, config).await;
        self.report_peers(&retry.peers).await;
        if retry.items.is_empty() {
            return results;
        }
        let stats = &self.inner.stats;
        stats
            .write_retries
            .fetch_add(retry.items.len() as u64, Ordering::Relaxed);
        let again: Vec<(&str, &[u8])> = retry.items.iter().map(|&i| items[i]).collect();
        let (second, retry_again) = self.write_batch_once(mode, &again, config).await;
        self.report_peers(&retry_again.peers).await;
        for (&i, result) in retry.items.iter().zip(second) {
            results[i] = result;
        }
        results
    }

    /// One pass of [`StoreClient::write_batch`]: the results, and which items may be retried
    /// (with the endpoints to report first).
    async fn write_batch_once(
        &self,
        mode: WriteMode,
        items: &[(&str, &[u8])],
        config: &ReplicateConfig,
    ) -> (Vec<Result<PutOutcome, StoreError>>, BatchRetry) {
        let inner = &self.inner;
        let (master, client, tenant) = (&inner.master, inner.client_id, self.tenant());
        let keys: Vec<String> = items.iter().map(|(k, _)| k.to_string()).collect();
        let mut results: Vec<Option<Result<PutOutcome, StoreError>>> = vec![None; items.len()];
        // Items over the local_buffer_size cap are refused before the master hears of them.
        let mut asked = Vec::with_capacity(items.len());
        for (i, (_, value)) in items.iter().enumerate() {
            let range = (value.as_ptr() as usize, value.len());
            match self.check_staging(std::iter::once(range), value.len() as u64) {
                Ok(()) => asked.push(i),
                Err(error) => results[i] = Some(Err(error)),
            }
        }
        let asked_keys: Vec<String> = asked.iter().map(|&i| keys[i].clone()).collect();
        let lens: Vec<u64> = asked.iter().map(|&i| items[i].1.len() as u64).collect();
        let started = if asked.is_empty() {
            Vec::new()
        } else {
            match master
                .batch_write_start(mode, client, asked_keys, lens, config, tenant)
                .await
            {
                Ok(started) if started.len() == asked.len() => started,
                Ok(_) => {
                    let e = StoreError::InvalidParams(
                        "master answered a batch of the wrong length".into(),
                    );
                    for &i in &asked {
                        results[i] = Some(Err(e.clone()));
                    }
                    Vec::new()
                }
                Err(error) => {
                    for &i in &asked {
                        results[i] = Some(Err(error.clone().into()));
                    }
                    Vec::new()
                }
            }
        };
        let mut to_write = Vec::new();
        for (&i, start) in asked.iter().zip(started) {
            match start {
                Ok(replicas) => to_write.push((i, replicas)),
                Err(ErrorCode::OBJECT_ALREADY_EXISTS) if mode == WriteMode::Put => {
                    results[i] = Some(Ok(PutOutcome::AlreadyPresent))
                }
                Err(code) => results[i] = Some(Err(code.into())),
            }
        }
        let written = self.write_many(items, &to_write).await;
        let mut ended = Vec::new();
        let mut failed = Vec::new();
        let mut retry = BatchRetry::default();
        // CRC32C the engine computed while writing each item's first replica.
        let mut crcs: Vec<Option<u32>> = vec![None; items.len()];
        for ((i, _), outcome) in to_write.iter().zip(written) {
            match outcome {
                Ok(crc) => {
                    crcs[*i] = crc;
                    ended.push(*i)
                }
                Err(failure) => {
                    for peer in failure.peers.iter() {
                        if !retry.peers.contains(peer) {
                            retry.peers.push(peer.clone());
                        }
                    }
                    failed.push((*i, !failure.peers.is_empty()));
                    results[*i] = Some(Err(failure.error));
                }
            }
        }
        retry.items = self.revoke_failed(mode, &keys, &failed).await;
        if !ended.is_empty() {
            let metas: Vec<ObjectMeta> = ended
                .iter()
                .map(|&i| ObjectMeta {
                    key: keys[i].clone(),
                    object_checksum: inner
                        .config
                        .verify_checksums
                        .then(|| crcs[i].map_or_else(|| checksum_of(&[items[i].1]), u64::from)),
                })
                .collect();
            let each = master.batch_write_end(mode, client, metas, tenant).await;
            for (slot, &i) in ended.iter().enumerate() {
                results[i] = Some(match &each {
                    Ok(each) if each.len() == ended.len() => each[slot]
                        .map(|()| PutOutcome::Stored)
                        .map_err(StoreError::from),
                    Ok(_) => Err(StoreError::InvalidParams(
                        "the master answered an end batch of the wrong length".into(),
                    )),
                    Err(error) => Err(error.clone().into()),
                });
            }
        }
        let results = results
            .into_iter()
            .map(|r| r.unwrap_or(Err(StoreError::InvalidParams("lost batch entry".into()))))
            .collect();
        (results, retry)
    }

    /// Revokes the items of `failed` (`(index, failed for reasons of a node)`) in one batch;
    /// returns the indices that may be written again: a node failure whose revoke succeeded.
    async fn revoke_failed(
        &self,
        mode: WriteMode,
        keys: &[String],
        failed: &[(usize, bool)],
    ) -> Vec<usize> {
        if failed.is_empty() {
            return Vec::new();
        }
        let (master, client, tenant) = (&self.inner.master, self.inner.client_id, self.tenant());
        let revoke: Vec<String> = failed.iter().map(|&(i, _)| keys[i].clone()).collect();
        match master
            .batch_write_revoke(mode, client, revoke, tenant)
            .await
        {
            Ok(each) if each.len() == failed.len() => failed
                .iter()
                .zip(each)
                .filter(|((_, node_failed), revoked)| *node_failed && revoked.is_ok())
                .map(|((i, _), _)| *i)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Writes `parts` into every memory replica of `replicas`. With checksums on, returns the
    /// CRC32C of the bytes the transfer engine computed while writing the first replica (each
    /// part on the thread that copied it, while it was in cache); `None` when nothing was
    /// checksummed (no memory replica, or nothing but empty parts).
    pub(super) async fn write_replicas(
        &self,
        replicas: &[ReplicaDescriptor],
        parts: &[&[u8]],
        total: u64,
    ) -> Result<Option<u32>, LegFailure> {
        let pins = match self.pin_all(parts.iter().map(|p| (p.as_ptr() as usize, p.len()))) {
            Ok(pins) => pins,
            Err(StoreError::Transfer(TransferError::Overlap { .. })) => {
                // Another operation has these bytes registered right now (e.g. two puts of one
                // buffer): write from a private copy instead.
                let copies: Vec<Vec<u8>> = parts.iter().map(|p| p.to_vec()).collect();
                let borrowed: Vec<&[u8]> = copies.iter().map(|c| c.as_slice()).collect();
                return Box::pin(self.write_replicas(replicas, &borrowed, total)).await;
            }
            Err(error) => return Err(error.into()),
        };
        let mut requests = Vec::new();
        // The endpoint string each request writes to (what the master knows the segment by).
        let mut targets = Vec::new();
        // Indices of the checksummed requests, in byte order (the first memory replica's parts).
        let mut summed = Vec::new();
        for replica in replicas {
            let Some((endpoint, segment, mut offset)) = self.write_target(replica, total)? else {
                continue;
            };
            let checksum = self.inner.config.verify_checksums && summed.is_empty();
            for part in parts.iter().filter(|p| !p.is_empty()) {
                let mut request = TransferRequest::write(
                    part.as_ptr(),
                    part.len() as u64,
                    &endpoint,
                    segment,
                    offset,
                );
                if checksum {
                    request.checksum = true;
                    summed.push(requests.len());
                }
                requests.push(request);
                targets.push(endpoint_text(replica));
                offset += part.len() as u64;
            }
        }
        let batch = self.inner.engine.submit(&requests);
        let results = batch.wait_async().await;
        drop(pins);
        let mut failure: Option<LegFailure> = None;
        for (result, target) in results.into_iter().zip(&targets) {
            if let Err(error) = result {
                failure
                    .get_or_insert_with(|| LegFailure::from(StoreError::from(error.clone())))
                    .add_peer(&error, target);
            }
        }
        if let Some(failure) = failure {
            return Err(failure);
        }
        let mut crc: Option<u32> = None;
        for index in summed {
            let (Some(piece), len) = (batch.checksum(index), requests[index].len_bytes) else {
                return Ok(None);
            };
            crc = Some(crc.map_or(piece, |before| crc32c_combine(before, piece, len)));
        }
        Ok(crc)
    }

    /// Writes `items[i]` to `replicas` for every `(i, replicas)`; one result per pair, with the
    /// CRC32C of the first replica's write when checksums are on (see `write_replicas`).
    async fn write_many(
        &self,
        items: &[(&str, &[u8])],
        to_write: &[(usize, Vec<ReplicaDescriptor>)],
    ) -> Vec<Result<Option<u32>, LegFailure>> {
        let pins = match self.pin_all(to_write.iter().map(|(i, _)| {
            let value = items[*i].1;
            (value.as_ptr() as usize, value.len())
        })) {
            Ok(pins) => pins,
            Err(StoreError::Transfer(TransferError::Overlap { .. })) => {
                // Bytes registered by a concurrent operation: write from private copies.
                let copies: Vec<(String, Vec<u8>)> = items
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_vec()))
                    .collect();
                let borrowed: Vec<(&str, &[u8])> = copies
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_slice()))
                    .collect();
                return Box::pin(self.write_many(&borrowed, to_write)).await;
            }
            Err(error) => return to_write.iter().map(|_| Err(error.clone().into())).collect(),
        };
        let mut requests = Vec::new();
        let mut owner = Vec::new();
        let mut targets = Vec::new();
        let mut early: Vec<Option<LegFailure>> = (0..to_write.len()).map(|_| None).collect();
        // The request whose checksum stands for each slot's value.
        let mut summed: Vec<Option<usize>> = vec![None; to_write.len()];
        for (slot, (i, replicas)) in to_write.iter().enumerate() {
            let value = items[*i].1;
            for replica in replicas {
                match self.write_target(replica, value.len() as u64) {
                    Ok(None) => {}
                    Ok(Some((endpoint, segment, offset))) => {
                        let mut request = TransferRequest::write(
                            value.as_ptr(),
                            value.len() as u64,
                            &endpoint,
                            segment,
                            offset,
                        );
                        if self.inner.config.verify_checksums && summed[slot].is_none() {
                            request.checksum = true;
                            summed[slot] = Some(requests.len());
                        }
                        requests.push(request);
                        owner.push(slot);
                        targets.push(endpoint_text(replica));
                    }
                    Err(error) => early[slot] = Some(error.into()),
                }
            }
        }
        let batch = self.inner.engine.submit(&requests);
        let results = batch.wait_async().await;
        drop(pins);
        for ((slot, result), target) in owner.into_iter().zip(results).zip(&targets) {
            if let Err(error) = result {
                early[slot]
                    .get_or_insert_with(|| LegFailure::from(StoreError::from(error.clone())))
                    .add_peer(&error, target);
            }
        }
        early
            .into_iter()
            .zip(summed)
            .map(|(e, summed)| match e {
                Some(error) => Err(error),
                None => Ok(summed.and_then(|index| batch.checksum(index))),
            })
            .collect()
    }

    /// Where the `len` bytes of an object go for `replica`: `None` for a kind this client does
    /// not write (only memory replicas are written), an error when the master allocated another
    /// size or the endpoint does not parse.
    fn write_target(
        &self,
        replica: &ReplicaDescriptor,
        len: u64,
    ) -> Result<Option<WriteTarget>, StoreError> {
        let ReplicaKind::Memory(memory) = &replica.kind else {
            return Ok(None);
        };
        if memory.size != len {
            return Err(StoreError::InvalidParams(format!(
                "master allocated {} bytes for a {len}-byte object",
                memory.size
            )));
        }
        let endpoint = self.endpoint_of(&memory.transport_endpoint)?;
        let (segment, offset) = split_address(memory.buffer_address);
        Ok(Some((endpoint, segment, offset)))
    }
}
