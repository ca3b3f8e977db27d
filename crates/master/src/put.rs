//! PutStart and its batch (as upstream's master), shared with UpsertStart (`upsert.rs`).
//!
//! One start runs in phases, under the key's stripe: [`MasterService::validate_put`] (upstream's
//! checks and order), [`MasterService::settle_existing`] (a live key is refused or pre-empted, an
//! upsert rewrites in place or clears the old value), [`MasterService::charge_quota`] (with
//! tenant-scoped eviction on a deficit), [`MasterService::place_replicas`] (the allocation
//! strategy; with no space, inline eviction, `eviction.rs`), [`MasterService::insert_started`] (the PROCESSING object enters the index and is
//! observed). PutEnd and PutRevoke are `put_end.rs`; the discarded list and the reaper
//! `put_timeouts.rs`.

use std::sync::atomic::Ordering;

use mooncake_common::{
    ClientId, ErrorCode, ReplicaDescriptor, ReplicaStatus, ReplicateConfig, SoftPinAction,
};
use parking_lot::RwLockWriteGuard;

use crate::allocator::BufferHandle;
use crate::handle::{MasterService, MAX_KEY_LEN_BYTES};
use crate::index::{group_hash, key_hash, routed, shard_of, Shard, Tenant};
use crate::object::{
    ObjectEntry, ObjectExtra, ObjectKey, ObjectMetadata, ObjectTimes, PendingSoftPin, Place,
    Replica, ReplicaData, Replicas, FLAG_HARD_PIN, FLAG_PROCESSING,
};
use crate::quota::TenantAccount;
use crate::strategy::{place, AllocationStrategy, PlacementRequest};
use crate::writers::WriterId;

/// Whether a start is a put (refuses live keys) or an upsert (rewrites them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartMode {
    Put,
    Upsert,
}

/// One key's share of a (batch) PutStart.
pub(crate) struct PutArgs<'a> {
    pub key: &'a str,
    pub slice_length: u64,
    pub config: &'a ReplicateConfig,
    pub group: Option<&'a str>,
    /// Replaces the config's preferred names (BatchPutStart with `prefer_alloc_in_same_node`).
    pub preferred_override: Option<&'a str>,
}

/// What one start knows once validated.
struct Start<'a> {
    client: ClientId,
    args: &'a PutArgs<'a>,
    tenant: Tenant<'a>,
    /// The group, `None` for an empty one.
    group: Option<&'a str>,
    pending_soft_pin: Option<PendingSoftPin>,
    mode: StartMode,
    now_ms: u64,
}

/// What an upsert keeps from the value it replaces.
#[derive(Debug, Clone, Copy, Default)]
struct Carried {
    hard_pin: bool,
    soft_pin_deadline_ms: u64,
}

/// What the start found at the key.
enum Existing {
    /// Nothing live is left there (absent, dead, pre-empted or cleared by an upsert).
    Cleared(Carried),
    /// A same-size upsert rewrote the value in place: these descriptors are the answer.
    Rewritten(Vec<ReplicaDescriptor>),
}

