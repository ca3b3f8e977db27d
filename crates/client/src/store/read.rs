//! Reads: one master round trip (descriptors, checksum, read lease), then the read leg.
//!
//! The read leg, in the order a get runs it:
//! - [`StoreClient::replica_order`] ranks the readable replicas (`replica_rank`: this process,
//!   this host, remote);
//! - `read_planned` moves the bytes of many `(destination, replica)` pairs in one transfer
//!   batch; `read_request` turns one replica into its transfer (the one place that knows how a
//!   replica kind is read: memory today);
//! - `read_with_fallback` / `after_first_read` try the next replica when one fails;
//! - `check_read` refuses bytes that arrived after the lease ran out or whose CRC32C differs.

use mooncake_common::{GetReplicaListResponse, ReplicaDescriptor, ReplicaKind, ReplicaStatus};
use mooncake_transfer::{Endpoint, TransferError, TransferRequest};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::addressing::split_address;
use super::{checksum_of, StoreClient, StoreError};

/// A batch get's destination (capacity reserved, length set once filled), its size, and where
/// to read it from.
type PendingRead = (Vec<u8>, usize, GetReplicaListResponse);

/// One read of a batch: `(tag, destination address, length, replica, key)` (the key names the
/// object at a LOCAL_DISK replica's node).
pub(super) type PlannedRead<'k> = (usize, usize, usize, ReplicaDescriptor, &'k str);

