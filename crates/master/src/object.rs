//! Object metadata as the master keeps it: one [`ObjectEntry`] per object, boxed in its shard's
//! table, kept small (see docs/master.md, "memory per object").

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use mooncake_common::{
    ClientId, DataType, DfsDescriptor, DiskDescriptor, LocalDiskDescriptor, MemoryDescriptor,
    ReplicaDescriptor, ReplicaId, ReplicaKind, ReplicaStatus, ReplicaType, SoftPinAction,
};
use smallvec::SmallVec;
use std::sync::Arc;

use crate::quota::TenantAccount;

use crate::allocator::BufferHandle;
use crate::writers::WriterId;

/// Medium-specific data of a replica. A memory replica's buffer sits inline; the rarer kinds
/// (NoF, disk, local disk, DFS) are one box, so that the enum needs no tag word: 24 bytes, the
/// size of the buffer handle (the box uses the handle's non-null niche).
#[derive(Debug)]
pub(crate) enum ReplicaData {
    Memory(BufferHandle),
    Other(Box<OtherData>),
}

/// The replica kinds other than memory (see [`ReplicaData`]).
#[derive(Debug)]
pub(crate) enum OtherData {
    #[allow(dead_code)] // NoF is optional; kept so the enum matches the wire kinds.
    NoF(BufferHandle),
    #[allow(dead_code)]
    Disk(DiskDescriptor),
    #[allow(dead_code)]
    LocalDisk(LocalDiskDescriptor),
    #[allow(dead_code)]
    Dfs(DfsDescriptor),
}

