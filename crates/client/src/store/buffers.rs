//! Caller memory as the local side of transfers: buffers the caller registers once
//! ([`StoreClient::register_buffer`]), and the per-operation pins that register any other slice
//! for the duration of one operation.

use mooncake_transfer::{TransferEngine, TransferError};

use super::{StoreClient, StoreError};

impl StoreClient {
    /// Registers caller memory for zero-copy `put`/`get_into` calls on slices inside it.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must stay valid for reads and writes until
    /// [`StoreClient::unregister_buffer`] returns `Ok` or the client is closed.
    pub unsafe fn register_buffer(&self, ptr: *mut u8, len: usize) -> Result<(), StoreError> {
        // SAFETY: forwarded to the caller's contract.
        let region = unsafe { self.inner.engine.register_user_buffer(ptr, len) }?;
        self.inner
            .user_buffers
            .lock()
            .insert(ptr as usize, (len, region));
        Ok(())
    }

    /// Unregisters a buffer registered at `ptr`, waiting for transfers that use it.
    pub fn unregister_buffer(&self, ptr: *mut u8) -> Result<(), StoreError> {
        let entry = self.inner.user_buffers.lock().remove(&(ptr as usize));
        let Some((len, region)) = entry else {
            return Err(StoreError::InvalidParams(format!(
                "no buffer registered at {ptr:p}"
            )));
        };
        if let Err(error) = self.inner.engine.unregister(region) {
            self.inner
                .user_buffers
                .lock()
                .insert(ptr as usize, (len, region));
            return Err(error.into());
        }
        Ok(())
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
                !registered
                    .iter()
                    .any(|(&start, &(rlen, _))| addr >= start && addr + len <= start + rlen)
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