impl StoreClient {
    /// Reads the object stored under `key`.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.check_open()?;
        let asked = Instant::now();
        let response = self.locate_pinned(key).await?;
        let read = self.get_located(key, asked, &response).await;
        self.finish_reads([key]);
        read
    }

    /// The read leg of [`StoreClient::get`] (and of ranged reads of disk-only objects).
    pub(super) async fn get_located(
        &self,
        key: &str,
        asked: Instant,
        response: &GetReplicaListResponse,
    ) -> Result<Vec<u8>, StoreError> {
        let size = object_size(key, response)?;
        // The object lands in memory this client allocates: the local_buffer_size cap applies.
        self.check_staging(std::iter::empty(), size)?;
        let len = usize::try_from(size)
            .map_err(|_| StoreError::InvalidParams("object too large".into()))?;
        // No zero fill: the transfer writes every byte, and the length is set only after it did.
        let mut out: Vec<u8> = Vec::with_capacity(len);
        let crc = self
            .read_with_fallback(key, response, out.as_mut_ptr() as usize, len, 0)
            .await?;
        // SAFETY: the read succeeded, so the engine wrote all `len` bytes of the capacity.
        unsafe { out.set_len(len) };
        self.check_read(key, response, asked, &out, crc)?;
        Ok(out)
    }

    /// Reads the object into `buffer`; returns its size.
    pub async fn get_into(&self, key: &str, buffer: &mut [u8]) -> Result<u64, StoreError> {
        self.check_open()?;
        let asked = Instant::now();
        let response = self.locate_pinned(key).await?;
        let read = self.get_into_located(key, asked, &response, buffer).await;
        self.finish_reads([key]);
        read
    }

    /// The read leg of [`StoreClient::get_into`].
    async fn get_into_located(
        &self,
        key: &str,
        asked: Instant,
        response: &GetReplicaListResponse,
        buffer: &mut [u8],
    ) -> Result<u64, StoreError> {
        let size = object_size(key, response)?;
        if (buffer.len() as u64) < size {
            return Err(StoreError::BufferTooSmall {
                buffer_bytes: buffer.len() as u64,
                object_bytes: size,
            });
        }
        self.check_staging(
            std::iter::once((buffer.as_ptr() as usize, size as usize)),
            size,
        )?;
        let destination = &mut buffer[..size as usize];
        match self.read_into(key, response, asked, destination).await {
            Err(StoreError::Transfer(TransferError::Overlap { .. })) => {
                // The buffer overlaps memory a concurrent operation registered: read privately.
                let mut private = vec![0u8; destination.len()];
                self.read_into(key, response, asked, &mut private).await?;
                destination.copy_from_slice(&private);
            }
            other => other?,
        }
        Ok(size)
    }

    /// Reads many objects: one master round trip, then one transfer batch.
    pub async fn get_batch(&self, keys: &[&str]) -> Vec<Result<Vec<u8>, StoreError>> {
        let asked = Instant::now();
        let located = match self.locate_batch(keys, true).await {
            Ok(located) => located,
            Err(error) => return keys.iter().map(|_| Err(error.clone())).collect(),
        };
        let pinned = pinned_keys(keys, &located);
        let mut buffers: Vec<Result<PendingRead, StoreError>> = located
            .into_iter()
            .map(|entry| {
                let (size, response) = entry?;
                self.check_staging(std::iter::empty(), size)?;
                let len = usize::try_from(size)
                    .map_err(|_| StoreError::InvalidParams("object too large".into()))?;
                // Filled by the transfer; its length is set only once every byte was written.
                Ok((Vec::with_capacity(len), len, response))
            })
            .collect();
        let first = self
            .read_first(buffers.iter_mut().enumerate().filter_map(|(i, entry)| {
                let (buf, len, response) = entry.as_mut().ok()?;
                Some((i, buf.as_mut_ptr() as usize, *len, &*response, keys[i]))
            }))
            .await;
        let mut results = Vec::with_capacity(keys.len());
        for (i, entry) in buffers.into_iter().enumerate() {
            let key = keys[i];
            let outcome = match entry {
                Err(error) => Err(error),
                Ok((mut buf, len, response)) => {
                    let addr = buf.as_mut_ptr() as usize;
                    let read = self
                        .after_first_read(key, first.get(&i), &response, addr, len)
                        .await;
                    read.and_then(|crc| {
                        // SAFETY: the read succeeded, so the engine wrote all `len` bytes.
                        unsafe { buf.set_len(len) };
                        self.check_read(key, &response, asked, &buf, crc)
                    })
                    .map(|()| buf)
                }
            };
            results.push(outcome);
        }
        self.finish_reads(pinned);
        results
    }

    /// Reads many objects into caller buffers (zero copy when they lie in registered memory):
    /// one master round trip, then one transfer batch. Returns each object's size. A buffer
    /// smaller than its object fails that key with `BufferTooSmall` and leaves the buffer as is.
    pub async fn get_batch_into(
        &self,
        keys: &[&str],
        buffers: &mut [&mut [u8]],
    ) -> Vec<Result<u64, StoreError>> {
        if keys.len() != buffers.len() {
            let e = StoreError::InvalidParams(format!(
                "{} keys but {} buffers",
                keys.len(),
                buffers.len()
            ));
            return keys.iter().map(|_| Err(e.clone())).collect();
        }
        self.get_batch_with(keys, |_| {
            buffers.iter_mut().map(|b| Some(&mut **b)).collect()
        })
        .await
    }

    /// Reads many objects into buffers the caller provides once their sizes are known: one
    /// master round trip, then `alloc` is called once with each key's size (`None` where the
    /// lookup failed) and returns one destination per key (`None` to skip the key), then one
    /// transfer batch. Returns each object's size (the bytes written at the start of its
    /// buffer). Lets bindings read straight into memory they allocate (a Python `bytes`), with
    /// no intermediate copy. A missing or short buffer fails that key and leaves it untouched.
    pub async fn get_batch_with<'b, F>(
        &self,
        keys: &[&str],
        alloc: F,
    ) -> Vec<Result<u64, StoreError>>
    where
        F: FnOnce(&[Option<u64>]) -> Vec<Option<&'b mut [u8]>>,
    {
        let asked = Instant::now();
        let located = match self.locate_batch(keys, true).await {
            Ok(located) => located,
            Err(error) => return keys.iter().map(|_| Err(error.clone())).collect(),
        };
        let pinned = pinned_keys(keys, &located);
        let sizes: Vec<Option<u64>> = located
            .iter()
            .map(|r| r.as_ref().ok().map(|(size, _)| *size))
            .collect();
        let mut buffers = alloc(&sizes);
        buffers.resize_with(keys.len(), || None);
        let checked: Vec<Result<(u64, GetReplicaListResponse), StoreError>> = located
            .into_iter()
            .zip(&buffers)
            .map(|(entry, buffer)| {
                let (size, response) = entry?;
                let available = buffer.as_ref().map_or(0, |b| b.len() as u64);
                if buffer.is_none() || available < size {
                    return Err(StoreError::BufferTooSmall {
                        buffer_bytes: available,
                        object_bytes: size,
                    });
                }
                let addr = buffer.as_ref().map_or(0, |b| b.as_ptr() as usize);
                self.check_staging(std::iter::once((addr, size as usize)), size)?;
                Ok((size, response))
            })
            .collect();
        let first = self
            .read_first(
                checked
                    .iter()
                    .zip(buffers.iter_mut())
                    .enumerate()
                    .filter_map(|(i, (entry, buffer))| {
                        let (size, response) = entry.as_ref().ok()?;
                        let buffer = buffer.as_mut()?;
                        Some((
                            i,
                            buffer.as_mut_ptr() as usize,
                            *size as usize,
                            response,
                            keys[i],
                        ))
                    }),
            )
            .await;
        let mut results = Vec::with_capacity(keys.len());
        for (i, entry) in checked.into_iter().enumerate() {
            let key = keys[i];
            let outcome = match (entry, &mut buffers[i]) {
                (Err(error), _) => Err(error),
                (Ok(_), None) => Err(StoreError::InvalidParams("no buffer".into())),
                (Ok((size, response)), Some(buffer)) => {
                    let out = &mut buffer[..size as usize];
                    if let Some(Err(StoreError::Transfer(TransferError::Overlap { .. }))) =
                        first.get(&i)
                    {
                        // The buffer overlaps memory a concurrent operation registered: read
                        // privately, then copy.
                        let mut private = vec![0u8; out.len()];
                        let read = self.read_into(key, &response, asked, &mut private).await;
                        results.push(read.map(|()| {
                            out.copy_from_slice(&private);
                            size
                        }));
                        continue;
                    }
                    let addr = out.as_mut_ptr() as usize;
                    let read = self
                        .after_first_read(key, first.get(&i), &response, addr, out.len())
                        .await;
                    read.and_then(|crc| self.check_read(key, &response, asked, out, crc))
                        .map(|()| size)
                }
            };
            results.push(outcome);
        }
        self.finish_reads(pinned);
        results
    }

    /// Preference order of readable replicas: ascending [`replica_rank`], ties in the master's
    /// order.
    pub(super) fn replica_order(&self, replicas: &[ReplicaDescriptor]) -> Vec<usize> {
        let me = self.inner.engine.endpoint();
        let mut ranked: Vec<(u8, usize)> = replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.status == ReplicaStatus::COMPLETE)
            .filter_map(|(i, r)| Some((self.replica_rank(r, me)?, i)))
            .collect();
        ranked.sort_by_key(|&(rank, i)| (rank, i));
        ranked.into_iter().map(|(_, i)| i).collect()
    }

    /// How close a replica is to this client (`me`): 0 this process (memcpy), 1 this host (shared
    /// memory), 2 remote (TCP), 3 an endpoint that does not parse, 4 a LOCAL_DISK replica (read
    /// through its node, `disk_read.rs`); `None` for a kind this client does not read.
    fn replica_rank(&self, replica: &ReplicaDescriptor, me: &Endpoint) -> Option<u8> {
        let memory = match &replica.kind {
            ReplicaKind::Memory(memory) => memory,
            ReplicaKind::LocalDisk(_) => return Some(4),
            _ => return None,
        };
        Some(match self.endpoint_of(&memory.transport_endpoint) {
            Ok(ep) if ep.instance_id() == me.instance_id() => 0,
            Ok(ep) if ep.host_id().is_some() && ep.host_id() == me.host_id() => 1,
            Ok(_) => 2,
            Err(_) => 3,
        })
    }

    /// One master round trip for a batch read: each key's size and replicas, in key order.
    /// `pinned`: with read pins (the caller releases every key located, `pins.rs`), else with
    /// the read lease (sessions, which keep descriptors across calls).
    pub(super) async fn locate_batch(
        &self,
        keys: &[&str],
        pinned: bool,
    ) -> Result<Vec<Result<(u64, GetReplicaListResponse), StoreError>>, StoreError> {
        self.check_open()?;
        let owned = || keys.iter().map(|k| k.to_string()).collect::<Vec<String>>();
        let master = &self.inner.master;
        let mut answer = None;
        if pinned && self.pins_served() {
            let release = self.take_finished_reads();
            let result = master
                .batch_get_replica_list_pinned(owned(), self.tenant(), release)
                .await;
            if !self.refuses_pins(&result) {
                answer = Some(result?);
            }
        }
        let responses = match answer {
            Some(responses) => responses,
            None => {
                master
                    .batch_get_replica_list(owned(), self.tenant())
                    .await?
            }
        };
        if responses.len() != keys.len() {
            return Err(StoreError::InvalidParams(
                "master answered a batch of the wrong length".into(),
            ));
        }
        Ok(responses
            .into_iter()
            .zip(keys)
            .map(|(r, key)| {
                let response = r.map_err(StoreError::from)?;
                Ok((object_size(key, &response)?, response))
            })
            .collect())
    }

    /// The first attempt of a batch read: every `(tag, destination, length, lookup)` from its
    /// preferred replica, all in one transfer batch (see `read_planned`).
    async fn read_first<'r>(
        &self,
        targets: impl Iterator<Item = (usize, usize, usize, &'r GetReplicaListResponse, &'r str)>,
    ) -> HashMap<usize, Result<Option<u32>, StoreError>> {
        let mut plan = Vec::new();
        for (tag, addr, len, response, key) in targets {
            if let Some(&first) = self.replica_order(&response.replicas).first() {
                plan.push((tag, addr, len, response.replicas[first].clone(), key));
            }
        }
        self.read_planned(&plan).await
    }

    /// The outcome of a key of a batch read after its first attempt (`first`, from
    /// `read_planned`): that attempt's checksum when it worked, else a read from the remaining
    /// replicas; when there are none, the first attempt's error (not a bare "no replica").
    async fn after_first_read(
        &self,
        key: &str,
        first: Option<&Result<Option<u32>, StoreError>>,
        response: &GetReplicaListResponse,
        addr: usize,
        len: usize,
    ) -> Result<Option<u32>, StoreError> {
        if let Some(Ok(crc)) = first {
            return Ok(*crc);
        }
        self.inner
            .stats
            .replica_fallbacks
            .fetch_add(1, Ordering::Relaxed);
        match self.read_with_fallback(key, response, addr, len, 1).await {
            Err(StoreError::NoReadableReplica { .. }) if first.is_some_and(|r| r.is_err()) => {
                match first {
                    Some(Err(error)) => Err(error.clone()),
                    _ => Err(StoreError::NoReadableReplica { key: String::new() }),
                }
            }
            other => other,
        }
    }

    async fn read_into(
        &self,
        key: &str,
        response: &GetReplicaListResponse,
        asked: Instant,
        out: &mut [u8],
    ) -> Result<(), StoreError> {
        let crc = self
            .read_with_fallback(key, response, out.as_mut_ptr() as usize, out.len(), 0)
            .await?;
        self.check_read(key, response, asked, out, crc)
    }

    /// Reads from the replicas in preference order, starting at position `skip`, until one works.
    ///
    /// `[addr, addr + len)` must be writable memory the caller owns for the whole call (it may be
    /// uninitialized: it is only written, by the transfer engine, and a success means every byte
    /// was written). Returns the bytes' CRC32C when checksums are verified (see `read_planned`).
    async fn read_with_fallback(
        &self,
        key: &str,
        response: &GetReplicaListResponse,
        addr: usize,
        len: usize,
        skip: usize,
    ) -> Result<Option<u32>, StoreError> {
        let order = self.replica_order(&response.replicas);
        let mut last_error = None;
        for &i in order.iter().skip(skip) {
            let plan = [(0usize, addr, len, response.replicas[i].clone(), key)];
            match self.read_planned(&plan).await.remove(&0) {
                Some(Ok(crc)) => return Ok(crc),
                Some(Err(error)) => {
                    self.inner
                        .stats
                        .replica_fallbacks
                        .fetch_add(1, Ordering::Relaxed);
                    last_error = Some(error);
                }
                None => {}
            }
        }
        Err(last_error.unwrap_or(StoreError::NoReadableReplica { key: String::new() }))
    }

    /// Reads each `(tag, destination address, length, replica)` in one transfer batch.
    pub(super) async fn read_planned(
        &self,
        plan: &[PlannedRead<'_>],
    ) -> HashMap<usize, Result<Option<u32>, StoreError>> {
        let mut results = HashMap::new();
        let mut staged = if plan
            .iter()
            .any(|(.., r, _)| matches!(r.kind, ReplicaKind::LocalDisk(_)))
        {
            self.stage_disk_reads(plan).await
        } else {
            Default::default()
        };
        let pins = match self.pin_all(plan.iter().map(|(_, addr, len, ..)| (*addr, *len))) {
            Ok(pins) => pins,
            Err(error) => {
                for (tag, ..) in plan {
                    results.insert(*tag, Err(error.clone()));
                }
                self.release_disk_loads(staged.loads);
                return results;
            }
        };
        let mut requests = Vec::new();
        let mut tags = Vec::new();
        let mut deadlines = HashMap::new();
        for (tag, addr, len, replica, _) in plan {
            let replica = match staged.by_tag.remove(tag) {
                Some(Ok((memory, deadline))) => {
                    deadlines.insert(*tag, deadline);
                    std::borrow::Cow::Owned(memory)
                }
                Some(Err(error)) => {
                    results.insert(*tag, Err(error));
                    continue;
                }
                None => std::borrow::Cow::Borrowed(replica),
            };
            match self.read_request(&replica, *addr, *len) {
                Ok(request) => {
                    requests.push(request);
                    tags.push(*tag);
                }
                Err(error) => {
                    results.insert(*tag, Err(error));
                }
            }
        }
        let batch = self.inner.engine.submit(&requests);
        let done = batch.wait_async().await;
        drop(pins);
        let finished = Instant::now();
        self.release_disk_loads(staged.loads);
        for (index, (tag, result)) in tags.into_iter().zip(done).enumerate() {
            let read = result.map(|()| batch.checksum(index));
            let read = match deadlines.get(&tag) {
                // The node may reuse the staging memory after the lease: the bytes are suspect.
                Some(deadline) if finished > *deadline => Err(StoreError::LeaseExpired {
                    elapsed_ms: 0,
                    lease_ms: 0,
                }),
                _ => read.map_err(StoreError::from),
            };
            results.insert(tag, read);
        }
        results
    }

    /// The transfer that reads `replica` into `[addr, addr + len)`. Only memory replicas are
    /// read (from their segment, at the replica's endpoint); any other kind is
    /// `NoReadableReplica`.
    fn read_request(
        &self,
        replica: &ReplicaDescriptor,
        addr: usize,
        len: usize,
    ) -> Result<TransferRequest, StoreError> {
        let ReplicaKind::Memory(memory) = &replica.kind else {
            return Err(StoreError::NoReadableReplica { key: String::new() });
        };
        let endpoint = self.endpoint_of(&memory.transport_endpoint)?;
        let (segment, offset) = split_address(memory.buffer_address);
        let mut request =
            TransferRequest::read(addr as *mut u8, len as u64, &endpoint, segment, offset);
        // The engine checksums each chunk on the thread that moved it, while the bytes are
        // still in that core's cache (and in parallel for split entries).
        request.checksum = self.inner.config.verify_checksums;
        Ok(request)
    }

    /// The lease and checksum checks after the bytes arrived. `crc` is the CRC32C the transfer
    /// engine computed over `bytes` as they landed; without it the bytes are checksummed here.
    fn check_read(
        &self,
        key: &str,
        response: &GetReplicaListResponse,
        asked: Instant,
        bytes: &[u8],
        crc: Option<u32>,
    ) -> Result<(), StoreError> {
        let elapsed_ms = asked.elapsed().as_millis() as u64;
        if response.lease_ttl_ms != u64::MAX && elapsed_ms > response.lease_ttl_ms {
            return Err(StoreError::LeaseExpired {
                elapsed_ms,
                lease_ms: response.lease_ttl_ms,
            });
        }
        if self.inner.config.verify_checksums {
            if let Some(expected) = response.object_checksum {
                let actual = match crc {
                    Some(crc) => u64::from(crc),
                    None => checksum_of(&[bytes]),
                };
                if actual != expected {
                    return Err(StoreError::ChecksumMismatch {
                        key: key.to_string(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The size of an object from its readable replicas.
/// The keys a pinned batch lookup pinned (those it located).
fn pinned_keys<'k, T>(keys: &[&'k str], located: &[Result<T, StoreError>]) -> Vec<&'k str> {
    keys.iter()
        .zip(located)
        .filter(|(_, r)| r.is_ok())
        .map(|(k, _)| *k)
        .collect()
}

pub(super) fn object_size(key: &str, response: &GetReplicaListResponse) -> Result<u64, StoreError> {
    response
        .replicas
        .iter()
        .find_map(|r| match &r.kind {
            ReplicaKind::Memory(m) => Some(m.size),
            ReplicaKind::Disk(d) => Some(d.object_size),
            ReplicaKind::LocalDisk(d) => Some(d.object_size),
            _ => None,
        })
        .ok_or_else(|| StoreError::NoReadableReplica {
            key: key.to_string(),
        })
}
