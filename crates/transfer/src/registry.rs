//! Registered memory: which address ranges this process lets transfers touch, and how many
//! transfers are touching each region right now.
//!
//! Every transfer holds an [`InflightGuard`] for the region it reads or writes; unregistering a
//! region first closes it to new transfers, then waits (bounded) until its guards are gone.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::error::TransferError;
use crate::memory::Mapping;

/// What a region is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegionKind {
    /// Contributed memory that peers may read and write by segment id. `shareable` segments may
    /// also be mapped by same-host peers over the shared-memory transport.
    Segment { shareable: bool },
    /// Engine-allocated memory used only as the local side of transfers.
    LocalBuffer,
    /// Caller-owned memory (zero-copy put/get), used only as the local side of transfers.
    UserBuffer,
}

#[derive(Debug, Default)]
struct RegionState {
    inflight: usize,
    closing: bool,
}

/// One registered region.
#[derive(Debug)]
pub struct Region {
    id: u64,
    kind: RegionKind,
    base: usize,
    len_bytes: usize,
    /// Keeps engine-allocated memory mapped while anyone (guards, handles) still refers to it.
    mapping: Option<Arc<Mapping>>,
    state: Mutex<RegionState>,
    drained: Condvar,
}

impl Region {
    pub fn id(&self) -> u64 {
        self.id
    }
    pub fn kind(&self) -> RegionKind {
        self.kind
    }
    pub fn base(&self) -> usize {
        self.base
    }
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }
    pub fn mapping(&self) -> Option<&Arc<Mapping>> {
        self.mapping.as_ref()
    }
    /// Transfers currently holding this region.
    pub fn inflight(&self) -> usize {
        self.state.lock().inflight
    }

    fn acquire(self: &Arc<Self>, offset: usize, len_bytes: usize) -> Option<InflightGuard> {
        let mut state = self.state.lock();
        if state.closing {
            return None;
        }
        state.inflight += 1;
        Some(InflightGuard {
            region: Arc::clone(self),
            ptr: self.base + offset,
            len_bytes,
        })
    }
}

/// Proof that a range is inside a registered region, which stays registered (and mapped) while
/// the guard lives.
#[derive(Debug)]
pub struct InflightGuard {
    region: Arc<Region>,
    ptr: usize,
    len_bytes: usize,
}

impl InflightGuard {
    /// First byte of the checked range.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let mut state = self.region.state.lock();
        state.inflight -= 1;
        if state.inflight == 0 {
            self.region.drained.notify_all();
        }
    }
}

#[derive(Debug, Default)]
struct Maps {
    by_id: HashMap<u64, Arc<Region>>,
    by_addr: BTreeMap<usize, Arc<Region>>,
}

/// All regions of one engine.
#[derive(Debug)]
pub struct Registry {
    maps: RwLock<Maps>,
    next_id: AtomicU64,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            maps: RwLock::new(Maps::default()),
            next_id: AtomicU64::new(1),
        }
    }
}

impl Registry {
    /// Registers `[base, base+len_bytes)`. Overlap with a registered region is rejected.
    pub fn register(
        &self,
        kind: RegionKind,
        base: usize,
        len_bytes: usize,
        mapping: Option<Arc<Mapping>>,
    ) -> Result<Arc<Region>, TransferError> {
        let end = base.checked_add(len_bytes).ok_or_else(|| {
            TransferError::InvalidParams(format!("region {base:#x}+{len_bytes} wraps around"))
        })?;
        if len_bytes == 0 || base == 0 {
            return Err(TransferError::InvalidParams(
                "a region needs a non-null base and a non-zero length".into(),
            ));
        }
        let mut maps = self.maps.write();
        let clash = maps
            .by_addr
            .range(..end)
            .next_back()
            .filter(|(_, r)| r.base + r.len_bytes > base);
        if let Some((_, existing)) = clash {
            return Err(TransferError::Overlap {
                addr: base,
                len_bytes: len_bytes as u64,
                existing_id: existing.id,
            });
        }
        let region = Arc::new(Region {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            kind,
            base,
            len_bytes,
            mapping,
            state: Mutex::new(RegionState::default()),
            drained: Condvar::new(),
        });
        maps.by_id.insert(region.id, Arc::clone(&region));
        maps.by_addr.insert(base, Arc::clone(&region));
        Ok(region)
    }

    /// The region with this id, if registered.
    pub fn get(&self, region_id: u64) -> Option<Arc<Region>> {
        self.maps.read().by_id.get(&region_id).cloned()
    }

    /// Checks that `[offset, offset+len)` lies in segment `segment_id` (a region registered as a
    /// segment, i.e. remote-accessible) and pins it.
    pub fn acquire_segment(
        &self,
        segment_id: u64,
        offset: u64,
        len_bytes: u64,
    ) -> Result<InflightGuard, TransferError> {
        let not_found = TransferError::SegmentNotFound { segment_id };
        let region = self.get(segment_id).ok_or_else(|| not_found.clone())?;
        if !matches!(region.kind, RegionKind::Segment { .. }) {
            return Err(not_found);
        }
        let size_bytes = region.len_bytes as u64;
        let fits = offset
            .checked_add(len_bytes)
            .is_some_and(|end| end <= size_bytes);
        if !fits {
            return Err(TransferError::OutOfBounds {
                segment_id,
                offset,
                len_bytes,
                size_bytes,
            });
        }
        // fits => offset and len are below size_bytes, which is a usize.
        region
            .acquire(offset as usize, len_bytes as usize)
            .ok_or(not_found)
    }

