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

    /// Maps `len_bytes` of the file at `path` from `offset` (a multiple of the page size),
    /// shared and writable: a file-backed segment (`mount_segment`). The file must already hold
    /// `offset + len_bytes` bytes.
    pub fn map_file(
        path: &std::path::Path,
        offset: u64,
        len_bytes: usize,
    ) -> Result<Mapping, TransferError> {
        if len_bytes == 0 {
            return Err(TransferError::InvalidParams(
                "cannot map a zero-length range".into(),
            ));
        }
        if offset.checked_rem(page_bytes() as u64) != Some(0) {
            return Err(TransferError::InvalidParams(format!(
                "offset {offset} is not a multiple of the page size ({})",
                page_bytes()
            )));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| TransferError::InvalidParams(format!("open {}: {e}", path.display())))?;
        let file_bytes = file
            .metadata()
            .map_err(|e| TransferError::Io(format!("stat {}: {e}", path.display())))?
            .len();
        match offset.checked_add(len_bytes as u64) {
            Some(end) if end <= file_bytes => {}
            _ => {
                return Err(TransferError::InvalidParams(format!(
                    "{} has {file_bytes} bytes: [{offset}, +{len_bytes}) is past its end",
                    path.display()
                )))
            }
        }
        let file_offset = libc::off_t::try_from(offset)
            .map_err(|_| TransferError::InvalidParams(format!("offset {offset} too large")))?;
        // SAFETY: a fresh mapping chosen by the kernel of a valid, open file descriptor; the
        // range lies inside the file (checked above) and overlaps nothing Rust owns.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                file_offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(last_os_error("mmap file"));
        }
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| last_os_error("mmap returned NULL"))?;
        Ok(Mapping {
            ptr,
            len_bytes,
            mapped_bytes: len_bytes,
            // The mapping keeps the pages; the descriptor closes with `file`.
            fd: None,
            huge_pages: false,
        })
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

/// What a caller's memory range must allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The range is read (the source of a put).
    Read,
    /// The range is written (the destination of a get).
    Write,
    /// Both (a registered buffer serves puts and gets).
    ReadWrite,
}

/// Longest `/proc/self/maps` read (a process with hundreds of thousands of mappings).
const MAX_MAPS_BYTES: u64 = 64 << 20;

/// The address ranges mapped in this process and their permissions, read once from
/// `/proc/self/maps`. Memory handed over as a raw address (Python's zero-copy calls) is checked
/// against it before anything touches it, so an address that is not mapped is refused with
/// INVALID_PARAMS instead of killing the process. A snapshot: a range unmapped after the check
/// is the caller's breach of contract, as with any raw pointer.
#[derive(Debug, Clone, Default)]
pub struct MappedRanges {
    /// `(start, end, readable, writable)`, sorted by start, as the kernel lists them.
    ranges: Vec<(usize, usize, bool, bool)>,
}

impl MappedRanges {
    /// Reads this process's mappings now.
    pub fn read() -> Result<MappedRanges, TransferError> {
        use std::io::Read;
        let file = std::fs::File::open("/proc/self/maps")
            .map_err(|e| TransferError::Io(format!("reading /proc/self/maps: {e}")))?;
        let mut text = String::new();
        file.take(MAX_MAPS_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| TransferError::Io(format!("reading /proc/self/maps: {e}")))?;
        Ok(Self::parse(&text))
    }

    /// Parses the text of a `maps` file; lines that do not parse are skipped (they then count as
    /// unmapped, which only refuses more).
    pub fn parse(text: &str) -> MappedRanges {
        let mut ranges: Vec<(usize, usize, bool, bool)> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_ascii_whitespace();
                let (start, end) = fields.next()?.split_once('-')?;
                let start = usize::from_str_radix(start, 16).ok()?;
                let end = usize::from_str_radix(end, 16).ok()?;
                let perms = fields.next()?.as_bytes();
                if end <= start || perms.len() < 2 {
                    return None;
                }
                Some((start, end, perms[0] == b'r', perms[1] == b'w'))
            })
            .collect();
        ranges.sort_unstable_by_key(|r| r.0);
        MappedRanges { ranges }
    }

    /// True when every byte of `[addr, addr+len)` lies in mappings that allow `access` (a range
    /// may span adjacent mappings). An empty range is always covered.
    pub fn covers(&self, addr: usize, len: usize, access: Access) -> bool {
        if len == 0 {
            return true;
        }
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        let allowed = |r: bool, w: bool| match access {
            Access::Read => r,
            Access::Write => w,
            Access::ReadWrite => r && w,
        };
        // The mapping holding `addr`, then each one that starts exactly where the last ended.
        let first = self.ranges.partition_point(|m| m.1 <= addr);
        let mut reached = addr;
        for &(start, stop, r, w) in &self.ranges[first..] {
            if start > reached || !allowed(r, w) {
                return false;
            }
            reached = stop;
            if reached >= end {
                return true;
            }
        }
        false
    }
}

