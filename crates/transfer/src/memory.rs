//! Page-aligned shared mappings backed by a `memfd`, so that a segment can be handed to a
//! same-host peer (the fd travels over a Unix socket) and mapped there too.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::error::TransferError;

const HUGE_PAGE_BYTES: usize = 2 << 20;

/// One `mmap(MAP_SHARED)` of a memfd. Unmapped on drop; the pages live on while any other
/// process keeps its own mapping of the same memfd.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len_bytes: usize,
    mapped_bytes: usize,
    fd: Option<OwnedFd>,
    huge_pages: bool,
}

// SAFETY: the mapping is plain shared memory owned by this value; every access goes through raw
// pointers whose ranges the registry checks, and the mapping is only unmapped in `drop`.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` hands out only raw pointers and metadata.
unsafe impl Sync for Mapping {}

fn page_bytes() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page > 0 {
        page as usize
    } else {
        4096
    }
}

fn last_os_error(what: &str) -> TransferError {
    TransferError::Alloc(format!("{what}: {}", std::io::Error::last_os_error()))
}

impl Mapping {
    /// Allocates `len_bytes` (rounded up to whole pages) of zeroed shared memory in a new memfd.
    /// With `huge_pages`, tries 2 MiB pages first and falls back to normal pages if the system
    /// has none reserved; [`Mapping::huge_pages`] tells which one was used.
    pub fn allocate(
        name: &str,
        len_bytes: usize,
        huge_pages: bool,
    ) -> Result<Mapping, TransferError> {
        if len_bytes == 0 {
            return Err(TransferError::InvalidParams(
                "cannot allocate a zero-length region".into(),
            ));
        }
        if huge_pages {
            if let Ok(mapping) = Self::allocate_with(name, len_bytes, true) {
                return Ok(mapping);
            }
        }
        Self::allocate_with(name, len_bytes, false)
    }

