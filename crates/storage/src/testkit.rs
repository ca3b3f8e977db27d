//! Deterministic test values shared by the conformance suite, the crash child and the benchmark.
//! Not part of the storage API.

/// A 64-bit seed for `(key, version)` (FNV-1a over the key, mixed with the version).
pub fn seed_for(key: &str, version: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    splitmix(h ^ splitmix(version))
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Fills `buf` with the pattern of `seed` (xorshift64*, 8 bytes per step).
pub fn fill_pattern(seed: u64, buf: &mut [u8]) {
    let mut x = seed | 1;
    let mut chunks = buf.chunks_exact_mut(8);
    for chunk in &mut chunks {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        chunk.copy_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let last = x.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes();
    let n = rest.len();
    rest.copy_from_slice(&last[..n]);
}

/// The value of `(key, version)` with `len` bytes.
pub fn value_for(key: &str, version: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_pattern(seed_for(key, version), &mut v);
    v
}

/// A small deterministic PRNG for tests and the crash child (xorshift64*).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(splitmix(seed) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Drops the page cache of every regular file under `dir` (fdatasync, then
/// `posix_fadvise(DONTNEED)`), so that the next reads come from the device. For benchmarks.
pub fn drop_page_cache(dir: &std::path::Path) -> std::io::Result<()> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let f = std::fs::File::open(e.path())?;
                f.sync_data()?;
                rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)
                    .map_err(std::io::Error::from)?;
            }
        }
    }
    Ok(())
}

/// Allocates `len` bytes of `file` on disk (`posix_fallocate`-style, no sparse holes), as `fio`
/// lays out its files before measuring. For benchmarks.
pub fn preallocate(file: &std::fs::File, len: u64) -> std::io::Result<()> {
    rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len)
        .map_err(std::io::Error::from)
}
