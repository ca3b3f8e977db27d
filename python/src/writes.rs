//! The bodies of the put and upsert families: the binding's methods come in pairs that differ
//! only in [`WriteMode`] (put: write-once, an existing key is success; upsert: replace).

use futures_util::future::{join, join_all};
use mooncake_client::WriteMode;
use mooncake_common::ReplicateConfig as RsReplicateConfig;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::buffer::{check_ranges, checked_slice, key_verdict, raw_slice, ByteView};
use crate::codes::{put_code, INVALID, NOT_READY};
use crate::config::ReplicateConfig;
use crate::store::{Connected, Store};
use mooncake_client::Access;

fn config_of(config: Option<PyRef<'_, ReplicateConfig>>) -> RsReplicateConfig {
    config.map(|c| c.inner.clone()).unwrap_or_default()
}

/// One object from `parts`; 0 or a negative code.
fn write_one(
    conn: &Connected,
    mode: WriteMode,
    key: &str,
    parts: &[&[u8]],
    config: &RsReplicateConfig,
) -> i32 {
    put_code(&conn.block_on(conn.client.write_parts(mode, key, parts, config)))
}

/// Many objects; one code per item, in order.
fn write_many(
    conn: &Connected,
    mode: WriteMode,
    items: &[(&str, &[u8])],
    config: &RsReplicateConfig,
) -> Vec<i32> {
    conn.block_on(conn.client.write_batch(mode, items, config))
        .iter()
        .map(put_code)
        .collect()
}

impl Store {
    pub(crate) fn write_value(
        &self,
        py: Python<'_>,
        mode: WriteMode,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let view = ByteView::new(value)?;
        let Some(conn) = self.conn() else {
            return Ok(NOT_READY);
        };
        let config = config_of(config);
        let bytes = view.as_slice();
        Ok(py.allow_threads(|| write_one(&conn, mode, key, &[bytes], &config)))
    }

    pub(crate) fn write_parts(
        &self,
        py: Python<'_>,
        mode: WriteMode,
        key: &str,
        parts: &Bound<'_, PyTuple>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let views = parts
            .iter()
            .map(|p| ByteView::new(&p))
            .collect::<PyResult<Vec<_>>>()?;
        let Some(conn) = self.conn() else {
            return Ok(NOT_READY);
        };
        let config = config_of(config);
        let slices: Vec<&[u8]> = views.iter().map(|v| v.as_slice()).collect();
        Ok(py.allow_threads(|| write_one(&conn, mode, key, &slices, &config)))
    }