    fn allocate_with(name: &str, len_bytes: usize, huge: bool) -> Result<Mapping, TransferError> {
        let unit = if huge { HUGE_PAGE_BYTES } else { page_bytes() };
        let mapped_bytes = len_bytes
            .checked_add(unit - 1)
            .map(|n| n / unit * unit)
            .ok_or_else(|| TransferError::InvalidParams(format!("size {len_bytes} too large")))?;
        let c_name = CString::new(name.replace('\0', "_"))
            .map_err(|e| TransferError::InvalidParams(e.to_string()))?;
        let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
        if huge {
            flags |= libc::MFD_HUGETLB;
        }
        // SAFETY: c_name is a valid NUL-terminated string for the duration of the call.
        let raw_fd = unsafe { libc::memfd_create(c_name.as_ptr(), flags) };
        if raw_fd < 0 {
            return Err(last_os_error("memfd_create"));
        }
        // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw_fd) };
        let size = libc::off_t::try_from(mapped_bytes)
            .map_err(|_| TransferError::InvalidParams(format!("size {len_bytes} too large")))?;
        // SAFETY: fd is a valid memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(last_os_error("ftruncate"));
        }
        // Fix the size for good: a peer that receives this fd cannot shrink it under another
        // peer's mapping (which would SIGBUS that peer) — peers refuse unsealed fds.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fd is a valid memfd created with MFD_ALLOW_SEALING.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(last_os_error("seal memfd"));
        }
        let mut mapping = Self::map(fd, mapped_bytes, huge)?;
        mapping.len_bytes = len_bytes;
        Ok(mapping)
    }

    /// Maps `len_bytes` of an existing memfd received from a peer (shared-memory transport).
    pub fn map_received(fd: OwnedFd, len_bytes: usize) -> Result<Mapping, TransferError> {
        if len_bytes == 0 {
            return Err(TransferError::InvalidParams("zero-length segment".into()));
        }
        // Only a size-sealed memfd is safe to map: otherwise anyone holding the fd could shrink
        // it and our next access past the new end would SIGBUS this process.
        // SAFETY: F_GET_SEALS on a valid fd has no memory-safety preconditions.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(TransferError::InvalidParams(
                "received fd is not a memfd sealed against shrinking".into(),
            ));
        }
        // The fd's own size bounds what we may touch: mapping past its end would SIGBUS.
        // SAFETY: stat is plain output memory; fd is valid.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is valid and stat points to writable memory of the right type.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
            return Err(last_os_error("fstat"));
        }
        let file_bytes = usize::try_from(stat.st_size).unwrap_or(0);
        if file_bytes < len_bytes {
            return Err(TransferError::InvalidParams(format!(
                "received memfd has {file_bytes} bytes, peer announced {len_bytes}"
            )));
        }
        // Map the whole file: hugetlbfs files need a length that is a multiple of their page.
        let mut mapping = Self::map(fd, file_bytes, false)?;
        mapping.len_bytes = len_bytes;
        mapping.fd = None; // the mapping keeps the pages alive; no need to hold the fd
        Ok(mapping)
    }

    fn map(fd: OwnedFd, mapped_bytes: usize, huge: bool) -> Result<Mapping, TransferError> {
        let mut flags = libc::MAP_SHARED;
        if huge {
            flags |= libc::MAP_HUGETLB;
        }
        // SAFETY: a fresh mapping chosen by the kernel (addr = NULL) of a valid fd; it overlaps
        // nothing Rust owns.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(last_os_error("mmap"));
        }
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| last_os_error("mmap returned NULL"))?;
        Ok(Mapping {
            ptr,
            len_bytes: mapped_bytes,
            mapped_bytes,
            fd: Some(fd),
            huge_pages: huge,
        })
    }

    /// Backs every page of the mapping with memory now (`MADV_POPULATE_WRITE`), so the first
    /// write to a segment page does not take a page fault (and zero-fill) in the middle of a
    /// transfer, and a host that cannot back the segment says so here, not with a SIGBUS later.
    /// Kernels before 5.14 lack the call: the pages are then touched one by one.
    pub fn populate(&self) -> Result<(), TransferError> {
        // SAFETY: the range is exactly this live mapping.
        let rc = unsafe {
            libc::madvise(
                self.ptr.as_ptr().cast(),
                self.mapped_bytes,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EINVAL) {
            return Err(TransferError::Io(format!(
                "backing {} bytes of segment memory: {error}",
                self.mapped_bytes
            )));
        }
        let page = page_bytes();
        let mut offset = 0;
        while offset < self.mapped_bytes {
            // SAFETY: inside the mapping; a volatile read-then-write of the same byte faults the
            // page in for writing without changing it (nobody else sees the mapping yet).
            unsafe {
                let byte = self.ptr.as_ptr().add(offset);
                byte.write_volatile(byte.read_volatile());
            }
            offset += page;
        }
        Ok(())
    }

    /// First byte of the mapping (page aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Usable length (what was asked for).
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// True when the mapping is backed by huge pages.
    pub fn huge_pages(&self) -> bool {
        self.huge_pages
    }

    /// The memfd, while this process owns it (allocated here, not received).
    pub fn fd(&self) -> Option<&OwnedFd> {
        self.fd.as_ref()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/mapped_bytes are exactly what mmap returned; nobody can use the mapping
        // after drop because every user holds an Arc to it.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.mapped_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn allocation_is_page_aligned_zeroed_and_writable() {
        let mapping = Mapping::allocate("test", 10_000, false).unwrap();
        assert_eq!(mapping.as_ptr() as usize % page_bytes(), 0);
        assert_eq!(mapping.len_bytes(), 10_000);
        // SAFETY: the range is inside the fresh mapping.
        let slice = unsafe { std::slice::from_raw_parts_mut(mapping.as_ptr(), 10_000) };
        assert!(slice.iter().all(|&b| b == 0));
        slice[9_999] = 7;
        assert_eq!(slice[9_999], 7);
    }

    /// Pages of `mapping` the kernel has resident, from `mincore`.
    fn resident_pages(mapping: &Mapping) -> usize {
        let pages = mapping.mapped_bytes.div_ceil(page_bytes());
        let mut vec = vec![0u8; pages];
        // SAFETY: the range is the live mapping; `vec` has one byte per page.
        let rc = unsafe {
            libc::mincore(
                mapping.as_ptr().cast(),
                mapping.mapped_bytes,
                vec.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn populate_backs_every_page_and_keeps_the_zeroes() {
        let mapping = Mapping::allocate("populate", 8 << 20, false).unwrap();
        let pages = (8 << 20) / page_bytes();
        assert!(
            resident_pages(&mapping) < pages,
            "fresh memfd pages start absent"
        );
        mapping.populate().unwrap();
        assert_eq!(resident_pages(&mapping), pages);
        // SAFETY: the range is inside the mapping.
        let slice = unsafe { std::slice::from_raw_parts(mapping.as_ptr(), 8 << 20) };
        assert!(slice.iter().all(|&b| b == 0));
    }

    #[test]
    fn huge_page_request_falls_back_when_none_are_reserved() {
        let mapping = Mapping::allocate("huge", 3 << 20, true).unwrap();
        assert_eq!(mapping.len_bytes(), 3 << 20);
        // SAFETY: inside the mapping.
        unsafe { *mapping.as_ptr().add((3 << 20) - 1) = 1 };
    }

    #[test]
    fn segments_are_size_sealed_and_unsealed_fds_are_refused() {
        let mapping = Mapping::allocate("sealed", 8192, false).unwrap();
        let fd = mapping.fd().unwrap();
        // SAFETY: valid fd.
        let shrunk = unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) };
        assert_ne!(shrunk, 0, "a sealed memfd must refuse to shrink");
        let dup = fd.try_clone().unwrap();
        assert!(Mapping::map_received(dup, 8192).is_ok());

        // A plain memfd without seals is refused by the receiving side.
        // SAFETY: a literal C string; the fd is wrapped at once.
        let raw = unsafe { libc::memfd_create(c"plain".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: fresh fd owned by nobody else.
        let plain = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: valid fd.
        assert_eq!(unsafe { libc::ftruncate(plain.as_raw_fd(), 8192) }, 0);
        assert!(matches!(
            Mapping::map_received(plain, 8192),
            Err(TransferError::InvalidParams(_))
        ));
    }

    #[test]
    fn zero_length_is_rejected() {
        assert!(matches!(
            Mapping::allocate("zero", 0, false),
            Err(TransferError::InvalidParams(_))
        ));
    }
}
