//! PutStart / PutEnd / PutRevoke and their batches (spec/master.md §5, §7).

use std::cmp::Reverse;
use std::sync::atomic::{AtomicU64, Ordering};

use mooncake_common::{
    ClientId, ErrorCode, ObjectMeta, ReplicaDescriptor, ReplicaStatus, ReplicaType,
    ReplicateConfig, SoftPinAction, TenantId,
};
use smallvec::SmallVec;

use crate::index::{group_hash, key_hash, routed, shard_of, Tenant};
use crate::object::{
    ObjectEntry, ObjectExtra, ObjectKey, ObjectMetadata, PendingSoftPin, Replica, ReplicaData,
    FLAG_HARD_PIN, FLAG_PROCESSING,
};
use crate::service::{MasterService, SoftPinDeadline, MAX_KEY_LEN_BYTES};
use crate::strategy::{place, AllocationStrategy, PlacementRequest};

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

impl MasterService {
    /// Upstream's PutStart checks, in upstream's order. Returns the pending soft pin to record.
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
        // This build has no NoF support (optional in spec §0): any NoF request is refused, as
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
    /// pin), OBJECT_ALREADY_EXISTS (a COMPLETE replica exists, or another put of the key started
    /// within `put_start_discard_timeout`), NO_AVAILABLE_HANDLE (no space anywhere). An older
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
        let config = args.config;
        let pending_soft_pin =
            self.validate_put(args.key, args.slice_length, config, tenant, batch)?;
        let key = args.key;
        let own_hash = key_hash(tenant, key);
        let _stripe = self.index.stripe(own_hash).lock();
        let account = self.tenant_account(tenant)?;
        let group = args.group.filter(|g| !g.is_empty());
        let old_hash = self.route_from(tenant, key, own_hash);
        let new_hash = group.map_or(own_hash, |g| routed(own_hash, group_hash(g)));
        let now = self.clock.now_ms();
        let release_ms = self.config.release_timeout_ms();
        let mut carried_hard_pin = false;
        let mut carried_soft_pin_ms = 0;

        let mut shard = self.index.shard(old_hash).write();
        {
            if let Some(state) = shard.tenant_mut(tenant) {
                let mut erase = false;
                if let Some(entry) = state.find_mut(old_hash, key) {
                    let meta = &mut entry.meta;
                    meta.drop_dead_replicas();
                    if meta.is_valid() {
                        match mode {
                            StartMode::Put => {
                                let recent = meta
                                    .put_start_ms
                                    .saturating_add(self.config.discard_timeout_ms())
                                    >= now;
                                if meta.has_complete() || recent {
                                    return Err(ErrorCode::OBJECT_ALREADY_EXISTS);
                                }
                                // Pre-empt the stale put: keep its buffers until its release time.
                                let release_at = meta.put_start_ms.saturating_add(release_ms);
                                self.discard(meta.take_replicas(), release_at);
                            }
                            StartMode::Upsert => {
                                if meta.group() != group {
                                    return Err(ErrorCode::INVALID_PARAMS);
                                }
                                if meta.has_task() {
                                    return Err(ErrorCode::OBJECT_HAS_REPLICATION_TASK);
                                }
                                if meta.replicas.iter().any(|r| r.refcnt > 0) {
                                    return Err(ErrorCode::OBJECT_REPLICA_BUSY);
                                }
                                if meta.is_processing() {
                                    // Pre-empt the in-flight write at once.
                                    let stale = meta.extract_replicas(|r| {
                                        r.status == ReplicaStatus::PROCESSING
                                    });
                                    self.discard(stale, now.saturating_add(release_ms));
                                    meta.set(FLAG_PROCESSING, false);
                                }
                                if meta.has_complete() {
                                    if meta.size == args.slice_length {
                                        return Ok(Self::rewrite_in_place(
                                            meta,
                                            client,
                                            config,
                                            pending_soft_pin,
                                            now,
                                        ));
                                    }
                                    carried_hard_pin = meta.has(FLAG_HARD_PIN);
                                    if meta.soft_pinned(now) {
                                        carried_soft_pin_ms = meta.soft_pin_deadline_ms;
                                    }
                                    self.discard(
                                        meta.take_replicas(),
                                        now.saturating_add(release_ms),
                                    );
                                }
                            }
                        }
                    }
                    erase = true;
                }
                if erase {
                    state.remove(old_hash, key);
                    shard.drop_tenant_if_empty(tenant);
                }
            }
        }
        // Common case (no quota, same shard): keep the shard locked through allocation and
        // insertion, one lock round trip as before. With a quota the lock is released, because
        // a deficit runs tenant-scoped eviction, which walks the shards.
        let mut held = if account.is_none() && shard_of(old_hash) == shard_of(new_hash) {
            Some(shard)
        } else {
            drop(shard);
            None
        };
        if group.is_some() || old_hash != own_hash {
            self.routes
                .set(tenant, key, own_hash, group.map(group_hash));
        }

