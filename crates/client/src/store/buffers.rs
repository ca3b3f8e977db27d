//! Caller memory as the local side of transfers: buffers the caller registers once
//! ([`StoreClient::register_buffer`]), memory this client allocates for the caller
//! ([`StoreClient::allocate_registered`]), the checks on memory handed over by address
//! ([`StoreClient::check_caller_ranges`]), the `local_buffer_size` cap on objects in other
//! memory, and the per-operation pins that register any other slice for one operation.

use mooncake_transfer::memory::{Access, MappedRanges};
use mooncake_transfer::{TransferEngine, TransferError};

use super::{StoreClient, StoreError};

/// A buffer the caller registered: its length, its region id in the transfer engine, and how
/// many times `register_buffer` was called again for ranges inside it (each such call is
/// answered 0 and needs its own `unregister_buffer`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Registered {
    pub len: usize,
    pub region: u64,
    pub nested: usize,
}

impl StoreClient {
    /// Registers caller memory for zero-copy `put`/`get_into` calls on slices inside it.
    ///
    /// The range is checked to be mapped readable and writable in this process first (once per
    /// registration), so a bad address is `InvalidParams` rather than a fault in a later copy.
    /// A range inside a buffer that is already registered (a pool handed out by
    /// [`StoreClient::allocate_registered`], or a sub-range of an earlier registration) is
    /// accepted as is; its `unregister_buffer` then only forgets that call.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must stay valid for reads and writes until
    /// [`StoreClient::unregister_buffer`] returns `Ok` or the client is closed.
    pub unsafe fn register_buffer(&self, ptr: *mut u8, len: usize) -> Result<(), StoreError> {
        self.check_open()?;
        let addr = ptr as usize;
        {
            let mut registered = self.inner.user_buffers.lock();
            let containing = registered
                .range_mut(..=addr)
                .next_back()
                .filter(|(start, r)| addr.checked_add(len).is_some_and(|e| e <= *start + r.len));
            if let Some((_, entry)) = containing {
                entry.nested += 1;
                return Ok(());
            }
        }
        // SAFETY: forwarded to the caller's contract; the engine checks the range is mapped.
        let region = unsafe { self.inner.engine.register_caller_memory(ptr, len) }?;
        self.inner.user_buffers.lock().insert(
            addr,
            Registered {
                len,
                region,
                nested: 0,
            },
        );
        Ok(())
    }

    /// Unregisters a buffer registered at `ptr`, waiting for transfers that use it.
    pub fn unregister_buffer(&self, ptr: *mut u8) -> Result<(), StoreError> {
        let addr = ptr as usize;
        let entry = {
            let mut registered = self.inner.user_buffers.lock();
            // A nested registration (inside another buffer, or a second call for the same
            // start) is forgotten first; the memory stays registered for the outer one.
            let holder = registered
                .range_mut(..=addr)
                .next_back()
                .filter(|(start, r)| addr < *start + r.len.max(1) && r.nested > 0);
            if let Some((_, outer)) = holder {
                outer.nested -= 1;
                return Ok(());
            }
            registered.remove(&addr)
        };
        let Some(entry) = entry else {
            return Err(StoreError::InvalidParams(format!(
                "no buffer registered at {ptr:p}"
            )));
        };
        if let Err(error) = self.inner.engine.unregister(entry.region) {
            self.inner.user_buffers.lock().insert(addr, entry);
            return Err(error.into());
        }
        Ok(())
    }

    /// Allocates `len` bytes of zeroed shared memory (a memfd mapping) in this process and
    /// registers it like a caller buffer: zero-copy calls on it need no per-call registration.
    /// The memory lives until the client is closed. Returns its address. Backs the Python
    /// binding's `alloc_from_mem_pool`.
    pub fn allocate_registered(&self, len: usize) -> Result<usize, StoreError> {
        self.check_open()?;
        let memory = self.inner.engine.allocate_local_buffer(len)?;
        let addr = memory.as_ptr() as usize;
        self.inner.user_buffers.lock().insert(
            addr,
            Registered {
                len,
                region: memory.id(),
                nested: 0,
            },
        );
        self.inner.pool.lock().push(memory);
        Ok(addr)
    }

