//! CRC32C (Castagnoli, as iSCSI, the SSD tier and the store client use it): the checksum of a
//! byte range, and the checksum of a concatenation from the checksums of its parts.
//!
//! `crc-fast` computes the checksums (VPCLMULQDQ folding where the CPU has it). Its
//! `checksum_combine` costs about 110 µs per call here (it squares a 32×32 GF(2) matrix per bit
//! of the length), which is more than checksumming 1 MiB; an entry copied in several chunks
//! combines once per chunk, so this module combines by multiplying polynomials modulo the
//! generator instead: at most 64 multiplications of 32 shift-and-xor steps each, well under a
//! microsecond.

/// The generator, bit-reflected (x^0 is the top bit, as the reflected CRC stores it).
const POLY: u32 = 0x82F6_3B78;

/// `a(x) * b(x) mod P(x)` for reflected polynomials.
const fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = 1u32 << 31; // x^0
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        // b *= x
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        bit >>= 1;
    }
    product
}

/// `X2K[k] = x^(2^k) mod P(x)`, for every power of two a byte count (times 8) can hold.
const X2K: [u32; 67] = {
    let mut table = [0u32; 67];
    table[0] = 1 << 30; // x^1
    let mut k = 1;
    while k < table.len() {
        table[k] = mul_mod(table[k - 1], table[k - 1]);
        k += 1;
    }
    table
};

/// `x^(n * 2^k) mod P(x)`.
const fn pow_scaled(n: u64, mut k: usize) -> u32 {
    let mut power = 1u32 << 31; // x^0
    let mut rest = n;
    while rest != 0 {
        if rest & 1 != 0 {
            power = mul_mod(X2K[k], power);
        }
        rest >>= 1;
        k += 1;
    }
    power
}

/// `x^(8 * bytes) mod P(x)`: what a CRC is multiplied by when `bytes` bytes follow it.
fn shift_for(bytes: u64) -> u32 {
    pow_scaled(bytes, 3) // 8 * bytes = bytes * 2^3
}

/// `x^n mod P(x)`, reflected (for the folding constants of `copy::copy_crc32c`).
pub(crate) const fn x_pow(n: u64) -> u32 {
    pow_scaled(n, 0)
}

/// CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// CRC32C of `a ++ b` from the CRC32C of `a`, the CRC32C of `b` and the length of `b`.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    // The initial and final inversions cancel out in the sum (as in zlib's crc32_combine).
    mul_mod(shift_for(len_b), crc_a) ^ crc_b
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pseudo-random bytes (a multiplicative hash of the position).
    fn bytes(len: usize, seed: u64) -> Vec<u8> {
        (0..len as u64)
            .map(|i| (i.wrapping_add(seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
            .collect()
    }

    #[test]
    fn crc32c_matches_the_reference_implementation() {
        for len in [0, 1, 7, 64, 4095, 65_536 + 3] {
            let data = bytes(len, len as u64 + 11);
            assert_eq!(crc32c(&data), ::crc32c::crc32c(&data), "len {len}");
        }
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn combine_equals_the_checksum_of_the_concatenation() {
        let data = bytes(300_000, 5);
        for split in [0, 1, 2, 3, 8, 255, 4096, 65_537, 150_000, 299_999, 300_000] {
            let (a, b) = data.split_at(split);
            assert_eq!(
                crc32c_combine(crc32c(a), crc32c(b), b.len() as u64),
                crc32c(&data),
                "split at {split}"
            );
        }
    }

    #[test]
    fn combine_agrees_with_crc_fast_for_huge_lengths() {
        // Lengths past what a test can allocate: compare with crc-fast's (slow, matrix) combine.
        for len_b in [1u64 << 32, (1 << 40) + 12_345, u64::MAX / 3, u64::MAX] {
            for (a, b) in [(0u32, 0u32), (0xDEAD_BEEF, 0x1234_5678), (u32::MAX, 7)] {
                let expected = crc_fast::checksum_combine(
                    crc_fast::CrcAlgorithm::Crc32Iscsi,
                    u64::from(a),
                    u64::from(b),
                    len_b,
                ) as u32;
                assert_eq!(crc32c_combine(a, b, len_b), expected, "len {len_b}");
            }
        }
    }
}