    /// 0 when every key succeeded (for put: or already existed), else the first negative code.
    pub(crate) fn write_batch(
        &self,
        py: Python<'_>,
        mode: WriteMode,
        keys: Vec<String>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> PyResult<i32> {
        let views = values
            .try_iter()?
            .map(|v| ByteView::new(&v?))
            .collect::<PyResult<Vec<_>>>()?;
        if views.len() != keys.len() {
            return Ok(INVALID);
        }
        let Some(conn) = self.conn() else {
            return Ok(NOT_READY);
        };
        if keys.is_empty() {
            return Ok(0);
        }
        let config = config_of(config);
        let items: Vec<(&str, &[u8])> = keys
            .iter()
            .zip(&views)
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        Ok(py.allow_threads(|| {
            write_many(&conn, mode, &items, &config)
                .into_iter()
                .find(|&c| c != 0)
                .unwrap_or(0)
        }))
    }

    pub(crate) fn write_from(
        &self,
        py: Python<'_>,
        mode: WriteMode,
        key: &str,
        buffer_ptr: usize,
        size: usize,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        let Some(conn) = self.conn() else {
            return NOT_READY;
        };
        let config = config_of(config);
        py.allow_threads(|| {
            // SAFETY: upstream's contract: the caller's range is readable during the call; it is
            // checked to be mapped (or inside a registered buffer) first.
            let bytes = match unsafe { checked_slice(&conn.client, buffer_ptr, size) } {
                Ok(b) => b,
                Err(code) => return code,
            };
            write_one(&conn, mode, key, &[bytes], &config)
        })
    }

    /// `put_from_with_metadata`: the object is the metadata bytes, then the data bytes.
    pub(crate) fn write_with_metadata(
        &self,
        py: Python<'_>,
        key: &str,
        metadata: (usize, usize),
        data: (usize, usize),
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> i32 {
        let Some(conn) = self.conn() else {
            return NOT_READY;
        };
        if data.1 == 0 {
            return 0;
        }
        let config = config_of(config);
        py.allow_threads(|| {
            let checked = check_ranges(&conn.client, &[metadata, data], Access::Read);
            let mut parts = Vec::with_capacity(2);
            for (&(ptr, size), verdict) in [metadata, data].iter().zip(checked) {
                // SAFETY: upstream's contract: both ranges are readable during the call;
                // `verdict` says each is mapped (or inside a registered buffer).
                match verdict.and_then(|()| unsafe { raw_slice(ptr, size) }) {
                    Ok(bytes) => parts.push(bytes),
                    Err(code) => return code,
                }
            }
            write_one(&conn, WriteMode::Put, key, &parts, &config)
        })
    }

    pub(crate) fn write_batch_from(
        &self,
        py: Python<'_>,
        mode: WriteMode,
        keys: Vec<String>,
        buffer_ptrs: Vec<usize>,
        sizes: Vec<usize>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        if keys.len() != buffer_ptrs.len() || keys.len() != sizes.len() {
            return vec![INVALID; keys.len()];
        }
        let Some(conn) = self.conn() else {
            return vec![NOT_READY; keys.len()];
        };
        let config = config_of(config);
        py.allow_threads(|| {
            let mut out = vec![0i32; keys.len()];
            let mut items = Vec::with_capacity(keys.len());
            let mut slots = Vec::with_capacity(keys.len());
            let ranges: Vec<(usize, usize)> = buffer_ptrs.iter().copied().zip(sizes).collect();
            let checked = check_ranges(&conn.client, &ranges, Access::Read);
            for (i, key) in keys.iter().enumerate() {
                // SAFETY: upstream's contract: the caller's ranges are readable during the call;
                // `checked` says each is mapped (or inside a registered buffer).
                match checked[i].and_then(|()| unsafe { raw_slice(ranges[i].0, ranges[i].1) }) {
                    Ok(bytes) => {
                        items.push((key.as_str(), bytes));
                        slots.push(i);
                    }
                    Err(code) => out[i] = code,
                }
            }
            if !items.is_empty() {
                for (slot, code) in slots
                    .into_iter()
                    .zip(write_many(&conn, mode, &items, &config))
                {
                    out[slot] = code;
                }
            }
            out
        })
    }

    /// `batch_put_from_multi_buffers`: for each key, the concatenation of its buffers. One
    /// code per key, in order.
    pub(crate) fn put_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<usize>>,
        all_sizes: Vec<Vec<usize>>,
        config: Option<PyRef<'_, ReplicateConfig>>,
    ) -> Vec<i32> {
        if keys.len() != all_buffer_ptrs.len() || keys.len() != all_sizes.len() {
            return vec![INVALID; keys.len()];
        }
        let Some(conn) = self.conn() else {
            return vec![NOT_READY; keys.len()];
        };
        let config = config_of(config);
        py.allow_threads(|| put_multi_buffers(&conn, &keys, &all_buffer_ptrs, &all_sizes, &config))
    }
}

/// Puts each key's buffers `all_buffer_ptrs[i][j]` of sizes `all_sizes[i][j]`, concatenated.
fn put_multi_buffers(
    conn: &Connected,
    keys: &[String],
    all_buffer_ptrs: &[Vec<usize>],
    all_sizes: &[Vec<usize>],
    config: &RsReplicateConfig,
) -> Vec<i32> {
    let mut out = vec![0i32; keys.len()];
    // Every buffer is checked first (one read of the process's mappings for the whole call).
    let flat: Vec<(usize, usize)> = all_buffer_ptrs
        .iter()
        .zip(all_sizes)
        .filter(|(p, s)| p.len() == s.len())
        .flat_map(|(p, s)| p.iter().copied().zip(s.iter().copied()))
        .collect();
    let mut checked = check_ranges(&conn.client, &flat, Access::Read).into_iter();
    // Keys whose buffers are adjacent are one slice each and go in one put_batch; the
    // others (scattered buffers) are put one by one, concurrently with the batch.
    let mut whole: Vec<(&str, &[u8])> = Vec::new();
    let mut whole_slots = Vec::new();
    let mut scattered: Vec<(&str, Vec<&[u8]>)> = Vec::new();
    let mut scattered_slots = Vec::new();
    for (i, (ptrs, sizes)) in all_buffer_ptrs.iter().zip(all_sizes).enumerate() {
        if ptrs.len() != sizes.len() {
            out[i] = INVALID;
            continue;
        }
        if let Err(code) = key_verdict(&mut checked, ptrs.len()) {
            out[i] = code;
            continue;
        }
        let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        let adjacent = !ptrs.is_empty()
            && ptrs
                .windows(2)
                .zip(sizes)
                .all(|(w, &s)| w[0].checked_add(s) == Some(w[1]));
        let checked = match total {
            None => Err(INVALID),
            // SAFETY: upstream's contract: the caller's ranges are readable during the
            // call (each checked mapped above); adjacent ones together form one range.
            Some(total) if adjacent => unsafe { raw_slice(ptrs[0], total) }.map(|b| {
                whole.push((keys[i].as_str(), b));
                whole_slots.push(i);
            }),
            Some(_) => ptrs
                .iter()
                .zip(sizes)
                // SAFETY: as above.
                .map(|(&p, &s)| unsafe { raw_slice(p, s) })
                .collect::<Result<Vec<_>, i32>>()
                .map(|parts| {
                    scattered.push((keys[i].as_str(), parts));
                    scattered_slots.push(i);
                }),
        };
        if let Err(code) = checked {
            out[i] = code;
        }
    }
    let client = &conn.client;
    let (batched, one_by_one) = conn.block_on(join(
        async {
            if whole.is_empty() {
                Vec::new()
            } else {
                client.put_batch(&whole, config).await
            }
        },
        join_all(
            scattered
                .iter()
                .map(|(key, parts)| client.put_parts(key, parts, config)),
        ),
    ));
    for (slot, result) in whole_slots.into_iter().zip(&batched) {
        out[slot] = put_code(result);
    }
    for (slot, result) in scattered_slots.into_iter().zip(&one_by_one) {
        out[slot] = put_code(result);
    }
    out
}