    /// Checks memory a caller handed over as `(address, length, access)` before anything
    /// touches it (the raw-pointer calls of the Python binding). A range that starts inside a
    /// registered buffer must end inside it; any other range must be mapped with `access` in
    /// this process (`/proc/self/maps`, read at most once per call). One result per range;
    /// `InvalidParams` says what is wrong. Empty ranges pass.
    pub fn check_caller_ranges(
        &self,
        ranges: &[(usize, usize, Access)],
    ) -> Vec<Result<(), StoreError>> {
        let mut unregistered = Vec::new();
        let mut out: Vec<Result<(), StoreError>> = Vec::with_capacity(ranges.len());
        {
            let registered = self.inner.user_buffers.lock();
            for (i, &(addr, len, _)) in ranges.iter().enumerate() {
                if len == 0 {
                    out.push(Ok(()));
                    continue;
                }
                let Some(end) = addr.checked_add(len) else {
                    out.push(Err(StoreError::InvalidParams(format!(
                        "range {addr:#x}+{len} wraps around the address space"
                    ))));
                    continue;
                };
                let inside = registered
                    .range(..=addr)
                    .next_back()
                    .filter(|(start, r)| addr < **start + r.len);
                match inside {
                    Some((start, r)) if end <= start + r.len => out.push(Ok(())),
                    Some((start, r)) => out.push(Err(StoreError::InvalidParams(format!(
                        "{len} bytes at {addr:#x} run past the registered buffer \
                         [{start:#x}, +{})",
                        r.len
                    )))),
                    None => {
                        out.push(Ok(()));
                        unregistered.push(i);
                    }
                }
            }
        }
        if unregistered.is_empty() {
            return out;
        }
        let maps = match MappedRanges::read() {
            Ok(maps) => maps,
            Err(error) => {
                for i in unregistered {
                    out[i] = Err(error.clone().into());
                }
                return out;
            }
        };
        for i in unregistered {
            let (addr, len, access) = ranges[i];
            if !maps.covers(addr, len, access) {
                out[i] = Err(StoreError::InvalidParams(format!(
                    "memory [{addr:#x}, +{len}) is not mapped {access:?} in this process"
                )));
            }
        }
        out
    }

    /// True when `[addr, addr+len)` lies inside one registered buffer.
    pub(super) fn is_registered(&self, addr: usize, len: usize) -> bool {
        let registered = self.inner.user_buffers.lock();
        registered
            .range(..=addr)
            .next_back()
            .is_some_and(|(start, r)| addr.checked_add(len).is_some_and(|e| e <= start + r.len))
    }

    /// The `local_buffer_size` cap. Upstream copies every call on memory outside registered
    /// buffers through a staging arena of that size, so such an object can be at most that
    /// large. We read and write caller memory in place (no arena, so concurrent calls never
    /// compete for one) and keep the cap: an object of `total` bytes whose memory (`ranges`)
    /// is not all inside registered buffers fails with `InvalidParams` when `total` exceeds it.
    pub(super) fn check_staging(
        &self,
        ranges: impl Iterator<Item = (usize, usize)>,
        total: u64,
    ) -> Result<(), StoreError> {
        let cap = self.inner.config.local_buffer_size;
        if total <= cap {
            return Ok(());
        }
        let mut ranges = ranges.filter(|(_, len)| *len > 0).peekable();
        let all_registered =
            ranges.peek().is_some() && ranges.all(|(addr, len)| self.is_registered(addr, len));
        if all_registered {
            return Ok(());
        }
        Err(StoreError::InvalidParams(format!(
            "a {total}-byte object in memory that is not registered exceeds local_buffer_size \
             ({cap} bytes): register the buffer or raise local_buffer_size"
        )))
    }

    /// Makes every `(addr, len)` usable as the local side of transfers until the returned pins
    /// drop: ranges inside a caller-registered buffer need nothing; others are registered now.
    pub(super) fn pin_all(
        &self,
        ranges: impl Iterator<Item = (usize, usize)>,
    ) -> Result<Pins<'_>, StoreError> {
        let mut pins = Pins {
            engine: &self.inner.engine,
            regions: Vec::new(),
        };
        let mut wanted: Vec<(usize, usize)> = ranges.filter(|(_, len)| *len > 0).collect();
        {
            let registered = self.inner.user_buffers.lock();
            wanted.retain(|&(addr, len)| {
                registered
                    .range(..=addr)
                    .next_back()
                    .is_none_or(|(&start, r)| addr + len > start + r.len)
            });
        }
        // Merge overlapping or touching ranges so each byte is registered once.
        wanted.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (addr, len) in wanted {
            match merged.last_mut() {
                Some((start, mlen)) if addr <= *start + *mlen => {
                    *mlen = (*mlen).max(addr + len - *start);
                }
                _ => merged.push((addr, len)),
            }
        }
        for (addr, len) in merged {
            // SAFETY: the ranges come from slices borrowed by the calling operation, which holds
            // them until the pins drop; `Pins::drop` unregisters (waiting out in-flight transfers)
            // before that borrow ends, on every path including cancellation.
            let region = unsafe { self.inner.engine.register_user_buffer(addr as *mut u8, len) }?;
            pins.regions.push(region);
        }
        Ok(pins)
    }
}

/// Registrations made for one operation; dropping them unregisters, waiting out transfers.
pub(super) struct Pins<'a> {
    engine: &'a TransferEngine,
    regions: Vec<u64>,
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        for &region in &self.regions {
            // Unregister waits for in-flight transfers; every transfer has a deadline, so this
            // loop ends. Returning before it succeeds could let the engine touch freed memory.
            while let Err(TransferError::RegionBusy { .. }) = self.engine.unregister(region) {}
        }
    }
}