        // Quota: charge the full request now, with up to two tenant-scoped evictions.
        let want = args.slice_length.saturating_mul(config.replica_num as u64);
        if let Some(acc) = &account {
            let mut tries = 0;
            while let Err(deficit) = acc.try_charge(want) {
                if deficit == u64::MAX {
                    return Err(ErrorCode::TENANT_NOT_REGISTERED);
                }
                if tries == 2 {
                    return Err(ErrorCode::TENANT_QUOTA_EXCEEDED);
                }
                tries += 1;
                self.evict_for_tenant(tenant, deficit);
            }
        }

        let preferred_single;
        let preferred: &[String] = match args.preferred_override {
            Some(name) => {
                preferred_single = [name.to_string()];
                &preferred_single
            }
            None => config.effective_preferred_segments(),
        };
        let handles = {
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
                key_hash: own_hash,
            };
            let handles = place(&segs.allocatable, self.config.allocation_strategy, &req);
            if handles.is_empty() && segs.allocatable.name_count() >= config.replica_num {
                self.need_eviction.store(true, Ordering::Relaxed);
            }
            handles
        };
        if let Some(acc) = &account {
            acc.refund(want.saturating_sub(handles.iter().map(|h| h.len()).sum()));
        }
        if handles.is_empty() {
            return Err(ErrorCode::NO_AVAILABLE_HANDLE);
        }

        let replicas: SmallVec<[Replica; 1]> = handles
            .into_iter()
            .map(|h| Replica {
                id: self.next_replica_id(),
                status: ReplicaStatus::PROCESSING,
                refcnt: 0,
                data: ReplicaData::Memory(h),
            })
            .collect();
        let descriptors: Vec<ReplicaDescriptor> = replicas
            .iter()
            .filter_map(|r| r.descriptor(args.slice_length))
            .collect();
        let extra =
            (group.is_some() || pending_soft_pin.is_some() || account.is_some()).then(|| {
                Box::new(ObjectExtra {
                    group: group.map(Box::from),
                    pending_soft_pin,
                    account,
                    task: None,
                })
            });
        let mut flags = FLAG_PROCESSING;
        if config.with_hard_pin || carried_hard_pin {
            flags |= FLAG_HARD_PIN;
        }
        let entry = Box::new(ObjectEntry {
            key: ObjectKey::new(key),
            meta: ObjectMetadata {
                client_id: client,
                size: args.slice_length,
                put_start_ms: now,
                lease_timeout_ms: AtomicU64::new(0),
                last_access_ms: AtomicU64::new(now),
                soft_pin_deadline_ms: carried_soft_pin_ms,
                checksum: 0,
                flags,
                data_type: config.data_type,
                extra,
                replicas,
            },
        });
        let mut shard = match held.take() {
            Some(guard) => guard,
            None => self.index.shard(new_hash).write(),
        };
        let state = shard.tenant_or_insert(tenant);
        if state.find(new_hash, key).is_some() {
            // Cannot happen while the stripe is held; refuse rather than overwrite.
            drop(entry);
            shard.drop_tenant_if_empty(tenant);
            return Err(ErrorCode::OBJECT_ALREADY_EXISTS);
        }
        state.insert(tenant, new_hash, entry);
        Ok(descriptors)
    }

    /// Same-size upsert: every COMPLETE replica goes back to PROCESSING (the key is unreadable
    /// until End), the writer and start time change, and the existing descriptors are returned.
    fn rewrite_in_place(
        meta: &mut ObjectMetadata,
        client: ClientId,
        config: &ReplicateConfig,
        pending_soft_pin: Option<PendingSoftPin>,
        now_ms: u64,
    ) -> Vec<ReplicaDescriptor> {
        for r in meta.replicas.iter_mut() {
            if r.status == ReplicaStatus::COMPLETE {
                r.status = ReplicaStatus::PROCESSING;
            }
        }
        meta.client_id = client;
        meta.put_start_ms = now_ms;
        meta.set(FLAG_PROCESSING, true);
        if config.with_hard_pin {
            meta.set(FLAG_HARD_PIN, true);
        }
        if pending_soft_pin.is_some() {
            meta.extra_mut().pending_soft_pin = pending_soft_pin;
        }
        let size = meta.size;
        meta.replicas
            .iter()
            .filter_map(|r| r.descriptor(size))
            .collect()
    }

    /// PutEnd: marks the selected PROCESSING replicas COMPLETE (the object becomes readable).
    /// OBJECT_NOT_FOUND if missing, ILLEGAL_CLIENT if `client` is not the writer; a retry after
    /// completion is OK; INVALID_WRITE if the object is not being written and a selected replica
    /// is not COMPLETE. Applies the put's soft-pin request when this completes the first replica,
    /// stores the checksum, and counts as an access (no read lease is granted).
    pub fn put_end(
        &self,
        client: ClientId,
        meta: &ObjectMeta,
        replica_type: ReplicaType,
        tenant: &str,
    ) -> Result<(), ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let key = meta.key.as_str();
        let hash = self.route(tenant, key);
        let mut shard = self.index.shard(hash).write();
        let now = self.clock.now_ms();
        let state = shard
            .tenant_mut(tenant)
            .ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        let entry = state
            .find_mut(hash, key)
            .ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        let m = &mut entry.meta;
        m.drop_dead_replicas();
        if !m.is_valid() {
            state.remove(hash, key);
            shard.drop_tenant_if_empty(tenant);
            return Err(ErrorCode::OBJECT_NOT_FOUND);
        }
        if m.client_id != client {
            return Err(ErrorCode::ILLEGAL_CLIENT);
        }
        if !m.is_processing() {
            let done = m
                .replicas
                .iter()
                .filter(|r| replica_type.selects(r.replica_type()))
                .all(Replica::is_complete);
            return if done {
                Ok(())
            } else {
                Err(ErrorCode::INVALID_WRITE)
            };
        }
        let had_complete = m.has_complete();
        for r in m.replicas.iter_mut() {
            if replica_type.selects(r.replica_type()) && r.status == ReplicaStatus::PROCESSING {
                r.status = ReplicaStatus::COMPLETE;
            }
        }
        let mut pin_deadline = None;
        if !had_complete && m.has_complete() {
            if let Some(pin) = m.extra.as_mut().and_then(|e| e.pending_soft_pin.take()) {
                match pin.action {
                    SoftPinAction::Enable if pin.ttl_ms > 0 => {
                        let deadline = now.saturating_add(pin.ttl_ms);
                        m.soft_pin_deadline_ms = deadline;
                        pin_deadline = Some(deadline);
                    }
                    SoftPinAction::Enable | SoftPinAction::Disable => m.soft_pin_deadline_ms = 0,
                    SoftPinAction::Preserve => {}
                }
                m.compact_extra();
            }
        }
        if meta.object_checksum.is_some()
            || matches!(
                replica_type,
                ReplicaType::ALL | ReplicaType::MEMORY | ReplicaType::NOF_SSD
            )
        {
            m.set_checksum(meta.object_checksum);
        }
        if m.all_complete() {
            m.set(FLAG_PROCESSING, false);
        }
        m.grant_lease(now, 0);
        m.touch(now);
        if let Some(deadline_ms) = pin_deadline {
            let tenant_id = match tenant {
                Tenant::Default => None,
                Tenant::Named(t) => TenantId::new(t).ok(),
            };
            self.soft_pins.lock().push(Reverse(SoftPinDeadline {
                deadline_ms,
                tenant: tenant_id,
                key: Box::from(key),
            }));
        }
        Ok(())
    }

    /// PutRevoke: erases the selected PROCESSING replicas and frees their buffers at once.
    /// OBJECT_NOT_FOUND, ILLEGAL_CLIENT, or INVALID_WRITE when the object is not being written
    /// or a selected replica is not PROCESSING (Revoke is not idempotent).
    pub fn put_revoke(
        &self,
        client: ClientId,
        key: &str,
        replica_type: ReplicaType,
        tenant: &str,
    ) -> Result<(), ErrorCode> {
        let tenant = self.resolve_tenant(tenant)?;
        let hash = self.route(tenant, key);
        let mut shard = self.index.shard(hash).write();
        let state = shard
            .tenant_mut(tenant)
            .ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        let entry = state
            .find_mut(hash, key)
            .ok_or(ErrorCode::OBJECT_NOT_FOUND)?;
        let m = &mut entry.meta;
        m.drop_dead_replicas();
        if !m.is_valid() {
            state.remove(hash, key);
            shard.drop_tenant_if_empty(tenant);
            return Err(ErrorCode::OBJECT_NOT_FOUND);
        }
        if m.client_id != client {
            return Err(ErrorCode::ILLEGAL_CLIENT);
        }
        let selected = |r: &Replica| replica_type.selects(r.replica_type());
        if !m.is_processing()
            || m.replicas
                .iter()
                .any(|r| selected(r) && r.status != ReplicaStatus::PROCESSING)
        {
            return Err(ErrorCode::INVALID_WRITE);
        }
        m.retain_replicas(|r| !selected(r));
        if !m.is_valid() {
            state.remove(hash, key);
            shard.drop_tenant_if_empty(tenant);
            return Ok(());
        }
        let processing = m
            .replicas
            .iter()
            .any(|r| r.status == ReplicaStatus::PROCESSING);
        m.set(FLAG_PROCESSING, processing);
        if !processing {
            if let Some(e) = m.extra.as_mut() {
                e.pending_soft_pin = None;
            }
            m.compact_extra();
        }
        Ok(())
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

    /// BatchPutEnd: PutEnd per entry, one result per entry, in order.
    pub fn batch_put_end(
        &self,
        client: ClientId,
        metas: &[ObjectMeta],
        replica_type: ReplicaType,
        tenant: &str,
    ) -> Vec<Result<(), ErrorCode>> {
        metas
            .iter()
            .map(|m| self.put_end(client, m, replica_type, tenant))
            .collect()
    }

    /// BatchPutRevoke: PutRevoke per key, one result per key, in order.
    pub fn batch_put_revoke(
        &self,
        client: ClientId,
        keys: &[String],
        replica_type: ReplicaType,
        tenant: &str,
    ) -> Vec<Result<(), ErrorCode>> {
        keys.iter()
            .map(|k| self.put_revoke(client, k, replica_type, tenant))
            .collect()
    }
}
