//! The global budget for buffered request bytes, and the buffers of large frames.
//!
//! A connection serves frames up to [`SMALL_FRAME_BYTES`] from its own read buffer, which never
//! grows past that (plus one read's slack). A larger frame first takes its whole length from the
//! [`RequestBudget`] shared by every connection, then arrives into a [`FrameBuf`] of exactly its
//! size, which is freed as soon as the handler returns. While the budget is spent the connection
//! stops reading (the peer's writes block: backpressure); a frame that waits long enough sheds
//! the oldest frame still holding budget (see `server.rs`). Frames of [`MAPPED_FRAME_BYTES`] and
//! more live in their own anonymous mapping, so their memory goes back to the kernel when they
//! are freed, whatever the allocator keeps for itself.

use std::ptr::NonNull;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Frames up to this size (header included) are read into the connection's own buffer.
pub const SMALL_FRAME_BYTES: usize = 64 << 10;
/// Frames of at least this size get their own anonymous mapping.
pub const MAPPED_FRAME_BYTES: usize = 1 << 20;
/// The budget counts in units of this many bytes (a semaphore permit each).
const UNIT_BYTES: usize = 1024;

/// Bytes of large frames that every connection together may hold.
#[derive(Debug, Clone)]
pub(crate) struct RequestBudget {
    permits: Arc<Semaphore>,
}

/// A share of the budget, returned when dropped (or handed to another frame, see `server.rs`).
#[derive(Debug)]
pub(crate) struct BudgetShare {
    permit: OwnedSemaphorePermit,
}

impl BudgetShare {
    /// Budget units held.
    pub(crate) fn units(&self) -> usize {
        self.permit.num_permits()
    }

    /// Adds `other` to this share.
    pub(crate) fn merge(&mut self, other: BudgetShare) {
        self.permit.merge(other.permit);
    }

    /// Gives back whatever exceeds `units`.
    pub(crate) fn trim_to(&mut self, units: usize) {
        let excess = self.units().saturating_sub(units);
        if excess > 0 {
            drop(self.permit.split(excess));
        }
    }
}

impl RequestBudget {
    /// A budget of `bytes` (raised to `largest_frame` so that any one frame fits).
    pub(crate) fn new(bytes: usize, largest_frame: usize) -> RequestBudget {
        let units = bytes.max(largest_frame).div_ceil(UNIT_BYTES);
        RequestBudget {
            permits: Arc::new(Semaphore::new(units.min(Semaphore::MAX_PERMITS))),
        }
    }

    /// Budget units a frame of `bytes` needs.
    pub(crate) fn units(bytes: usize) -> usize {
        bytes.div_ceil(UNIT_BYTES)
    }

    /// Takes `units` now if the budget has them.
    pub(crate) fn try_take(&self, units: usize) -> Option<BudgetShare> {
        let units = u32::try_from(units).ok()?;
        Arc::clone(&self.permits)
            .try_acquire_many_owned(units)
            .ok()
            .map(|permit| BudgetShare { permit })
    }

    /// Waits for `units` (first come, first served).
    pub(crate) async fn take(self, units: usize) -> BudgetShare {
        let units = u32::try_from(units).unwrap_or(u32::MAX);
        match self.permits.acquire_many_owned(units).await {
            Ok(permit) => BudgetShare { permit },
            // The semaphore is never closed.
            Err(_) => std::future::pending().await,
        }
    }

    /// Bytes available now.
    pub(crate) fn available_bytes(&self) -> usize {
        self.permits.available_permits() * UNIT_BYTES
    }
}

/// The buffer of one large frame: exactly its length, zero-filled, filled by reads.
#[derive(Debug)]
pub(crate) struct FrameBuf {
    memory: Memory,
    filled: usize,
}

#[derive(Debug)]
enum Memory {
    Heap(Vec<u8>),
    Mapped { ptr: NonNull<u8>, len: usize },
}

// SAFETY: a `Mapped` buffer is a private anonymous mapping owned by this value alone (no other
// pointer to it exists), so moving it to another thread is as safe as moving a `Vec`.
unsafe impl Send for Memory {}
// SAFETY: shared access only reads through `&self` (`filled_bytes`), as for a `Vec`.
unsafe impl Sync for Memory {}

