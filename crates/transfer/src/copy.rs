//! Bulk copies that bypass the cache for the destination (non-temporal stores).
//!
//! A copy of more than the core's cache into memory nobody reads soon (a segment being written)
//! pays for reading every destination line before
//! overwriting it (the "read for ownership") and evicts useful lines on the way. Streaming
//! stores skip both. Used by the local and shared-memory paths for writes into segments of at
//! least `TransferConfig::streaming_write_min_bytes`.

/// Copies `len` bytes from `src` to `dst` with streaming stores where the CPU has AVX-512 or AVX2,
/// else with `memcpy`. The stores are fenced before returning, so the bytes are visible to other
/// cores (and processes mapping the same memory) like after a plain copy.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` readable and `dst` writable for `len` bytes, the two
/// ranges disjoint.
pub(crate) unsafe fn copy_streaming(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the caller's contract; the CPU has AVX-512F (checked above).
            unsafe { x86::copy_avx512(src, dst, len) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the caller's contract; the CPU has AVX2 (checked above).
            unsafe { x86::copy_avx2(src, dst, len) };
            return;
        }
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Bytes to copy with `memcpy` before `dst` reaches an `align`-byte boundary.
    fn head(dst: *mut u8, len: usize, align: usize) -> usize {
        dst.align_offset(align).min(len)
    }

    /// # Safety
    /// As `copy_streaming`, and the CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn copy_avx512(src: *const u8, dst: *mut u8, len: usize) {
        let lead = head(dst, len, 64);
        // SAFETY (whole function): every access below is inside `[0, len)` of both ranges, which
        // the caller guarantees; stores go to 64-byte aligned `dst + done` (after `lead`).
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, lead);
            let mut done = lead;
            while done + 256 <= len {
                let a = _mm512_loadu_si512(src.add(done).cast());
                let b = _mm512_loadu_si512(src.add(done + 64).cast());
                let c = _mm512_loadu_si512(src.add(done + 128).cast());
                let d = _mm512_loadu_si512(src.add(done + 192).cast());
                _mm512_stream_si512(dst.add(done).cast(), a);
                _mm512_stream_si512(dst.add(done + 64).cast(), b);
                _mm512_stream_si512(dst.add(done + 128).cast(), c);
                _mm512_stream_si512(dst.add(done + 192).cast(), d);
                done += 256;
            }
            while done + 64 <= len {
                let a = _mm512_loadu_si512(src.add(done).cast());
                _mm512_stream_si512(dst.add(done).cast(), a);
                done += 64;
            }
            std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done);
            _mm_sfence();
        }
    }

    /// # Safety
    /// As `copy_streaming`, and the CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy_avx2(src: *const u8, dst: *mut u8, len: usize) {
        let lead = head(dst, len, 32);
        // SAFETY: as in `copy_avx512`, with 32-byte aligned stores.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, lead);
            let mut done = lead;
            while done + 128 <= len {
                let a = _mm256_loadu_si256(src.add(done).cast());
                let b = _mm256_loadu_si256(src.add(done + 32).cast());
                let c = _mm256_loadu_si256(src.add(done + 64).cast());
                let d = _mm256_loadu_si256(src.add(done + 96).cast());
                _mm256_stream_si256(dst.add(done).cast(), a);
                _mm256_stream_si256(dst.add(done + 32).cast(), b);
                _mm256_stream_si256(dst.add(done + 64).cast(), c);
                _mm256_stream_si256(dst.add(done + 96).cast(), d);
                done += 128;
            }
            while done + 32 <= len {
                let a = _mm256_loadu_si256(src.add(done).cast());
                _mm256_stream_si256(dst.add(done).cast(), a);
                done += 32;
            }
            std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done);
            _mm_sfence();
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn check(copy: unsafe fn(*const u8, *mut u8, usize)) {
            let src: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
            for (src_off, dst_off, len) in [
                (0, 0, 0),
                (0, 0, 1),
                (1, 3, 63),
                (5, 0, 64),
                (0, 17, 65),
                (3, 1, 255),
                (7, 9, 256),
                (11, 13, 4097),
                (1, 2, 65_536),
                (0, 63, 69_000),
            ] {
                let mut dst = vec![0xAAu8; 70_100];
                // SAFETY: both ranges are inside their vectors and disjoint.
                unsafe {
                    copy(
                        src.as_ptr().add(src_off),
                        dst.as_mut_ptr().add(dst_off),
                        len,
                    )
                };
                assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len]);
                assert!(
                    dst[..dst_off].iter().all(|&b| b == 0xAA),
                    "wrote before the range"
                );
                assert!(
                    dst[dst_off + len..].iter().all(|&b| b == 0xAA),
                    "wrote past the range"
                );
            }
        }

        #[test]
        fn streaming_copies_are_exact_at_every_alignment() {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                check(|s, d, l| unsafe { copy_avx512(s, d, l) });
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                check(|s, d, l| unsafe { copy_avx2(s, d, l) });
            }
            // SAFETY: the dispatching entry point, whatever the CPU.
            check(|s, d, l| unsafe { super::super::copy_streaming(s, d, l) });
        }
    }
}
