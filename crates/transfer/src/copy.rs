//! Bulk copies for the local and shared-memory paths: copies that checksum the bytes they move
//! in the same pass, and copies that bypass the cache for the destination (non-temporal stores).
//!
//! A copy of more than the core's cache into memory nobody reads soon (a segment being written)
//! pays for reading every destination line before
//! overwriting it (the "read for ownership") and evicts useful lines on the way. Streaming
//! stores skip both. Used for writes into segments of at least
//! `TransferConfig::streaming_write_min_bytes`.
//!
//! A checksummed copy computes the CRC32C from the very registers it stores (VPCLMULQDQ
//! folding, where the CPU has AVX-512 and VPCLMULQDQ), so the checksum is of the bytes that
//! landed, at the cost of the copy alone; elsewhere it copies a step, then checksums it while
//! it is still in the cache.

use crate::crc::x_pow;

/// Copies `len` bytes from `src` to `dst` and returns the CRC32C of the bytes stored. With
/// `stream`, the stores bypass the cache (as `copy_streaming`).
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`: `src` readable and `dst` writable for `len` bytes, the two
/// ranges disjoint; nothing else writes `dst` meanwhile.
pub(crate) unsafe fn copy_crc32c(src: *const u8, dst: *mut u8, len: usize, stream: bool) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if len >= FUSED_MIN_BYTES && x86::has_fused_crc() {
            // SAFETY: the caller's contract; the CPU has what the fused copy needs (checked).
            return unsafe {
                if stream {
                    x86::copy_crc_fused::<true>(src, dst, len)
                } else {
                    x86::copy_crc_fused::<false>(src, dst, len)
                }
            };
        }
    }
    // SAFETY: the caller's contract.
    unsafe { copy_then_crc32c(src, dst, len, stream) }
}

/// Below this a fused copy's setup (four accumulators, the final folds) is not worth it.
const FUSED_MIN_BYTES: usize = 1024;

/// Bytes copied between two checksum updates of `copy_then_crc32c`: small enough that a step is
/// still in the core's L2 cache when it is checksummed, large enough to keep memcpy at full
/// speed.
const COPY_STEP_BYTES: usize = 256 << 10;

/// `copy_crc32c` without the fused path: copies a step, then checksums it (the destination, or
/// for a streaming copy the source, which the copy just read into the cache).
///
/// # Safety
/// As `copy_crc32c`.
unsafe fn copy_then_crc32c(src: *const u8, dst: *mut u8, len: usize, stream: bool) -> u32 {
    let summed = if stream { src } else { dst as *const u8 };
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    let mut done = 0;
    while done < len {
        let step = COPY_STEP_BYTES.min(len - done);
        // SAFETY: the caller's contract, `done + step <= len`; the checksummed range lies inside
        // the range just copied.
        unsafe {
            if stream {
                copy_streaming(src.add(done), dst.add(done), step);
            } else {
                std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), step);
            }
            digest.update(std::slice::from_raw_parts(summed.add(done), step));
        }
        done += step;
    }
    digest.finalize() as u32
}

/// The two multipliers that move a 128-bit block of a reflected message `bits` further along
/// (towards its end) modulo the CRC32C generator: for its first 64 bits (the high-degree half)
/// and its last 64. A reflected carry-less product carries an extra factor x, hence the `- 1`;
/// the 32-bit reflected remainder goes in the top half of the 64-bit operand.
const fn fold_constants(bits: u64) -> (u64, u64) {
    (
        (x_pow(bits + 64 - 1) as u64) << 32,
        (x_pow(bits - 1) as u64) << 32,
    )
}

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
    use super::fold_constants;
    use std::arch::x86_64::*;

    /// Whether the CPU can run `copy_crc_fused`.
    pub(super) fn has_fused_crc() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
            && std::arch::is_x86_feature_detected!("pclmulqdq")
            && std::arch::is_x86_feature_detected!("sse4.2")
    }

    /// The CRC32C register after `raw` took in `len` bytes at `p` (no inversions).
    ///
    /// # Safety
    /// `p` readable for `len` bytes; the CPU has SSE4.2.
    #[target_feature(enable = "sse4.2")]
    unsafe fn crc_update(mut raw: u32, p: *const u8, len: usize) -> u32 {
        let mut i = 0;
        // SAFETY: every read is inside `[p, p + len)`.
        unsafe {
            while i + 8 <= len {
                raw = _mm_crc32_u64(u64::from(raw), p.add(i).cast::<u64>().read_unaligned()) as u32;
                i += 8;
            }
            while i < len {
                raw = _mm_crc32_u8(raw, *p.add(i));
                i += 1;
            }
        }
        raw
    }

    /// A 512-bit vector of four copies of `fold_constants(bits)`.
    macro_rules! k512 {
        ($bits:expr) => {{
            let (lo, hi) = const { fold_constants($bits) };
            _mm512_set_epi64(
                hi as i64, lo as i64, hi as i64, lo as i64, hi as i64, lo as i64, hi as i64,
                lo as i64,
            )
        }};
    }

    /// Moves each 128-bit lane of `$x` by the multipliers in `$k` and adds (xors) `$y`.
    macro_rules! fold512 {
        ($x:expr, $k:expr, $y:expr) => {
            _mm512_ternarylogic_epi64(
                _mm512_clmulepi64_epi128($x, $k, 0x00),
                _mm512_clmulepi64_epi128($x, $k, 0x11),
                $y,
                0x96,
            )
        };
    }

    /// `fold512` for one 128-bit lane, moved `$bits` further.
    macro_rules! fold128 {
        ($v:expr, $bits:expr, $y:expr) => {{
            let (lo, hi) = const { fold_constants($bits) };
            let k = _mm_set_epi64x(hi as i64, lo as i64);
            _mm_xor_si128(
                _mm_xor_si128(
                    _mm_clmulepi64_si128($v, k, 0x00),
                    _mm_clmulepi64_si128($v, k, 0x11),
                ),
                $y,
            )
        }};
    }

    /// Copies `len` bytes (at least 512) and returns the CRC32C of the bytes stored, computed
    /// from the registers that store them: four 512-bit accumulators fold each 256-byte block
    /// into the next (the message modulo the generator is unchanged by a fold), then fold into
    /// one 128-bit block whose CRC (with the crc32 instruction) is the message's. With `STREAM`
    /// the stores bypass the cache: a head up to `dst`'s 64-byte boundary is copied plainly.
    ///
    /// # Safety
    /// As `copy_crc32c`, `len >= 512`, and `has_fused_crc()`.
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
    pub(super) unsafe fn copy_crc_fused<const STREAM: bool>(
        src: *const u8,
        dst: *mut u8,
        len: usize,
    ) -> u32 {
        // The head (streaming only) and the tail are copied plainly and checksummed from where
        // they are in the cache: the destination, or for a streaming copy the source.
        let lead = if STREAM { head(dst, len, 64) } else { 0 };
        // SAFETY (whole function): every access is inside `[0, len)` of both ranges, which the
        // caller guarantees; streaming stores go to 64-byte aligned `dst + lead + 64 * i`.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, lead);
            let summed = if STREAM { src } else { dst as *const u8 };
            let raw = crc_update(!0, summed, lead);
            let (src, dst) = (src.add(lead), dst.add(lead));
            let body = len - lead;
            macro_rules! load {
                ($at:expr) => {
                    _mm512_loadu_si512(src.add($at).cast())
                };
            }
            macro_rules! store {
                ($at:expr, $v:expr) => {
                    if STREAM {
                        _mm512_stream_si512(dst.add($at).cast(), $v)
                    } else {
                        _mm512_storeu_si512(dst.add($at).cast(), $v)
                    }
                };
            }
            let (mut x0, mut x1, mut x2, mut x3) = (load!(0), load!(64), load!(128), load!(192));
            store!(0, x0);
            store!(64, x1);
            store!(128, x2);
            store!(192, x3);
            // The register so far goes into the first 32 bits of the message.
            x0 = _mm512_xor_si512(x0, _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, i64::from(raw)));
            let k2048 = k512!(2048);
            let mut at = 256;
            while at + 256 <= body {
                let (y0, y1, y2, y3) =
                    (load!(at), load!(at + 64), load!(at + 128), load!(at + 192));
                store!(at, y0);
                store!(at + 64, y1);
                store!(at + 128, y2);
                store!(at + 192, y3);
                x0 = fold512!(x0, k2048, y0);
                x1 = fold512!(x1, k2048, y1);
                x2 = fold512!(x2, k2048, y2);
                x3 = fold512!(x3, k2048, y3);
                at += 256;
            }
            if STREAM {
                _mm_sfence();
            }
            // x0..x3 are 64, 128 and 192 bytes before x3; then lanes 0..2 of the result are 48,
            // 32 and 16 bytes before lane 3.
            let x = fold512!(
                x0,
                k512!(1536),
                fold512!(x1, k512!(1024), fold512!(x2, k512!(512), x3))
            );
            let folded = fold128!(
                _mm512_extracti32x4_epi32::<0>(x),
                384,
                fold128!(
                    _mm512_extracti32x4_epi32::<1>(x),
                    256,
                    fold128!(
                        _mm512_extracti32x4_epi32::<2>(x),
                        128,
                        _mm512_extracti32x4_epi32::<3>(x)
                    )
                )
            );
            let lo = _mm_cvtsi128_si64(folded) as u64;
            let hi = _mm_extract_epi64::<1>(folded) as u64;
            let raw = _mm_crc32_u64(_mm_crc32_u64(0, lo), hi) as u32;
            std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), body - at);
            let summed = if STREAM { src } else { dst as *const u8 };
            !crc_update(raw, summed.add(at), body - at)
        }
    }

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
        fn checksummed_copies_are_exact_and_give_the_crc_at_every_alignment_and_length() {
            let src: Vec<u8> = (0..300_000u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
                .collect();
            let mut cases: Vec<(usize, usize, usize)> =
                (0..=1300).map(|len| (len % 7, len % 64, len)).collect();
            cases.extend([
                (0, 0, 65_536),
                (1, 63, 65_536 + 13),
                (5, 17, 262_144),
                (3, 1, 299_000),
            ]);
            for (src_off, dst_off, len) in cases {
                let from = &src[src_off..src_off + len];
                let expected = crate::crc::crc32c(from);
                // The dispatching entry point, the fused path itself (whatever the dispatch
                // threshold) and the fallback.
                let mut ways: Vec<(&str, CopyCrc)> = vec![
                    ("dispatch", super::super::copy_crc32c),
                    ("step", super::super::copy_then_crc32c),
                ];
                if len >= 512 && has_fused_crc() {
                    ways.push(("fused", fused));
                }
                for (way, copy) in ways {
                    for stream in [false, true] {
                        let mut dst = vec![0xAAu8; len + 128];
                        // SAFETY: both ranges are inside their vectors and disjoint; the fused
                        // way only runs where the CPU has what it needs.
                        let crc = unsafe {
                            copy(from.as_ptr(), dst.as_mut_ptr().add(dst_off), len, stream)
                        };
                        let case = format!("{way} len {len} stream {stream}");
                        assert_eq!(crc, expected, "{case}");
                        assert_eq!(&dst[dst_off..dst_off + len], from, "{case}");
                        assert!(dst[..dst_off].iter().all(|&b| b == 0xAA), "before: {case}");
                        assert!(
                            dst[dst_off + len..].iter().all(|&b| b == 0xAA),
                            "past: {case}"
                        );
                    }
                }
            }
        }

        type CopyCrc = unsafe fn(*const u8, *mut u8, usize, bool) -> u32;

        /// `copy_crc_fused` with the streaming choice as an argument.
        ///
        /// # Safety
        /// As `copy_crc_fused`.
        unsafe fn fused(src: *const u8, dst: *mut u8, len: usize, stream: bool) -> u32 {
            // SAFETY: the caller's contract.
            unsafe {
                if stream {
                    copy_crc_fused::<true>(src, dst, len)
                } else {
                    copy_crc_fused::<false>(src, dst, len)
                }
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