impl FrameBuf {
    /// A buffer of `len` bytes; `None` if the kernel refused the mapping.
    pub(crate) fn new(len: usize) -> Option<FrameBuf> {
        let memory = if len < MAPPED_FRAME_BYTES {
            Memory::Heap(vec![0u8; len])
        } else {
            // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                return None;
            }
            Memory::Mapped {
                ptr: NonNull::new(ptr.cast())?,
                len,
            }
        };
        Some(FrameBuf { memory, filled: 0 })
    }

    fn all_mut(&mut self) -> &mut [u8] {
        match &mut self.memory {
            Memory::Heap(bytes) => bytes,
            // SAFETY: the mapping is `len` readable and writable bytes, owned by `self` and
            // borrowed mutably here.
            Memory::Mapped { ptr, len } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), *len)
            },
        }
    }

    fn all(&self) -> &[u8] {
        match &self.memory {
            Memory::Heap(bytes) => bytes,
            // SAFETY: as in `all_mut`, borrowed shared here.
            Memory::Mapped { ptr, len } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *len)
            },
        }
    }

    /// Appends `bytes` (at most what is still missing).
    pub(crate) fn extend(&mut self, bytes: &[u8]) {
        let start = self.filled;
        let take = bytes.len().min(self.missing());
        self.all_mut()[start..start + take].copy_from_slice(&bytes[..take]);
        self.filled += take;
    }

    /// The part still to be read.
    pub(crate) fn spare_mut(&mut self) -> &mut [u8] {
        let start = self.filled;
        &mut self.all_mut()[start..]
    }

    /// Records that `n` more bytes were read into `spare_mut`.
    pub(crate) fn advance(&mut self, n: usize) {
        self.filled = (self.filled + n).min(self.all().len());
    }

    pub(crate) fn missing(&self) -> usize {
        self.all().len() - self.filled
    }

    /// The whole frame, once `missing() == 0`.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.all()[..self.filled]
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Memory::Mapped { ptr, len } = self {
            // SAFETY: `ptr`/`len` are the mapping made in `FrameBuf::new`, unmapped only here;
            // no borrow of it outlives `self`.
            unsafe {
                libc::munmap(ptr.as_ptr().cast(), *len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn frame_buffers_fill_exactly_to_their_length() {
        for len in [100, MAPPED_FRAME_BYTES + 3] {
            let mut buf = FrameBuf::new(len).unwrap();
            buf.extend(&[7u8; 10]);
            assert_eq!(buf.missing(), len - 10);
            let spare = buf.spare_mut();
            assert_eq!(spare.len(), len - 10);
            spare.fill(9);
            buf.advance(len);
            assert_eq!(buf.missing(), 0);
            assert_eq!(buf.bytes().len(), len);
            assert_eq!(buf.bytes()[9], 7);
            assert_eq!(buf.bytes()[len - 1], 9);
            // Extending a full buffer adds nothing.
            buf.extend(&[1, 2, 3]);
            assert_eq!(buf.bytes().len(), len);
        }
    }

    #[test]
    fn the_budget_is_shared_and_returned_on_drop() {
        let units = RequestBudget::units;
        let budget = RequestBudget::new(4 << 20, 1 << 20);
        let mut a = budget.try_take(units(3 << 20)).unwrap();
        assert!(budget.try_take(units(2 << 20)).is_none());
        let b = budget.try_take(units(1 << 20)).unwrap();
        assert_eq!(budget.available_bytes(), 0);
        // A share handed over and trimmed gives back exactly the excess.
        a.merge(b);
        assert_eq!(a.units(), units(4 << 20));
        a.trim_to(units(3 << 20));
        assert_eq!(budget.available_bytes(), 1 << 20);
        drop(a);
        assert_eq!(budget.available_bytes(), 4 << 20);
        // Never smaller than one frame.
        assert_eq!(RequestBudget::new(0, 1 << 20).available_bytes(), 1 << 20);
    }
}
