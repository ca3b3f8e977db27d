//! Upstream's session calls for layer-wise KV (SGLang's direct linker, vLLM-Ascend): get
//! sessions (`batch_get_session_start`, `batch_get_into_multi_buffer_ranges`,
//! `batch_get_session_end`) and put sessions (`batch_put_session_start`,
//! `batch_put_from_multi_buffer_ranges`, `batch_put_session_end`, `batch_put_session_revoke`),
//! over `StoreClient`'s sessions (crates/client/src/store/sessions.rs).
//!
//! Ranged calls are key-major: key `i`'s fragment `j` moves `all_sizes[i][j]` bytes between
//! `all_buffer_ptrs[i][j]` and object offset `all_*_offsets[i][j]`. One result per key: the
//! bytes moved (the sum of its sizes) or its first negative code. A key whose three lists
//! disagree in length gets -600; other keys go on.

use mooncake_client::{Access, RangeRead, RangeWrite, StoreError};
use pyo3::prelude::*;

use crate::buffer::{check_ranges, raw_slice, raw_slice_mut};
use crate::codes::{code_of, unit_code, INVALID, NOT_READY};
use crate::config::ReplicateConfig;
use crate::store::Store;

/// One code per key from per-key unit results.
fn unit_codes(results: Vec<Result<(), StoreError>>) -> Vec<i32> {
    results.iter().map(unit_code).collect()
}

/// The fragments of a key-major ranged call: `(key, ptr, size, offset)` for every key whose
/// lists agree; the others are marked -600 in `out`.
fn fragments_of(
    all_buffer_ptrs: &[Vec<usize>],
    all_sizes: &[Vec<usize>],
    all_offsets: &[Vec<usize>],
    out: &mut [i64],
) -> Vec<(usize, usize, usize, u64)> {
    let mut fragments = Vec::new();
    for (i, slot) in out.iter_mut().enumerate() {
        let (ptrs, sizes, offsets) = (&all_buffer_ptrs[i], &all_sizes[i], &all_offsets[i]);
        if ptrs.len() != sizes.len() || ptrs.len() != offsets.len() {
            *slot = INVALID as i64;
            continue;
        }
        for j in 0..ptrs.len() {
            fragments.push((i, ptrs[j], sizes[j], offsets[j] as u64));
        }
    }
    fragments
}

/// Folds per-fragment results into per-key results: the sum of a key's bytes, or its first
/// negative code (keys already marked keep their code).
fn per_key(out: &mut [i64], fragments: &[(usize, usize, usize, u64)], results: &[i64]) {
    for (&(key, ..), &result) in fragments.iter().zip(results) {
        if out[key] < 0 {
            continue;
        }
        if result < 0 {
            out[key] = result;
        } else {
            out[key] += result;
        }
    }
}

impl Store {
    /// `batch_get_session_start`: 0 per key, or its code (-704 missing).
    pub(crate) fn get_session_start_impl(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        let Some(conn) = self.conn() else {
            return vec![NOT_READY; keys.len()];
        };
        if keys.is_empty() {
            return Vec::new();
        }
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        py.allow_threads(|| {
            conn.block_on(conn.client.batch_get_session_start(&refs))
                .iter()
                .map(|r| match r {
                    Ok(_) => 0,
                    Err(error) => code_of(error),
                })
                .collect()
        })
    }

    /// `batch_get_session_end`: 0 (no master call), -1010 when not set up.
    pub(crate) fn get_session_end_impl(&self, keys: Vec<String>) -> i32 {
        let Some(conn) = self.conn() else {
            return NOT_READY;
        };
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        conn.client.batch_get_session_end(&refs);
        0
    }

