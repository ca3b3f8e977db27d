//! Ranged reads and writes: byte ranges of objects moved straight between caller memory and a
//! replica's segment, every range of a call in one transfer batch. Backs upstream's
//! `get_into_ranges` and the session calls (`sessions.rs`).
//!
//! Ranges are read from (and written to) memory replicas at `buffer_address + offset`, so only
//! the asked bytes move. They carry no checksum (the object's CRC32C covers whole objects), as
//! upstream's ranged reads do not; the read lease is still checked. An object whose preferred
//! replica is on a node's disk (disk-only) is loaded whole, once per call, through the read path
//! of `get` (the disk record's CRC and the object's checksum checked) and its ranges are copied
//! out: a disk record is read whole anyway.

use mooncake_common::{GetReplicaListResponse, ReplicaDescriptor, ReplicaKind};
use mooncake_transfer::{TransferError, TransferRequest};
use std::collections::hash_map::{Entry, HashMap};
use std::time::Instant;

use super::read::PlannedRead;
use super::{StoreClient, StoreError};

/// One range to read: `dst.len()` bytes of object `keys[key]` from byte `offset`.
#[derive(Debug)]
pub struct RangeRead<'a> {
    pub key: usize,
    pub offset: u64,
    pub dst: &'a mut [u8],
}

/// One range to write: `src` at byte `offset` of object `keys[key]`.
#[derive(Debug, Clone, Copy)]
pub struct RangeWrite<'a> {
    pub key: usize,
    pub offset: u64,
    pub src: &'a [u8],
}

/// What a read needs to know about an object: its size, its replicas and lease, and when the
/// lookup that granted the lease was sent.
#[derive(Debug, Clone)]
pub(super) struct Located {
    pub size: u64,
    pub response: GetReplicaListResponse,
    pub asked: Instant,
}

impl Located {
    pub(super) fn lease_expired(&self) -> Option<StoreError> {
        let elapsed_ms = self.asked.elapsed().as_millis() as u64;
        let lease_ms = self.response.lease_ttl_ms;
        (lease_ms != u64::MAX && elapsed_ms > lease_ms).then_some(StoreError::LeaseExpired {
            elapsed_ms,
            lease_ms,
        })
    }
}

/// `replica` moved `offset` bytes into its object (a memory replica's buffer address).
fn shifted(replica: &ReplicaDescriptor, offset: u64) -> ReplicaDescriptor {
    let mut out = replica.clone();
    if let ReplicaKind::Memory(memory) = &mut out.kind {
        memory.buffer_address += offset;
    }
    out
}

/// `InvalidParams` unless `[offset, offset + len)` lies inside a `size`-byte object.
fn check_range(offset: u64, len: usize, size: u64) -> Result<(), StoreError> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(StoreError::InvalidParams(format!(
            "range [{offset}, +{len}) runs past the {size}-byte object"
        ))),
    }
}