/// Checks that `[addr, addr+len)` is mapped in this process with `access` (one read of
/// `/proc/self/maps`): INVALID_PARAMS naming the range otherwise.
pub fn check_mapped(addr: usize, len: usize, access: Access) -> Result<(), TransferError> {
    if MappedRanges::read()?.covers(addr, len, access) {
        Ok(())
    } else {
        Err(TransferError::InvalidParams(format!(
            "memory [{addr:#x}, +{len}) is not mapped {access:?} in this process"
        )))
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

    #[test]
    fn mapped_ranges_parse_and_cover_adjacent_mappings() {
        let maps = MappedRanges::parse(
            "1000-2000 rw-p 00000000 00:00 0\n\
             2000-3000 r--p 00000000 00:00 0 /lib/x.so\n\
             5000-6000 rw-s 00000000 00:05 7 /memfd:seg (deleted)\n\
             garbage line\n",
        );
        assert!(maps.covers(0x1000, 0x1000, Access::ReadWrite));
        assert!(
            maps.covers(0x1800, 0x1000, Access::Read),
            "spans two adjacent mappings"
        );
        assert!(
            !maps.covers(0x1800, 0x1000, Access::Write),
            "the second is read-only"
        );
        assert!(
            !maps.covers(0x2800, 0x1000, Access::Read),
            "runs into a hole"
        );
        assert!(
            !maps.covers(0x0fff, 2, Access::Read),
            "starts before any mapping"
        );
        assert!(maps.covers(0x5000, 0x1000, Access::Write));
        assert!(!maps.covers(0x5000, 0x1001, Access::Write));
        assert!(
            !maps.covers(usize::MAX - 1, 4, Access::Read),
            "wraps around"
        );
        assert!(
            maps.covers(0x9999_0000, 0, Access::Write),
            "an empty range touches nothing"
        );
    }

    #[test]
    fn this_process_memory_is_mapped_and_low_addresses_are_not() {
        let heap = vec![1u8; 100_000];
        check_mapped(heap.as_ptr() as usize, heap.len(), Access::ReadWrite).unwrap();
        let mapping = Mapping::allocate("mapped", 8192, false).unwrap();
        check_mapped(mapping.as_ptr() as usize, 8192, Access::ReadWrite).unwrap();
        // The first pages are never mapped (vm.mmap_min_addr).
        assert!(matches!(
            check_mapped(0x1000, 4096, Access::Read),
            Err(TransferError::InvalidParams(_))
        ));
        // A real allocation with a declared size far past its end.
        assert!(check_mapped(heap.as_ptr() as usize, 1 << 62, Access::Write).is_err());
        // Read-only code is readable, not writable.
        let code = check_mapped as *const () as usize;
        check_mapped(code, 1, Access::Read).unwrap();
        assert!(check_mapped(code, 1, Access::Write).is_err());
    }

    #[test]
    fn file_ranges_map_shared_and_bad_ranges_are_refused() {
        let dir = std::env::temp_dir().join(format!("mc-map-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("segment");
        let page = page_bytes();
        std::fs::write(&path, vec![7u8; 3 * page]).unwrap();
        let mapping = Mapping::map_file(&path, page as u64, page).unwrap();
        // SAFETY: inside the fresh mapping.
        unsafe {
            assert_eq!(*mapping.as_ptr(), 7);
            *mapping.as_ptr() = 9;
        }
        drop(mapping);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            (bytes[page - 1], bytes[page]),
            (7, 9),
            "writes reach the file"
        );
        for (offset, len) in [(1u64, page), (0, 4 * page), (3 * page as u64, 1), (0, 0)] {
            assert!(
                matches!(
                    Mapping::map_file(&path, offset, len),
                    Err(TransferError::InvalidParams(_))
                ),
                "offset {offset} len {len}"
            );
        }
        assert!(Mapping::map_file(&dir.join("missing"), 0, page).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