    /// `batch_get_into_multi_buffer_ranges`.
    pub(crate) fn get_ranges_impl(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        all_src_offsets: Vec<Vec<usize>>,
    ) -> Vec<i64> {
        let n = keys.len();
        if all_buffer_ptrs.len() != n || all_sizes.len() != n || all_src_offsets.len() != n {
            return vec![INVALID as i64; n];
        }
        let Some(conn) = self.conn() else {
            return vec![NOT_READY as i64; n];
        };
        py.allow_threads(|| {
            let mut out = vec![0i64; n];
            let fragments = fragments_of(&all_buffer_ptrs, &all_sizes, &all_src_offsets, &mut out);
            let ranges: Vec<(usize, usize)> = fragments.iter().map(|f| (f.1, f.2)).collect();
            let checked = check_ranges(&conn.client, &ranges, Access::Write);
            let mut results = vec![0i64; fragments.len()];
            let mut reads = Vec::new();
            let mut slots = Vec::new();
            for (f, (&(key, ptr, size, offset), verdict)) in
                fragments.iter().zip(checked).enumerate()
            {
                // SAFETY: upstream's contract: the buffers are writable during the call;
                // `verdict` says each is mapped (or inside a registered buffer).
                match verdict.and_then(|()| unsafe { raw_slice_mut(ptr, size) }) {
                    Ok(dst) => {
                        reads.push(RangeRead { key, offset, dst });
                        slots.push(f);
                    }
                    Err(code) => results[f] = code as i64,
                }
            }
            if !reads.is_empty() {
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let done = conn.block_on(conn.client.get_ranges_in_session(&refs, &mut reads));
                for (f, result) in slots.into_iter().zip(done) {
                    results[f] = crate::codes::to_i64(result);
                }
            }
            per_key(&mut out, &fragments, &results);
            out
        })
    }

    /// `batch_put_session_start`: 0 per key, or its code (-705 when the key exists, -703 when
    /// another client is writing it; -600 when a session of the key is already open here).
    pub(crate) fn put_session_start_impl(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        sizes: Vec<u64>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        if keys.len() != sizes.len() {
            return vec![INVALID; keys.len()];
        }
        let Some(conn) = self.conn() else {
            return vec![NOT_READY; keys.len()];
        };
        if keys.is_empty() {
            return Vec::new();
        }
        let config = config.map(|c| c.inner.clone()).unwrap_or_default();
        let items: Vec<(&str, u64)> = keys.iter().map(String::as_str).zip(sizes).collect();
        py.allow_threads(|| {
            unit_codes(conn.block_on(conn.client.batch_put_session_start(&items, &config)))
        })
    }

    /// `batch_put_from_multi_buffer_ranges`.
    pub(crate) fn put_ranges_impl(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        all_dst_offsets: Vec<Vec<usize>>,
    ) -> Vec<i64> {
        let n = keys.len();
        if all_buffer_ptrs.len() != n || all_sizes.len() != n || all_dst_offsets.len() != n {
            return vec![INVALID as i64; n];
        }
        let Some(conn) = self.conn() else {
            return vec![NOT_READY as i64; n];
        };
        py.allow_threads(|| {
            let mut out = vec![0i64; n];
            let fragments = fragments_of(&all_buffer_ptrs, &all_sizes, &all_dst_offsets, &mut out);
            let ranges: Vec<(usize, usize)> = fragments.iter().map(|f| (f.1, f.2)).collect();
            let checked = check_ranges(&conn.client, &ranges, Access::Read);
            let mut results = vec![0i64; fragments.len()];
            let mut writes = Vec::new();
            let mut slots = Vec::new();
            for (f, (&(key, ptr, size, offset), verdict)) in
                fragments.iter().zip(checked).enumerate()
            {
                // SAFETY: upstream's contract: the buffers are readable during the call;
                // `verdict` says each is mapped (or inside a registered buffer).
                match verdict.and_then(|()| unsafe { raw_slice(ptr, size) }) {
                    Ok(src) => {
                        writes.push(RangeWrite { key, offset, src });
                        slots.push(f);
                    }
                    Err(code) => results[f] = code as i64,
                }
            }
            if !writes.is_empty() {
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let done = conn.block_on(conn.client.put_ranges_in_session(&refs, &writes));
                for (f, result) in slots.into_iter().zip(done) {
                    results[f] = crate::codes::to_i64(result);
                }
            }
            per_key(&mut out, &fragments, &results);
            out
        })
    }

    /// `batch_put_session_end` (`end = true`) / `batch_put_session_revoke`: 0 per key, or its
    /// code.
    pub(crate) fn put_session_finish_impl(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        end: bool,
    ) -> Vec<i32> {
        let Some(conn) = self.conn() else {
            return vec![NOT_READY; keys.len()];
        };
        if keys.is_empty() {
            return Vec::new();
        }
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        py.allow_threads(|| {
            let results = if end {
                conn.block_on(conn.client.batch_put_session_end(&refs))
            } else {
                conn.block_on(conn.client.batch_put_session_revoke(&refs))
            };
            unit_codes(results)
        })
    }
}