impl MasterService {
    /// Phase 1: upstream's PutStart checks, in upstream's order. Returns the pending soft pin to
    /// record.
    fn validate_put(
        &self,
        key: &str,
        slice_length: u64,
        config: &ReplicateConfig,
        tenant: Tenant<'_>,
        batch: bool,
    ) -> Result<Option<PendingSoftPin>, ErrorCode> {
        let c = config;
        if c.replica_num == 0 && c.nof_replica_num == 0 && c.dfs_replica_num == 0 {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        if key.is_empty() || key.len() > MAX_KEY_LEN_BYTES || slice_length == 0 {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        if c.dfs_replica_num > 1 || (c.dfs_replica_num > 0 && c.replica_num == 0) {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        if c.dfs_replica_num > 0 && tenant != Tenant::Default {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        // This build has no NoF support (optional upstream): any NoF request is refused, as
        // upstream refuses it without USE_NOF.
        if c.nof_replica_num > 0 {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        let pending = match (c.soft_pin_action, c.soft_pin_ttl_ms) {
            (SoftPinAction::Preserve, None) => None,
            (SoftPinAction::Preserve | SoftPinAction::Disable, Some(_)) => {
                return Err(ErrorCode::INVALID_PARAMS)
            }
            (SoftPinAction::Disable, None) => Some(PendingSoftPin {
                action: SoftPinAction::Disable,
                ttl_ms: 0,
            }),
            (SoftPinAction::Enable, ttl) => {
                let ttl_ms = ttl.unwrap_or(self.config.default_kv_soft_pin_ttl_ms);
                if ttl_ms > self.config.max_kv_soft_pin_ttl_ms {
                    return Err(ErrorCode::INVALID_PARAMS);
                }
                Some(PendingSoftPin {
                    action: SoftPinAction::Enable,
                    ttl_ms,
                })
            }
        };
        // A batch checks `group_ids` against its key count instead (one group per key).
        if !batch && c.group_ids.as_ref().is_some_and(|g| g.len() != 1) {
            return Err(ErrorCode::INVALID_PARAMS);
        }
        if c.dfs_replica_num > 0 {
            return Err(ErrorCode::DFS_SERVICE_UNAVAILABLE);
        }
        Ok(pending)
    }

    /// PutStart: allocates 1..=`replica_num` memory replicas (best effort, distinct segment
    /// names), records the object as PROCESSING and returns the descriptors (all PROCESSING).
    ///
    /// Errors: INVALID_PARAMS (bad config, empty/oversized key, zero size, bad tenant, bad soft
    /// pin), OBJECT_ALREADY_EXISTS (a COMPLETE replica exists), REPLICA_IS_NOT_READY (no COMPLETE
    /// replica, and another put of the key started within `put_start_discard_timeout`: a write
    /// in flight), NO_AVAILABLE_HANDLE (no space anywhere). An older
    /// unfinished put is pre-empted: its buffers stay allocated until `put_start +
    /// put_start_release_timeout`.
    pub fn put_start(
        &self,
        client: ClientId,
        key: &str,
        slice_length: u64,
        config: &ReplicateConfig,
        tenant: &str,
    ) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let group = config
            .group_ids
            .as_ref()
            .and_then(|g| g.first())
            .map(String::as_str);
        let args = PutArgs {
            key,
            slice_length,
            config,
            group,
            preferred_override: None,
        };
        self.put_start_one(client, &args, tenant, false, StartMode::Put)
    }

    pub(crate) fn put_start_one(
        &self,
        client: ClientId,
        args: &PutArgs<'_>,
        tenant: Tenant<'_>,
        batch: bool,
        mode: StartMode,
    ) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        let pending_soft_pin =
            self.validate_put(args.key, args.slice_length, args.config, tenant, batch)?;
        if !batch {
            self.track_writer(client);
        }
        let key = args.key;
        let own_hash = key_hash(tenant, key);
        let _stripe = self.index.stripe(own_hash).lock();
        let account = self.tenant_account(tenant)?;
        let group = args.group.filter(|g| !g.is_empty());
        let old_hash = self.route_from(tenant, key, own_hash);
        let new_hash = group.map_or(own_hash, |g| routed(own_hash, group_hash(g)));
        let start = Start {
            client,
            args,
            tenant,
            group,
            pending_soft_pin,
            mode,
            now_ms: self.clock.now_ms(),
        };

        let mut shard = self.index.shard(old_hash).write();
        let carried = match self.settle_existing(&mut shard, &start, old_hash)? {
            Existing::Rewritten(descriptors) => return Ok(descriptors),
            Existing::Cleared(carried) => carried,
        };
        // Common case (no quota, same shard): keep the shard locked through allocation and
        // insertion, one lock round trip. With a quota the lock is released, because a deficit
        // runs tenant-scoped eviction, which walks the shards.
        let held = if account.is_none() && shard_of(old_hash) == shard_of(new_hash) {
            Some(shard)
        } else {
            drop(shard);
            None
        };
        if group.is_some() || old_hash != own_hash {
            self.routes
                .set(tenant, key, own_hash, group.map(group_hash));
        }

        let want = args
            .slice_length
            .saturating_mul(args.config.replica_num as u64);
        if let Some(acc) = &account {
            self.charge_quota(acc, tenant, want)?;
        }
        // Phase 4b (not upstream's): no space → inline eviction (`eviction.rs`), which walks
        // the shards, so the key's shard is released and taken again to insert. Only a put that
        // still finds no space sets the need-eviction flag.
        let inline = self.config.put_start_evict_budget > 0;
        let mut handles = self.place_replicas(client, args, own_hash, !inline);
        let mut held = held;
        if handles.is_empty() && inline {
            held = None;
            handles = self.place_after_inline_eviction(args.slice_length, want, || {
                self.place_replicas(client, args, own_hash, false)
            });
            if handles.is_empty() {
                handles = self.place_replicas(client, args, own_hash, true);
            }
        }
        if let Some(acc) = &account {
            acc.refund(want.saturating_sub(handles.iter().map(BufferHandle::len).sum()));
        }
        if handles.is_empty() {
            return Err(ErrorCode::NO_AVAILABLE_HANDLE);
        }
        self.insert_started(held, &start, new_hash, handles, carried, account)
    }

    /// Phase 2: what is at the key. A put refuses a live value (`OBJECT_ALREADY_EXISTS`: a
    /// COMPLETE replica; `REPLICA_IS_NOT_READY`: another put started within the discard
    /// timeout and not finished) and pre-empts an
    /// older unfinished one (its buffers discarded until its own release time). An upsert checks
    /// group, task and busy replicas, pre-empts an in-flight write at once, then rewrites a
    /// same-size value in place or discards the old value. Whatever is left is erased.
    fn settle_existing(
        &self,
        shard: &mut Shard,
        start: &Start<'_>,
        hash: u64,
    ) -> Result<Existing, ErrorCode> {
        let now = start.now_ms;
        let release_ms = self.config.release_timeout_ms();
        let discard_ms = self.config.discard_timeout_ms();
        let settled = self.edit_entry(shard, start.tenant, hash, start.args.key, |meta, edit| {
            let mut carried = Carried::default();
            meta.drop_dead_replicas();
            if meta.is_valid() {
                match start.mode {
                    StartMode::Put => {
                        if meta.has_complete() {
                            return Err(ErrorCode::OBJECT_ALREADY_EXISTS);
                        }
                        if meta.put_start_ms().saturating_add(discard_ms) >= now {
                            // Another write is in flight: nothing readable yet, and this put
                            // stores nothing. Not "already exists" (a client reports that as
                            // success), upstream's code for replicas still PROCESSING.
                            return Err(ErrorCode::REPLICA_IS_NOT_READY);
                        }
                        let release_at = meta.put_start_ms().saturating_add(release_ms);
                        edit.discard(meta.take_replicas(), release_at);
                    }
                    StartMode::Upsert => {
                        if meta.group() != start.group {
                            return Err(ErrorCode::INVALID_PARAMS);
                        }
                        if meta.has_task() {
                            return Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK);
                        }
                        if meta.replicas.iter().any(|r| r.refcnt > 0) {
                            return Err(ErrorCode::OBJECT_REPLICA_BUSY);
                        }
                        let release_at = now.saturating_add(release_ms);
                        if meta.is_processing() {
                            // Pre-empt the in-flight write at once.
                            let stale =
                                meta.extract_replicas(|r| r.status == ReplicaStatus::PROCESSING);
                            edit.discard(stale, release_at);
                            meta.set(FLAG_PROCESSING, false);
                        }
                        // A disk copy holds the old value: it goes (the node's record is
                        // overwritten by the next offload, or evicted).
                        meta.replicas
                            .retain(|r| !matches!(r.data.place(), Place::LocalDisk(_)));
                        if meta.has_complete() {
                            if meta.size == start.args.slice_length {
                                edit.changed();
                                return Ok(Existing::Rewritten(Self::rewrite_in_place(
                                    meta, start,
                                )));
                            }
                            carried.hard_pin = meta.has(FLAG_HARD_PIN);
                            if meta.soft_pinned(now) {
                                carried.soft_pin_deadline_ms = meta.soft_pin_deadline_ms();
                            }
                            edit.discard(meta.take_replicas(), release_at);
                        }
                    }
                }
            }
            edit.erase();
            Ok(Existing::Cleared(carried))
        });
        settled.unwrap_or(Ok(Existing::Cleared(Carried::default())))
    }

    /// Phase 3: charges the full request to the tenant, running tenant-scoped eviction for the
    /// deficit and retrying, at most twice.
    fn charge_quota(
        &self,
        account: &TenantAccount,
        tenant: Tenant<'_>,
        bytes: u64,
    ) -> Result<(), ErrorCode> {
        let mut tries = 0;
        while let Err(deficit) = account.try_charge(bytes) {
            if deficit == u64::MAX {
                return Err(ErrorCode::TENANT_NOT_REGISTERED);
            }
            if tries == 2 {
                return Err(ErrorCode::TENANT_QUOTA_EXCEEDED);
            }
            tries += 1;
            let freed = self.evict_for_tenant(tenant, deficit);
            self.counters.count_tenant_eviction(tenant.name(), freed);
        }
        Ok(())
    }

    /// Phase 4: up to `replica_num` buffers on distinct names (best effort). Nothing placed
    /// while at least `replica_num` names exist sets the need-eviction flag when
    /// `flag_on_failure` (the last try).
    fn place_replicas(
        &self,
        client: ClientId,
        args: &PutArgs<'_>,
        key_hash: u64,
        flag_on_failure: bool,
    ) -> Vec<BufferHandle> {
        let config = args.config;
        let preferred_single;
        let preferred: &[String] = match args.preferred_override {
            Some(name) => {
                preferred_single = [name.to_string()];
                &preferred_single
            }
            None => config.effective_preferred_segments(),
        };
        let segs = self.segments.inner.read();
        let use_local = config.prefer_alloc_in_same_node
            || (self.config.allocation_strategy == AllocationStrategy::LocalFirst
                && config.replica_num == 1);
        let local_host = if !use_local {
            None
        } else if !config.host_id.is_empty() {
            Some(config.host_id.as_str())
        } else {
            segs.client_host.get(&client).map(String::as_str)
        };
        let req = PlacementRequest {
            size: args.slice_length,
            replica_num: config.replica_num,
            preferred,
            local_host,
            key_hash,
            now_ms: self.clock.now_ms(),
        };
        let handles = place(
            &segs.allocatable,
            self.config.allocation_strategy,
            &req,
            &self.rng,
        );
        // A replica larger than every segment fits nowhere, however much is evicted: it does
        // not make the background cycle throw cached objects away.
        if handles.is_empty()
            && flag_on_failure
            && segs.allocatable.name_count() >= config.replica_num
            && segs.some_segment_holds(args.slice_length)
        {
            self.need_eviction.store(true, Ordering::Relaxed);
        }
        handles
    }

    /// Phase 5: records the object as PROCESSING in its (group's) shard and observes it.
    fn insert_started(
        &self,
        held: Option<RwLockWriteGuard<'_, Shard>>,
        start: &Start<'_>,
        hash: u64,
        handles: Vec<BufferHandle>,
        carried: Carried,
        account: Option<std::sync::Arc<TenantAccount>>,
    ) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        let (args, config, key) = (start.args, start.args.config, start.args.key);
        let replicas: Replicas = handles
            .into_iter()
            .map(|h| Replica {
                id: self.next_replica_id(),
                status: ReplicaStatus::PROCESSING,
                refcnt: 0,
                unverified: false,
                data: ReplicaData::Memory(h),
            })
            .collect();
        let descriptors: Vec<ReplicaDescriptor> = replicas
            .iter()
            .filter_map(|r| r.descriptor(args.slice_length))
            .collect();
        let group = start.group;
        let extra = (group.is_some() || start.pending_soft_pin.is_some() || account.is_some())
            .then(|| {
                Box::new(ObjectExtra {
                    group: group.map(Box::from),
                    pending_soft_pin: start.pending_soft_pin,
                    account,
                    task: None,
                    soft_pin_deadline_ms: 0,
                    checksum_high: 0,
                })
            });
        let mut flags = FLAG_PROCESSING;
        if config.with_hard_pin || carried.hard_pin {
            flags |= FLAG_HARD_PIN;
        }
        let mut entry = Box::new(ObjectEntry {
            key: ObjectKey::new(key),
            meta: ObjectMetadata {
                writer: WriterId::of(start.client),
                size: args.slice_length,
                times: ObjectTimes::new(start.now_ms, start.now_ms),
                read_pins: std::sync::atomic::AtomicU32::new(0),
                checksum_low: 0,
                flags,
                data_type: config.data_type,
                extra,
                replicas,
            },
        });
        entry
            .meta
            .set_soft_pin_deadline_ms(carried.soft_pin_deadline_ms);
        let mut shard = match held {
            Some(guard) => guard,
            None => self.index.shard(hash).write(),
        };
        let tenant = start.tenant;
        let state = shard.tenant_or_insert(tenant);
        if state.find(hash, key).is_some() {
            // Cannot happen while the stripe is held; refuse rather than overwrite.
            drop(entry);
            shard.drop_tenant_if_empty(tenant);
            return Err(ErrorCode::OBJECT_ALREADY_EXISTS);
        }
        let entry = state.insert(tenant, hash, entry);
        self.emit_entry(tenant, entry);
        Ok(descriptors)
    }

    /// Same-size upsert: every COMPLETE replica goes back to PROCESSING (the key is unreadable
    /// until End), the writer and start time change, and the existing descriptors are returned.
    fn rewrite_in_place(meta: &mut ObjectMetadata, start: &Start<'_>) -> Vec<ReplicaDescriptor> {
        for r in meta.replicas.iter_mut() {
            if r.status == ReplicaStatus::COMPLETE {
                r.status = ReplicaStatus::PROCESSING;
                // The new value's End makes it readable; a pending verification no longer applies.
                r.unverified = false;
            }
        }
        meta.writer = WriterId::of(start.client);
        meta.times.set_put_start_ms(start.now_ms);
        meta.set(FLAG_PROCESSING, true);
        if start.args.config.with_hard_pin {
            meta.set(FLAG_HARD_PIN, true);
        }
        if start.pending_soft_pin.is_some() {
            meta.extra_mut().pending_soft_pin = start.pending_soft_pin;
        }
        let size = meta.size;
        meta.replicas
            .iter()
            .filter_map(|r| r.descriptor(size))
            .collect()
    }

    /// BatchPutStart: one result per key, in order. Mismatched `keys`/`slice_lengths` lengths, or
    /// `group_ids` whose length differs from the number of keys, give INVALID_PARAMS for every
    /// key. With `prefer_alloc_in_same_node`, once a key succeeds its first replica's endpoint
    /// becomes the preferred segment of the remaining keys (as upstream).
    pub fn batch_put_start(
        &self,
        client: ClientId,
        keys: &[String],
        slice_lengths: &[u64],
        config: &ReplicateConfig,
        tenant: &str,
    ) -> Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>> {
        self.batch_start(client, keys, slice_lengths, config, tenant, StartMode::Put)
    }

    pub(crate) fn batch_start(
        &self,
        client: ClientId,
        keys: &[String],
        slice_lengths: &[u64],
        config: &ReplicateConfig,
        tenant: &str,
        mode: StartMode,
    ) -> Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>> {
        let groups = config.group_ids.as_deref();
        if keys.len() != slice_lengths.len() || groups.is_some_and(|g| g.len() != keys.len()) {
            return vec![Err(ErrorCode::INVALID_PARAMS); keys.len()];
        }
        let tenant = match self.resolve_tenant(tenant) {
            Ok(t) => t,
            Err(code) => return vec![Err(code); keys.len()],
        };
        self.track_writer(client);
        let mut preferred_endpoint: Option<String> = None;
        let mut out = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let args = PutArgs {
                key,
                slice_length: slice_lengths[i],
                config,
                group: groups.map(|g| g[i].as_str()),
                preferred_override: preferred_endpoint.as_deref(),
            };
            let result = self.put_start_one(client, &args, tenant, true, mode);
            if config.prefer_alloc_in_same_node && preferred_endpoint.is_none() {
                if let Ok(descs) = &result {
                    preferred_endpoint = descs
                        .iter()
                        .find_map(|d| d.memory())
                        .map(|m| m.transport_endpoint.to_string());
                }
            }
            out.push(result);
        }
        out
    }
}