    /// Checks that `[addr, addr+len)` lies inside one registered region (any kind) and pins it.
    pub fn acquire_local(
        &self,
        addr: usize,
        len_bytes: u64,
    ) -> Result<InflightGuard, TransferError> {
        let err = TransferError::LocalRangeNotRegistered { addr, len_bytes };
        let len = usize::try_from(len_bytes).map_err(|_| err.clone())?;
        let end = addr.checked_add(len).ok_or_else(|| err.clone())?;
        let region = {
            let maps = self.maps.read();
            maps.by_addr
                .range(..=addr)
                .next_back()
                .map(|(_, r)| Arc::clone(r))
        };
        let region = region.ok_or_else(|| err.clone())?;
        if end > region.base + region.len_bytes {
            return Err(err);
        }
        region.acquire(addr - region.base, len).ok_or(err)
    }

    /// Closes the region to new transfers, waits up to `timeout` for the running ones, then
    /// forgets it. On timeout the region is reopened and stays registered (`RegionBusy`), so the
    /// caller must not free its memory.
    pub fn unregister(&self, region_id: u64, timeout: Duration) -> Result<(), TransferError> {
        let region = self
            .get(region_id)
            .ok_or(TransferError::RegionNotFound { region_id })?;
        let started = Instant::now();
        let deadline = started + timeout;
        {
            let mut state = region.state.lock();
            state.closing = true;
            while state.inflight > 0 {
                if region.drained.wait_until(&mut state, deadline).timed_out() && state.inflight > 0
                {
                    state.closing = false;
                    return Err(TransferError::RegionBusy {
                        region_id,
                        inflight: state.inflight,
                        waited_ms: started.elapsed().as_millis() as u64,
                    });
                }
            }
        }
        let mut maps = self.maps.write();
        maps.by_id.remove(&region_id);
        maps.by_addr.remove(&region.base);
        Ok(())
    }

    /// Every registered region.
    pub fn regions(&self) -> Vec<Arc<Region>> {
        self.maps.read().by_id.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const SEG: RegionKind = RegionKind::Segment { shareable: true };

    #[test]
    fn overlapping_regions_are_rejected() {
        let registry = Registry::default();
        registry.register(SEG, 0x1000, 0x1000, None).unwrap();
        for (base, len) in [(0x1800, 0x100), (0x800, 0x900), (0x0fff, 2), (0x1fff, 1)] {
            assert!(
                matches!(
                    registry.register(SEG, base, len, None),
                    Err(TransferError::Overlap { .. })
                ),
                "{base:#x}+{len:#x} should overlap"
            );
        }
        registry.register(SEG, 0x2000, 0x10, None).unwrap();
        registry.register(SEG, 0x800, 0x800, None).unwrap();
    }

    #[test]
    fn segment_bounds_are_checked() {
        let registry = Registry::default();
        let seg = registry.register(SEG, 0x10000, 100, None).unwrap();
        let buf = registry
            .register(RegionKind::LocalBuffer, 0x20000, 100, None)
            .unwrap();
        assert!(registry.acquire_segment(seg.id(), 0, 100).is_ok());
        assert!(registry.acquire_segment(seg.id(), 99, 1).is_ok());
        assert!(matches!(
            registry.acquire_segment(seg.id(), 99, 2),
            Err(TransferError::OutOfBounds { .. })
        ));
        assert!(matches!(
            registry.acquire_segment(seg.id(), u64::MAX, 2),
            Err(TransferError::OutOfBounds { .. })
        ));
        assert!(matches!(
            registry.acquire_segment(buf.id(), 0, 1),
            Err(TransferError::SegmentNotFound { .. })
        ));
        assert!(matches!(
            registry.acquire_segment(999, 0, 1),
            Err(TransferError::SegmentNotFound { .. })
        ));
    }

    #[test]
    fn local_ranges_must_sit_inside_one_region() {
        let registry = Registry::default();
        registry
            .register(RegionKind::UserBuffer, 0x10000, 100, None)
            .unwrap();
        registry
            .register(RegionKind::UserBuffer, 0x10064, 100, None)
            .unwrap();
        let guard = registry.acquire_local(0x10010, 10).unwrap();
        assert_eq!(guard.ptr() as usize, 0x10010);
        // spans two adjacent regions: rejected
        assert!(registry.acquire_local(0x10060, 10).is_err());
        assert!(registry.acquire_local(0xffff, 1).is_err());
        assert!(registry.acquire_local(usize::MAX, 2).is_err());
    }

    #[test]
    fn unregister_waits_for_guards_and_times_out_while_held() {
        let registry = Arc::new(Registry::default());
        let seg = registry.register(SEG, 0x10000, 100, None).unwrap();
        let guard = registry.acquire_segment(seg.id(), 0, 10).unwrap();
        let err = registry
            .unregister(seg.id(), Duration::from_millis(20))
            .unwrap_err();
        assert!(
            matches!(err, TransferError::RegionBusy { inflight: 1, .. }),
            "{err}"
        );
        // still registered and usable after the failed unregister
        assert!(registry.acquire_segment(seg.id(), 0, 1).is_ok());

        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(guard);
        });
        let started = Instant::now();
        registry
            .unregister(seg.id(), Duration::from_secs(5))
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(40));
        releaser.join().unwrap();
        assert!(registry.get(seg.id()).is_none());
        assert!(registry.acquire_segment(seg.id(), 0, 1).is_err());
    }
}