/// A replica's place, borrowed from its [`ReplicaData`] (one arm per wire kind).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place<'a> {
    Memory(&'a BufferHandle),
    NoF(&'a BufferHandle),
    Disk(&'a DiskDescriptor),
    LocalDisk(&'a LocalDiskDescriptor),
    Dfs(&'a DfsDescriptor),
}

impl ReplicaData {
    pub fn nof(h: BufferHandle) -> Self {
        ReplicaData::Other(Box::new(OtherData::NoF(h)))
    }

    pub fn disk(d: DiskDescriptor) -> Self {
        ReplicaData::Other(Box::new(OtherData::Disk(d)))
    }

    pub fn local_disk(d: LocalDiskDescriptor) -> Self {
        ReplicaData::Other(Box::new(OtherData::LocalDisk(d)))
    }

    pub fn dfs(d: DfsDescriptor) -> Self {
        ReplicaData::Other(Box::new(OtherData::Dfs(d)))
    }

    pub fn place(&self) -> Place<'_> {
        match self {
            ReplicaData::Memory(h) => Place::Memory(h),
            ReplicaData::Other(o) => match &**o {
                OtherData::NoF(h) => Place::NoF(h),
                OtherData::Disk(d) => Place::Disk(d),
                OtherData::LocalDisk(d) => Place::LocalDisk(d),
                OtherData::Dfs(d) => Place::Dfs(d),
            },
        }
    }
}

/// One copy of an object.
#[derive(Debug)]
pub(crate) struct Replica {
    pub id: ReplicaId,
    pub status: ReplicaStatus,
    /// Pins the replica against eviction, removal and upsert while a copy or move reads it.
    /// Changed only under the shard's write lock. (At most one task per object holds it, so 16
    /// bits are plenty; the record carries it as `u32`.)
    pub refcnt: u16,
    /// Restored from a snapshot and not yet confirmed by its node (`restore.rs`): not readable,
    /// not a copy source, not evictable. Cleared by the node's confirmation or by a rewrite.
    /// Changed only under the shard's write lock.
    pub unverified: bool,
    pub data: ReplicaData,
}

/// Replicas taken out of an object (to be discarded, or freed once the change is observed).
/// Two inline: what one object usually holds.
pub(crate) type Removed = SmallVec<[Replica; 2]>;

/// The replicas of one object: none, one inline (the common case: no capacity word, no second
/// allocation), or several in a `Vec`. Reads as a slice.
#[derive(Debug, Default)]
pub(crate) struct Replicas(ReplicaSet);

#[derive(Debug, Default)]
enum ReplicaSet {
    #[default]
    Empty,
    One(Replica),
    Many(Vec<Replica>),
}

impl Replicas {
    pub fn new() -> Self {
        Replicas(ReplicaSet::Empty)
    }

    pub fn push(&mut self, r: Replica) {
        self.0 = match std::mem::take(&mut self.0) {
            ReplicaSet::Empty => ReplicaSet::One(r),
            ReplicaSet::One(first) => ReplicaSet::Many(vec![first, r]),
            ReplicaSet::Many(mut v) => {
                v.push(r);
                ReplicaSet::Many(v)
            }
        };
    }

    /// Takes out the replica at `index` (panics when out of range, as `Vec::remove`).
    pub fn remove(&mut self, index: usize) -> Replica {
        match std::mem::take(&mut self.0) {
            ReplicaSet::Empty => panic!("removal index {index} out of range (no replicas)"),
            ReplicaSet::One(r) => {
                assert_eq!(index, 0, "removal index out of range (one replica)");
                r
            }
            ReplicaSet::Many(mut v) => {
                let r = v.remove(index);
                self.0 = Self::from_vec(v).0;
                r
            }
        }
    }

    pub fn retain(&mut self, keep: impl FnMut(&Replica) -> bool) {
        let mut v = std::mem::take(self).into_vec();
        v.retain(keep);
        *self = Self::from_vec(v);
    }

    fn into_vec(self) -> Vec<Replica> {
        match self.0 {
            ReplicaSet::Empty => Vec::new(),
            ReplicaSet::One(r) => vec![r],
            ReplicaSet::Many(v) => v,
        }
    }

    fn from_vec(mut v: Vec<Replica>) -> Self {
        Replicas(match v.len() {
            0 => ReplicaSet::Empty,
            1 => v.pop().map_or(ReplicaSet::Empty, ReplicaSet::One),
            _ => ReplicaSet::Many(v),
        })
    }
}

impl std::ops::Deref for Replicas {
    type Target = [Replica];

    fn deref(&self) -> &[Replica] {
        match &self.0 {
            ReplicaSet::Empty => &[],
            ReplicaSet::One(r) => std::slice::from_ref(r),
            ReplicaSet::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Replicas {
    fn deref_mut(&mut self) -> &mut [Replica] {
        match &mut self.0 {
            ReplicaSet::Empty => &mut [],
            ReplicaSet::One(r) => std::slice::from_mut(r),
            ReplicaSet::Many(v) => v,
        }
    }
}

impl FromIterator<Replica> for Replicas {
    fn from_iter<I: IntoIterator<Item = Replica>>(iter: I) -> Self {
        let mut out = Replicas::new();
        for r in iter {
            out.push(r);
        }
        out
    }
}

impl<'a> IntoIterator for &'a Replicas {
    type Item = &'a Replica;
    type IntoIter = std::slice::Iter<'a, Replica>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a> IntoIterator for &'a mut Replicas {
    type Item = &'a mut Replica;
    type IntoIter = std::slice::IterMut<'a, Replica>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl Replica {
    /// The buffer it owns (memory-like replicas), given up to the caller.
    pub fn into_buffer(self) -> Option<BufferHandle> {
        match self.data {
            ReplicaData::Memory(h) => Some(h),
            ReplicaData::Other(o) => match *o {
                OtherData::NoF(h) => Some(h),
                _ => None,
            },
        }
    }

    pub fn replica_type(&self) -> ReplicaType {
        match self.data.place() {
            Place::Memory(_) => ReplicaType::MEMORY,
            Place::NoF(_) => ReplicaType::NOF_SSD,
            Place::Disk(_) => ReplicaType::DISK,
            Place::LocalDisk(_) => ReplicaType::LOCAL_DISK,
            Place::Dfs(_) => ReplicaType::DFS,
        }
    }

    pub fn handle(&self) -> Option<&BufferHandle> {
        match self.data.place() {
            Place::Memory(h) | Place::NoF(h) => Some(h),
            _ => None,
        }
    }

    /// False only for a memory-like replica whose segment is gone.
    pub fn is_valid(&self) -> bool {
        self.handle().is_none_or(BufferHandle::is_live)
    }

    pub fn is_complete(&self) -> bool {
        self.status == ReplicaStatus::COMPLETE
    }

    /// Readers may be handed it: COMPLETE, live, and not waiting for verification.
    pub fn is_readable(&self) -> bool {
        self.is_complete() && !self.unverified && self.is_valid()
    }

    /// Bytes this replica holds against its tenant's quota (memory-like replicas only).
    pub fn charged_bytes(&self) -> u64 {
        self.handle().map_or(0, BufferHandle::len)
    }

    /// Eviction may take it: a COMPLETE, verified, live MEMORY replica that nothing is reading.
    pub fn is_evictable(&self) -> bool {
        self.is_complete()
            && self.refcnt == 0
            && !self.unverified
            && matches!(&self.data, ReplicaData::Memory(h) if h.is_live())
    }

    /// The name of the segment it lives on (memory-like replicas with a live segment).
    pub fn segment_name(&self) -> Option<std::sync::Arc<str>> {
        self.handle()
            .and_then(BufferHandle::allocator)
            .map(|a| a.info().name.clone())
    }

    /// The descriptor, if the replica can be described (a memory replica needs its allocator).
    pub fn descriptor(&self, object_size: u64) -> Option<ReplicaDescriptor> {
        let kind = match self.data.place() {
            Place::Memory(h) | Place::NoF(h) => {
                let allocator = h.allocator()?;
                let info = allocator.info();
                let m = MemoryDescriptor {
                    size: h.len(),
                    buffer_address: info.base + h.offset(),
                    protocol: info.protocol.clone(),
                    transport_endpoint: info.endpoint.clone(),
                };
                if matches!(self.data, ReplicaData::Memory(_)) {
                    ReplicaKind::Memory(m)
                } else {
                    ReplicaKind::NoF(m)
                }
            }
            Place::Disk(d) => ReplicaKind::Disk(DiskDescriptor {
                object_size,
                ..d.clone()
            }),
            Place::LocalDisk(d) => ReplicaKind::LocalDisk(d.clone()),
            Place::Dfs(d) => ReplicaKind::Dfs(d.clone()),
        };
        Some(ReplicaDescriptor {
            id: self.id,
            status: self.status,
            kind,
        })
    }
}

/// A soft-pin request waiting for the PutEnd that completes the object's first replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PendingSoftPin {
    pub action: SoftPinAction,
    pub ttl_ms: u64,
}

/// Which kind of replication task holds an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskKind {
    Copy,
    Move,
}

/// An in-flight CopyStart/MoveStart (at most one per object).
#[derive(Debug, Clone)]
pub(crate) struct ReplicationTask {
    pub client: ClientId,
    pub start_ms: u64,
    pub kind: TaskKind,
    pub source: ReplicaId,
    pub targets: Vec<ReplicaId>,
}

/// Rarely-set fields, out of line so that the common object stays small.
#[derive(Debug, Default)]
pub(crate) struct ObjectExtra {
    /// Group id: the key lives in the group's shard.
    pub group: Option<Box<str>>,
    pub pending_soft_pin: Option<PendingSoftPin>,
    /// The tenant's quota account, when quotas are on: every memory replica's bytes are charged
    /// to it while the object holds the replica (see `ObjectMetadata::extract_replicas`).
    pub account: Option<Arc<TenantAccount>>,
    /// The object's copy or move task.
    pub task: Option<ReplicationTask>,
    /// Soft-pin deadline (ms); 0 = not pinned.
    pub soft_pin_deadline_ms: u64,
    /// The checksum's high 32 bits (see `ObjectMetadata::checksum`).
    pub checksum_high: u32,
}

pub(crate) const FLAG_HARD_PIN: u8 = 1;
pub(crate) const FLAG_HAS_CHECKSUM: u8 = 2;
pub(crate) const FLAG_PROCESSING: u8 = 4;

/// The read-pin epoch of a moment: the master clock in slices of half the lease TTL, mod 2^16.
/// A pin taken in epoch `e` holds while the epoch is `e`, `e + 1` or `e + 2`: between one and one
/// and a half TTLs after the last pin of the object, the backstop for a reader that never
/// releases (docs/master.md "Read pins").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadEpoch(pub u16);

impl ReadEpoch {
    pub fn at(now_ms: u64, lease_ttl_ms: u64) -> ReadEpoch {
        ReadEpoch((now_ms / (lease_ttl_ms / 2).max(1)) as u16)
    }

    /// How many epochs `self` lies after the last pin of the pins word `w` (negative: a
    /// concurrent reader's clock was a little ahead).
    fn since(self, w: u32) -> i16 {
        self.0.wrapping_sub((w >> 16) as u16) as i16
    }

    /// Whether the pins word `w` was last pinned within two epochs of `self`.
    fn is_fresh(self, w: u32) -> bool {
        (-2..=2).contains(&self.since(w))
    }
}

/// Bits of a stored time (ms since the Unix epoch): 2^42 ms is 139 years, so times up to the
/// year 2109 are exact; later ones are stored as the largest value (a lease "forever").
const TIME_BITS: u32 = 42;
const TIME_MAX: u64 = (1 << TIME_BITS) - 1;
/// Bits of the put-start time kept above each stored time (two halves of 22 bits).
const HALF_BITS: u32 = 64 - TIME_BITS;
const HALF_MASK: u64 = (1 << HALF_BITS) - 1;

/// An object's three times in two words (16 bytes instead of 24): the read-lease end and the
/// last access, each in the low 42 bits of an atomic (readers raise them under the shard's read
/// lock), and the put start split over the two words' top 22 bits (changed only under the write
/// lock, so the top bits are constant while readers run and `fetch_max` on a whole word is
/// `fetch_max` on its time).
#[derive(Debug)]
pub(crate) struct ObjectTimes {
    lease: AtomicU64,
    access: AtomicU64,
}

impl ObjectTimes {
    /// Put start `put_start_ms`, last access `access_ms`, no lease.
    pub fn new(put_start_ms: u64, access_ms: u64) -> Self {
        let mut t = ObjectTimes {
            lease: AtomicU64::new(0),
            access: AtomicU64::new(access_ms.min(TIME_MAX)),
        };
        t.set_put_start_ms(put_start_ms);
        t
    }

    fn time(word: &AtomicU64) -> u64 {
        word.load(Ordering::Relaxed) & TIME_MAX
    }

    pub fn put_start_ms(&self) -> u64 {
        let high = self.lease.load(Ordering::Relaxed) >> TIME_BITS;
        let low = self.access.load(Ordering::Relaxed) >> TIME_BITS;
        high << HALF_BITS | low
    }

    /// A new put start, in the two words' top bits (under the shard's write lock: `&mut`).
    pub fn set_put_start_ms(&mut self, put_start_ms: u64) {
        let p = put_start_ms.min(TIME_MAX);
        let halves = [
            (&mut self.lease, p >> HALF_BITS),
            (&mut self.access, p & HALF_MASK),
        ];
        for (word, half) in halves {
            let w = word.get_mut();
            *w = half << TIME_BITS | (*w & TIME_MAX);
        }
    }

    pub fn lease_timeout_ms(&self) -> u64 {
        Self::time(&self.lease)
    }

    pub fn last_access_ms(&self) -> u64 {
        Self::time(&self.access)
    }

    /// Raises the time of `word` to `t` (never lowers it).
    fn raise(word: &AtomicU64, t: u64) {
        let w = word.load(Ordering::Relaxed);
        let t = t.min(TIME_MAX);
        if w & TIME_MAX < t {
            word.fetch_max(w & !TIME_MAX | t, Ordering::Relaxed);
        }
    }
}

/// The metadata of one object.
#[derive(Debug)]
pub(crate) struct ObjectMetadata {
    /// The writer: only it may End or Revoke. Interned (4 bytes instead of 16).
    pub writer: WriterId,
    /// Value length in bytes (> 0, immutable).
    pub size: u64,
    /// Put start; read lease end (0 = never leased; grants only raise it); last completed
    /// write or successful read (eviction order). All ms on the master clock.
    pub times: ObjectTimes,
    /// Read pins of this client's reads in flight: `epoch << 16 | count` (see [`ReadPins`]).
    /// Not state (as the lease).
    pub read_pins: AtomicU32,
    /// Low 32 bits of the checksum, valid when `FLAG_HAS_CHECKSUM` is set (the client's CRC32C
    /// fits; higher bits, never set by our client, live in `extra`).
    pub checksum_low: u32,
    pub flags: u8,
    pub data_type: DataType,
    pub extra: Option<Box<ObjectExtra>>,
    pub replicas: Replicas,
}

impl ObjectMetadata {
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    pub fn set(&mut self, flag: u8, on: bool) {
        if on {
            self.flags |= flag;
        } else {
            self.flags &= !flag;
        }
    }

    pub fn is_processing(&self) -> bool {
        self.has(FLAG_PROCESSING)
    }

    pub fn checksum(&self) -> Option<u64> {
        let high = self.extra.as_ref().map_or(0, |e| e.checksum_high);
        self.has(FLAG_HAS_CHECKSUM)
            .then_some(u64::from(high) << 32 | u64::from(self.checksum_low))
    }

    pub fn set_checksum(&mut self, checksum: Option<u64>) {
        let c = checksum.unwrap_or(0);
        self.checksum_low = c as u32;
        let high = (c >> 32) as u32;
        if high != 0 {
            self.extra_mut().checksum_high = high;
        } else if let Some(e) = self.extra.as_mut() {
            e.checksum_high = 0;
            self.compact_extra();
        }
        self.set(FLAG_HAS_CHECKSUM, checksum.is_some());
    }

    /// Valid: `size > 0` and at least one replica that is not a dead memory replica.
    pub fn is_valid(&self) -> bool {
        self.size > 0 && self.replicas.iter().any(Replica::is_valid)
    }

    pub fn has_complete(&self) -> bool {
        self.replicas.iter().any(Replica::is_complete)
    }

    pub fn all_complete(&self) -> bool {
        self.replicas.iter().all(Replica::is_complete)
    }

    /// Lazy cleanup: erase memory-like replicas whose segment is gone (they hold nothing, so no
    /// buffer is freed). True if any was erased.
    pub fn drop_dead_replicas(&mut self) -> bool {
        self.retain_replicas(Replica::is_valid) > 0
    }

    /// The unmount sweep's cleanup: erase the COMPLETE replicas whose segment is gone (in-flight
    /// ones are left to the writer's next call or the put-timeout reaper, as upstream).
    pub fn drop_dead_complete_replicas(&mut self) {
        self.retain_replicas(|r| !r.is_complete() || r.is_valid());
    }

    /// Keeps the replicas `keep` accepts; the others are dropped and their bytes refunded.
    /// Private: it drops buffers in place, which only dead replicas may do (a live buffer freed
    /// before its change is observed could be re-allocated and observed first; live replicas
    /// leave through [`ObjectMetadata::extract_replicas`]).
    fn retain_replicas(&mut self, mut keep: impl FnMut(&Replica) -> bool) -> usize {
        let before = self.replicas.len();
        let mut refund = 0u64;
        self.replicas.retain(|r| {
            let k = keep(r);
            if !k {
                debug_assert!(!r.is_valid(), "a live replica dropped in place");
                refund += r.charged_bytes();
            }
            k
        });
        self.refund(refund);
        before - self.replicas.len()
    }

    /// Takes every replica out (to discard them), refunding their bytes.
    pub fn take_replicas(&mut self) -> Removed {
        self.extract_replicas(|_| true)
    }

    /// Takes out the replicas `take` selects, in order, refunding their bytes. The caller keeps
    /// them alive until the change is observed, then discards or drops them.
    pub fn extract_replicas(&mut self, mut take: impl FnMut(&Replica) -> bool) -> Removed {
        let mut out = Removed::new();
        let mut i = 0;
        while i < self.replicas.len() {
            if take(&self.replicas[i]) {
                out.push(self.replicas.remove(i));
            } else {
                i += 1;
            }
        }
        self.refund(out.iter().map(Replica::charged_bytes).sum());
        out
    }

    /// A write whose writer is one of `dead` (clients the monitor expired): its PROCESSING
    /// replicas are taken out (to be freed once the change is observed) and the object leaves
    /// processing. Nothing for a complete object or a live writer.
    pub fn reap_write_of(&mut self, dead: &[ClientId]) -> Removed {
        if !self.is_processing() || !dead.contains(&self.writer.client()) {
            return Removed::new();
        }
        let reaped = self.extract_replicas(|r| r.status == ReplicaStatus::PROCESSING);
        self.set(FLAG_PROCESSING, false);
        reaped
    }

    pub fn account(&self) -> Option<&Arc<TenantAccount>> {
        self.extra.as_ref().and_then(|e| e.account.as_ref())
    }

    fn refund(&self, bytes: u64) {
        if bytes > 0 {
            if let Some(a) = self.account() {
                a.refund(bytes);
            }
        }
    }

    /// Bytes this object holds against its tenant's quota.
    pub fn charged_bytes(&self) -> u64 {
        self.replicas.iter().map(Replica::charged_bytes).sum()
    }

    pub fn group(&self) -> Option<&str> {
        self.extra.as_ref().and_then(|e| e.group.as_deref())
    }

    pub fn task(&self) -> Option<&ReplicationTask> {
        self.extra.as_ref().and_then(|e| e.task.as_ref())
    }

    pub fn has_task(&self) -> bool {
        self.task().is_some()
    }

    pub fn extra_mut(&mut self) -> &mut ObjectExtra {
        self.extra.get_or_insert_with(Box::default)
    }

    /// Soft-pin deadline (ms); 0 = not pinned. Kept in `extra` (rare).
    pub fn soft_pin_deadline_ms(&self) -> u64 {
        self.extra.as_ref().map_or(0, |e| e.soft_pin_deadline_ms)
    }

    /// Sets the soft-pin deadline (0 unpins; the `extra` box goes when nothing else is in it).
    pub fn set_soft_pin_deadline_ms(&mut self, deadline_ms: u64) {
        if deadline_ms != 0 {
            self.extra_mut().soft_pin_deadline_ms = deadline_ms;
        } else if let Some(e) = self.extra.as_mut() {
            e.soft_pin_deadline_ms = 0;
            self.compact_extra();
        }
    }

    pub fn soft_pinned(&self, now_ms: u64) -> bool {
        self.soft_pin_deadline_ms() > now_ms
    }

    /// True while the read lease runs (`now < lease_timeout`).
    pub fn is_leased(&self, now_ms: u64) -> bool {
        now_ms < self.times.lease_timeout_ms()
    }

    pub fn lease_timeout_ms(&self) -> u64 {
        self.times.lease_timeout_ms()
    }

    pub fn put_start_ms(&self) -> u64 {
        self.times.put_start_ms()
    }

    pub fn last_access_ms(&self) -> u64 {
        self.times.last_access_ms()
    }

    /// Grants a lease to `now + ttl`; a lease never shrinks.
    pub fn grant_lease(&self, now_ms: u64, ttl_ms: u64) {
        ObjectTimes::raise(&self.times.lease, now_ms.saturating_add(ttl_ms));
    }

    /// Whether a read pin of `at` (or one or two epochs earlier) is held.
    pub fn is_read_pinned(&self, at: ReadEpoch) -> bool {
        let w = self.read_pins.load(Ordering::Relaxed);
        w & 0xFFFF != 0 && at.is_fresh(w)
    }

    /// Pins the object for one read: the count rises (from 1 when the last pin went stale) and
    /// the epoch becomes `at`.
    pub fn pin_read(&self, at: ReadEpoch) {
        let _ = self
            .read_pins
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                let (epoch, count) = if w & 0xFFFF == 0 || !at.is_fresh(w) {
                    (u32::from(at.0), 0)
                } else if at.since(w) < 0 {
                    (w >> 16, w & 0xFFFF)
                } else {
                    (u32::from(at.0), w & 0xFFFF)
                };
                Some(epoch << 16 | (count + 1).min(0xFFFF))
            });
    }

    /// Releases one read pin (nothing when none is held or they went stale).
    pub fn unpin_read(&self, at: ReadEpoch) {
        let _ = self
            .read_pins
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                let count = w & 0xFFFF;
                if count == 0 {
                    None
                } else if at.is_fresh(w) {
                    Some(w - 1)
                } else {
                    Some(w & !0xFFFF)
                }
            });
    }

    pub fn touch(&self, now_ms: u64) {
        ObjectTimes::raise(&self.times.access, now_ms);
    }

    /// Drops the extra box when nothing in it is set.
    pub fn compact_extra(&mut self) {
        if self.extra.as_ref().is_some_and(|e| {
            e.group.is_none()
                && e.pending_soft_pin.is_none()
                && e.account.is_none()
                && e.task.is_none()
                && e.soft_pin_deadline_ms == 0
                && e.checksum_high == 0
        }) {
            self.extra = None;
        }
    }
}

impl Drop for ObjectMetadata {
    /// An erased object returns its replicas' bytes to the tenant's quota.
    fn drop(&mut self) {
        self.refund(self.charged_bytes());
    }
}

/// Longest key stored inline in its entry (bytes).
pub(crate) const INLINE_KEY_BYTES: usize = 22;

/// A user key. Keys up to [`INLINE_KEY_BYTES`] live inside the entry (no second allocation and
/// no second cache miss on lookup); longer ones are boxed. 24 bytes either way.
pub(crate) enum ObjectKey {
    Inline {
        len: u8,
        bytes: [u8; INLINE_KEY_BYTES],
    },
    Heap(Box<str>),
}

impl ObjectKey {
    pub fn new(key: &str) -> Self {
        if key.len() <= INLINE_KEY_BYTES {
            let mut bytes = [0u8; INLINE_KEY_BYTES];
            bytes[..key.len()].copy_from_slice(key.as_bytes());
            ObjectKey::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            ObjectKey::Heap(Box::from(key))
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        match self {
            ObjectKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            ObjectKey::Heap(b) => b.as_bytes(),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            // Built from a `&str` and never mutated, so always valid UTF-8.
            ObjectKey::Inline { .. } => std::str::from_utf8(self.as_bytes()).unwrap_or_default(),
            ObjectKey::Heap(b) => b,
        }
    }
}

impl std::ops::Deref for ObjectKey {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// One object: its user key and metadata, boxed as one allocation.
#[derive(Debug)]
pub(crate) struct ObjectEntry {
    pub key: ObjectKey,
    pub meta: ObjectMetadata,
}

/// A read-only view of one object, for admin endpoints and tests. Grants no lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub key: String,
    pub size: u64,
    pub writer: ClientId,
    pub put_start_ms: u64,
    pub lease_timeout_ms: u64,
    pub last_access_ms: u64,
    /// 0 = not soft-pinned.
    pub soft_pin_deadline_ms: u64,
    pub hard_pinned: bool,
    pub processing: bool,
    pub checksum: Option<u64>,
    pub data_type: DataType,
    pub group: Option<String>,
    /// `(id, type, status, live)` per replica.
    pub replicas: Vec<(ReplicaId, ReplicaType, ReplicaStatus, bool)>,
    /// Restored replicas still waiting for their node's check (not readable).
    pub unverified_replicas: Vec<ReplicaId>,
}

impl ObjectInfo {
    pub(crate) fn of(entry: &ObjectEntry) -> Self {
        let m = &entry.meta;
        ObjectInfo {
            key: entry.key.to_string(),
            size: m.size,
            writer: m.writer.client(),
            put_start_ms: m.put_start_ms(),
            lease_timeout_ms: m.lease_timeout_ms(),
            last_access_ms: m.last_access_ms(),
            soft_pin_deadline_ms: m.soft_pin_deadline_ms(),
            hard_pinned: m.has(FLAG_HARD_PIN),
            processing: m.is_processing(),
            checksum: m.checksum(),
            data_type: m.data_type,
            group: m
                .extra
                .as_ref()
                .and_then(|e| e.group.as_deref().map(str::to_string)),
            replicas: m
                .replicas
                .iter()
                .map(|r| (r.id, r.replica_type(), r.status, r.is_valid()))
                .collect(),
            unverified_replicas: m
                .replicas
                .iter()
                .filter(|r| r.unverified)
                .map(|r| r.id)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_pins_count_readers_and_lapse_two_epochs_after_the_last_pin() {
        let e = ReadEpoch;
        let word = |p: &AtomicU32| p.load(Ordering::Relaxed);
        // Two readers at epoch 65535 (wrapping next), one released at epoch 0.
        let m = bare(1);
        m.pin_read(e(65535));
        m.pin_read(e(65535));
        assert_eq!(word(&m.read_pins) & 0xFFFF, 2);
        m.unpin_read(e(0));
        assert!(
            m.is_read_pinned(e(1)),
            "one reader left, one epoch later (wrapped)"
        );
        assert!(
            !m.is_read_pinned(e(2)),
            "three epochs after the last pin: lapsed"
        );
        // A reader whose clock is a little behind keeps the later epoch and the count.
        m.pin_read(e(10));
        m.pin_read(e(9));
        assert_eq!(word(&m.read_pins), 10 << 16 | 2);
        // A pin on a lapsed count starts from one; a release on one clears it.
        m.pin_read(e(20));
        assert_eq!(word(&m.read_pins), 20 << 16 | 1);
        m.unpin_read(e(30));
        assert_eq!(word(&m.read_pins) & 0xFFFF, 0);
        m.unpin_read(e(30));
        assert!(!m.is_read_pinned(e(30)));
        assert_eq!(ReadEpoch::at(12_345, 10_000), ReadEpoch(2));
    }

    #[test]
    fn per_object_structs_stay_small() {
        // docs/master.md ("Memory per object") is computed from these sizes; growing them needs
        // a new measurement.
        let sizes = [
            ("Replica", std::mem::size_of::<Replica>()),
            ("Replicas", std::mem::size_of::<Replicas>()),
            ("ObjectMetadata", std::mem::size_of::<ObjectMetadata>()),
            ("ObjectEntry", std::mem::size_of::<ObjectEntry>()),
        ];
        println!("{sizes:?}");
        assert_eq!(std::mem::size_of::<ReplicaData>(), 24);
        assert!(std::mem::size_of::<Replica>() <= 40, "{sizes:?}");
        assert_eq!(
            std::mem::size_of::<Replicas>(),
            std::mem::size_of::<Replica>(),
            "one replica inline, no capacity word"
        );
        assert_eq!(std::mem::size_of::<ObjectKey>(), 24);
        assert!(std::mem::size_of::<ObjectEntry>() <= 112, "{sizes:?}");
    }

    fn bare(size: u64) -> ObjectMetadata {
        ObjectMetadata {
            writer: WriterId::of(ClientId::new(1, 1)),
            size,
            times: ObjectTimes::new(0, 0),
            read_pins: AtomicU32::new(0),
            checksum_low: 0,
            flags: 0,
            data_type: DataType::default(),
            extra: None,
            replicas: Replicas::new(),
        }
    }

    #[test]
    fn packed_times_keep_the_put_start_apart_from_lease_and_access() {
        let now = 1_765_000_000_000; // a 2025 wall-clock time in ms
        let mut t = ObjectTimes::new(now, now + 1);
        assert_eq!(
            (t.put_start_ms(), t.last_access_ms(), t.lease_timeout_ms()),
            (now, now + 1, 0)
        );
        ObjectTimes::raise(&t.lease, now + 5_000);
        ObjectTimes::raise(&t.lease, now + 10);
        ObjectTimes::raise(&t.access, now + 7);
        t.set_put_start_ms(now + 3);
        assert_eq!(
            (t.put_start_ms(), t.last_access_ms(), t.lease_timeout_ms()),
            (now + 3, now + 7, now + 5_000),
            "raises never lower a time; the put start leaves both times alone"
        );
        // Past 2^42 ms everything saturates (a lease to u64::MAX stays "forever").
        ObjectTimes::raise(&t.lease, u64::MAX);
        t.set_put_start_ms(u64::MAX);
        assert_eq!(t.lease_timeout_ms(), TIME_MAX);
        assert_eq!(t.put_start_ms(), TIME_MAX);
        assert_eq!(t.last_access_ms(), now + 7);
    }

    #[test]
    fn checksum_high_bits_go_out_of_line_and_come_back() {
        let mut m = bare(1);
        m.set_checksum(Some(0xDEAD_BEEF));
        assert_eq!(m.checksum(), Some(0xDEAD_BEEF));
        assert!(m.extra.is_none(), "a CRC32C fits inline");
        m.set_checksum(Some(0x1234_5678_9ABC_DEF0));
        assert_eq!(m.checksum(), Some(0x1234_5678_9ABC_DEF0));
        m.set_checksum(None);
        assert_eq!(m.checksum(), None);
        assert!(m.extra.is_none(), "the extra box goes once empty");
        m.set_soft_pin_deadline_ms(9);
        assert_eq!(m.soft_pin_deadline_ms(), 9);
        m.set_soft_pin_deadline_ms(0);
        assert!(m.extra.is_none());
    }

    #[test]
    fn replicas_hold_one_inline_and_more_in_a_vec() {
        let replica = |id| Replica {
            id: ReplicaId(id),
            status: ReplicaStatus::COMPLETE,
            refcnt: 0,
            unverified: false,
            data: ReplicaData::disk(DiskDescriptor {
                file_path: String::new(),
                object_size: 1,
            }),
        };
        let ids = |r: &Replicas| r.iter().map(|r| r.id.0).collect::<Vec<_>>();
        let mut r: Replicas = (1..=3).map(replica).collect();
        assert_eq!(ids(&r), [1, 2, 3]);
        assert_eq!(r.remove(1).id.0, 2);
        r.retain(|x| x.id.0 != 1);
        assert!(matches!(r.0, ReplicaSet::One(_)), "back to inline");
        r.push(replica(4));
        assert_eq!(ids(&r), [3, 4]);
        r.retain(|_| false);
        assert!(r.is_empty() && matches!(r.0, ReplicaSet::Empty));
        r.push(replica(5));
        assert_eq!(r.remove(0).id.0, 5);
        assert!(r.is_empty());
    }

    #[test]
    fn extra_box_size_is_known() {
        // Allocated only for grouped, soft-pin-pending, multi-tenant or copy/move objects;
        // docs/master.md quotes this size.
        let n = std::mem::size_of::<ObjectExtra>();
        assert!(n <= 120, "{n}");
        println!("ObjectExtra: {n} bytes");
    }

    #[test]
    fn short_keys_inline_long_keys_boxed() {
        for key in [
            "",
            "k",
            "exactly-22-bytes-key!!",
            "twenty-three-bytes-key!",
            "ü€",
        ] {
            let k = ObjectKey::new(key);
            assert_eq!(k.as_str(), key);
            assert_eq!(k.as_bytes(), key.as_bytes());
            assert_eq!(
                matches!(k, ObjectKey::Inline { .. }),
                key.len() <= INLINE_KEY_BYTES
            );
        }
    }
}