impl StoreClient {
    /// Reads byte ranges of objects into caller memory: one master round trip for `keys`
    /// (BatchGetReplicaList), then one transfer batch of ranged reads from each object's
    /// preferred replica (the next replica when one fails). One result per fragment: its
    /// length, or why it failed (a missing key, a range past the end of its object, an
    /// expired lease). Fragments of other keys are not affected by a failed one.
    pub async fn get_ranges(
        &self,
        keys: &[&str],
        fragments: &mut [RangeRead<'_>],
    ) -> Vec<Result<u64, StoreError>> {
        let asked = Instant::now();
        let located: Vec<Result<Located, StoreError>> = match self.locate_batch(keys, false).await {
            Ok(located) => located
                .into_iter()
                .map(|entry| {
                    entry.map(|(size, response)| Located {
                        size,
                        response,
                        asked,
                    })
                })
                .collect(),
            Err(error) => return fragments.iter().map(|_| Err(error.clone())).collect(),
        };
        let refs: Vec<Result<&Located, StoreError>> = located
            .iter()
            .map(|l| l.as_ref().map_err(Clone::clone))
            .collect();
        self.read_ranges(keys, &refs, fragments).await
    }

    /// The read leg of ranged reads, once every key is located (`located[f.key]`).
    pub(super) async fn read_ranges(
        &self,
        keys: &[&str],
        located: &[Result<&Located, StoreError>],
        fragments: &mut [RangeRead<'_>],
    ) -> Vec<Result<u64, StoreError>> {
        let mut results: Vec<Option<Result<u64, StoreError>>> = Vec::new();
        results.resize_with(fragments.len(), || None);
        let mut plan: Vec<PlannedRead<'_>> = Vec::new();
        let mut disk_only: Vec<(usize, &Located)> = Vec::new();
        for (tag, fragment) in fragments.iter_mut().enumerate() {
            let checked = located
                .get(fragment.key)
                .ok_or_else(|| StoreError::InvalidParams("fragment of an unknown key".into()))
                .and_then(|l| l.clone())
                .and_then(|l| {
                    check_range(fragment.offset, fragment.dst.len(), l.size)?;
                    let len = fragment.dst.len();
                    let range = (fragment.dst.as_ptr() as usize, len);
                    self.check_staging(std::iter::once(range), len as u64)?;
                    l.lease_expired().map_or(Ok(l), Err)
                });
            let l = match checked {
                Ok(l) => l,
                Err(error) => {
                    results[tag] = Some(Err(error));
                    continue;
                }
            };
            if fragment.dst.is_empty() {
                results[tag] = Some(Ok(0));
                continue;
            }
            let Some(&first) = self.replica_order(&l.response.replicas).first() else {
                results[tag] = Some(Err(StoreError::NoReadableReplica { key: String::new() }));
                continue;
            };
            if matches!(l.response.replicas[first].kind, ReplicaKind::LocalDisk(_)) {
                disk_only.push((tag, l));
                continue;
            }
            let replica = shifted(&l.response.replicas[first], fragment.offset);
            plan.push((
                tag,
                fragment.dst.as_mut_ptr() as usize,
                fragment.dst.len(),
                replica,
                "",
            ));
        }
        self.read_disk_ranges(keys, &disk_only, fragments, &mut results)
            .await;
        let mut first = self.read_planned(&plan).await;
        for (tag, ..) in &plan {
            let fragment = &mut fragments[*tag];
            let outcome = match first.remove(tag) {
                Some(Ok(_)) => Ok(()),
                Some(Err(StoreError::Transfer(TransferError::Overlap { .. }))) => {
                    // The destination overlaps memory another operation registered right now:
                    // read privately, then copy.
                    let l = located[fragment.key].as_ref().ok();
                    let mut private = vec![0u8; fragment.dst.len()];
                    match l {
                        Some(l) => self
                            .read_range_fallback(l, fragment.offset, &mut private, 0)
                            .await
                            .map(|()| fragment.dst.copy_from_slice(&private)),
                        None => Err(StoreError::InvalidParams("lost fragment".into())),
                    }
                }
                Some(Err(error)) => match located[fragment.key].as_ref().ok() {
                    Some(l) => self
                        .read_range_fallback(l, fragment.offset, fragment.dst, 1)
                        .await
                        .map_err(|e| match e {
                            StoreError::NoReadableReplica { .. } => error,
                            other => other,
                        }),
                    None => Err(error),
                },
                None => Err(StoreError::InvalidParams("lost fragment".into())),
            };
            // Bytes that arrived after the lease ran out may come from reused memory.
            let outcome = outcome.and_then(|()| {
                located[fragment.key]
                    .as_ref()
                    .ok()
                    .and_then(|l| l.lease_expired())
                    .map_or(Ok(fragment.dst.len() as u64), Err)
            });
            results[*tag] = Some(outcome);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(StoreError::InvalidParams("lost fragment".into()))))
            .collect()
    }

    /// The ranges of disk-only objects: each object read whole once (as `get` reads it), then
    /// each range copied out of it.
    async fn read_disk_ranges(
        &self,
        keys: &[&str],
        disk_only: &[(usize, &Located)],
        fragments: &mut [RangeRead<'_>],
        results: &mut [Option<Result<u64, StoreError>>],
    ) {
        let mut whole: HashMap<usize, Result<Vec<u8>, StoreError>> = HashMap::new();
        for &(tag, l) in disk_only {
            let fragment = &mut fragments[tag];
            if let Entry::Vacant(slot) = whole.entry(fragment.key) {
                slot.insert(match keys.get(fragment.key) {
                    Some(key) => self.get_located(key, l.asked, &l.response).await,
                    None => Err(StoreError::InvalidParams(
                        "fragment of an unknown key".into(),
                    )),
                });
            }
            let start = fragment.offset as usize;
            let len = fragment.dst.len();
            results[tag] = Some(match &whole[&fragment.key] {
                Ok(bytes) => match bytes.get(start..start + len) {
                    Some(range) => {
                        fragment.dst.copy_from_slice(range);
                        Ok(len as u64)
                    }
                    None => Err(StoreError::InvalidParams(format!(
                        "range [{start}, +{len}) runs past the {}-byte object read",
                        bytes.len()
                    ))),
                },
                Err(error) => Err(error.clone()),
            });
        }
    }

    /// Reads one range from the replicas in preference order from position `skip`, until one
    /// works.
    async fn read_range_fallback(
        &self,
        located: &Located,
        offset: u64,
        dst: &mut [u8],
        skip: usize,
    ) -> Result<(), StoreError> {
        let replicas = &located.response.replicas;
        let mut last = None;
        for &i in self.replica_order(replicas).iter().skip(skip) {
            let plan = [(
                0usize,
                dst.as_mut_ptr() as usize,
                dst.len(),
                shifted(&replicas[i], offset),
                "",
            )];
            match self.read_planned(&plan).await.remove(&0) {
                Some(Ok(_)) => return Ok(()),
                Some(Err(error)) => last = Some(error),
                None => {}
            }
        }
        Err(last.unwrap_or(StoreError::NoReadableReplica { key: String::new() }))
    }

    /// Writes byte ranges into reserved objects: `targets[f.key]` is the object's memory
    /// replicas and size. Every range goes to every memory replica, all in one transfer batch.
    /// One result per fragment: its length, or why it failed (a range past the end of its
    /// object, a failed transfer).
    pub(super) async fn write_ranges(
        &self,
        targets: &[Result<(&[ReplicaDescriptor], u64), StoreError>],
        fragments: &[RangeWrite<'_>],
    ) -> Vec<Result<u64, StoreError>> {
        let mut results: Vec<Option<Result<u64, StoreError>>> = vec![None; fragments.len()];
        let mut accepted = Vec::new();
        for (f, fragment) in fragments.iter().enumerate() {
            let checked = targets
                .get(fragment.key)
                .ok_or_else(|| StoreError::InvalidParams("fragment of an unknown key".into()))
                .and_then(|t| t.clone())
                .and_then(|(replicas, size)| {
                    check_range(fragment.offset, fragment.src.len(), size)?;
                    let len = fragment.src.len();
                    let range = (fragment.src.as_ptr() as usize, len);
                    self.check_staging(std::iter::once(range), len as u64)?;
                    Ok(replicas)
                });
            match checked {
                Ok(_) if fragment.src.is_empty() => results[f] = Some(Ok(0)),
                Ok(replicas) => accepted.push((f, replicas)),
                Err(error) => results[f] = Some(Err(error)),
            }
        }
        let pins = match self.pin_all(
            accepted
                .iter()
                .map(|(f, _)| (fragments[*f].src.as_ptr() as usize, fragments[*f].src.len())),
        ) {
            Ok(pins) => pins,
            Err(StoreError::Transfer(TransferError::Overlap { .. })) => {
                // Source bytes registered by a concurrent operation: write from private copies.
                let copies: Vec<Vec<u8>> = fragments.iter().map(|f| f.src.to_vec()).collect();
                let private: Vec<RangeWrite<'_>> = fragments
                    .iter()
                    .zip(&copies)
                    .map(|(f, copy)| RangeWrite {
                        key: f.key,
                        offset: f.offset,
                        src: copy,
                    })
                    .collect();
                return Box::pin(self.write_ranges(targets, &private)).await;
            }
            Err(error) => return fragments.iter().map(|_| Err(error.clone())).collect(),
        };
        let mut requests = Vec::new();
        let mut owner = Vec::new();
        let mut endpoints = Vec::new();
        for (f, replicas) in &accepted {
            let fragment = &fragments[*f];
            for replica in replicas.iter() {
                let ReplicaKind::Memory(memory) = &replica.kind else {
                    continue;
                };
                let endpoint = match self.endpoint_of(&memory.transport_endpoint) {
                    Ok(endpoint) => endpoint,
                    Err(error) => {
                        results[*f] = Some(Err(error));
                        continue;
                    }
                };
                let (segment, offset) =
                    super::addressing::split_address(memory.buffer_address + fragment.offset);
                requests.push(TransferRequest::write(
                    fragment.src.as_ptr(),
                    fragment.src.len() as u64,
                    &endpoint,
                    segment,
                    offset,
                ));
                owner.push(*f);
                endpoints.push(memory.transport_endpoint.clone());
            }
        }
        let done = self.inner.engine.submit(&requests).wait_async().await;
        drop(pins);
        // A session cannot move to a new allocation, but the master can stop placing there.
        let mut peers: Vec<std::sync::Arc<str>> = Vec::new();
        for (result, endpoint) in done.iter().zip(&endpoints) {
            if matches!(result, Err(e) if e.is_peer_failure()) && !peers.contains(endpoint) {
                peers.push(endpoint.clone());
            }
        }
        self.report_peers(&peers).await;
        let mut requests_of = vec![0usize; fragments.len()];
        for &f in &owner {
            requests_of[f] += 1;
        }
        for (f, result) in owner.into_iter().zip(done) {
            if let Err(error) = result {
                if !matches!(results[f], Some(Err(_))) {
                    results[f] = Some(Err(error.into()));
                }
            }
        }
        for (f, _) in &accepted {
            if results[*f].is_none() {
                results[*f] = Some(if requests_of[*f] == 0 {
                    Err(StoreError::InvalidParams(
                        "the object has no memory replica to write".into(),
                    ))
                } else {
                    Ok(fragments[*f].src.len() as u64)
                });
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(StoreError::InvalidParams("lost fragment".into()))))
            .collect()
    }
}
