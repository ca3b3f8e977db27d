//! Landing read results in Python-visible memory: new `bytes` objects (written in place for
//! large values), caller buffers given by address (one or many per key; numpy arrays and
//! registered buffers come in this way), and byte ranges gathered from objects into buffers.
//!
//! Every function here runs a read on the store's runtime; the callers in `store.rs` check the
//! arguments' shapes and release the GIL around them (`read_to_bytes` retakes it once, to create
//! the large `bytes` objects).

use std::collections::HashMap;

use mooncake_client::{Access, RangeRead};
use mooncake_common::ErrorCode;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::buffer::{check_ranges, key_verdict, raw_slice_mut};
use crate::codes::{to_i64, INVALID};
use crate::store::Connected;

/// A new, uninitialized Python `bytes` object of `len` bytes and its contents, or `None` when
/// CPython cannot allocate it (the MemoryError is cleared: the key just fails).
///
/// # Safety
/// The slice aliases the object's storage: it must not be used once the object is dropped or
/// after the object is handed to any other Python code (then bytes are immutable).
unsafe fn new_bytes<'a>(py: Python<'_>, len: u64) -> Option<(Py<PyBytes>, &'a mut [u8])> {
    let size = isize::try_from(len).ok()?;
    // SAFETY: the GIL is held (`py`); a null source asks CPython for uninitialized contents.
    let raw = unsafe { ffi::PyBytes_FromStringAndSize(std::ptr::null(), size) };
    if raw.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    // SAFETY: `raw` is a new (owned) reference to a bytes object.
    let object: Py<PyBytes> = unsafe { Py::from_owned_ptr(py, raw) };
    if size == 0 {
        // CPython may answer with its shared empty singleton: hand out no memory at all.
        return Some((object, &mut []));
    }
    // SAFETY: `raw` is a bytes object, so this returns its `size`-byte storage (never null).
    let data = unsafe { ffi::PyBytes_AsString(raw) } as *mut u8;
    if data.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    // SAFETY: the object was created just above with refcount 1 and is visible to no other
    // Python code until our caller returns it, so writing its `size` bytes is exclusive; the
    // caller keeps `object` alive for as long as the slice is used (function contract).
    Some((object, unsafe {
        std::slice::from_raw_parts_mut(data, size as usize)
    }))
}

/// Values at least this large are read straight into their `bytes` object (the GIL is taken
/// once, mid-call, to create them). Smaller ones land in one scratch buffer and are copied into
/// `bytes` at the end: for them the copy costs less than retaking the GIL, which can also wait
/// up to the interpreter's switch interval when other threads are busy.
const DIRECT_BYTES_MIN: u64 = 64 << 10;

/// Where one key of [`read_to_bytes`] lands.
enum Landing {
    Failed,
    /// Read straight into this new object of this many bytes.
    Direct(Py<PyBytes>, u64),
    /// Read into `scratch[range]`.
    Scratch(std::ops::Range<usize>),
}

/// Hands out one destination per key: scratch space for small values, new `bytes` objects for
/// large ones when `py` is given (the GIL is held), nothing for failed lookups.
fn land<'b>(
    sizes: &[Option<u64>],
    py: Option<Python<'_>>,
    scratch: &'b mut [u8],
    landings: &mut Vec<Landing>,
) -> Vec<Option<&'b mut [u8]>> {
    let mut rest = scratch;
    let mut offset = 0usize;
    let mut destinations = Vec::with_capacity(sizes.len());
    for size in sizes {
        let (landing, destination) = match *size {
            Some(len) if len < DIRECT_BYTES_MIN => {
                let len = len as usize;
                let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
                rest = tail;
                offset += len;
                (Landing::Scratch(offset - len..offset), Some(head))
            }
            // SAFETY: the object stays in `landings` until the read is over and is handed to
            // Python only after that (`read_to_bytes`).
            Some(len) => match py.and_then(|py| unsafe { new_bytes(py, len) }) {
                Some((object, memory)) => (Landing::Direct(object, len), Some(memory)),
                None => (Landing::Failed, None),
            },
            None => (Landing::Failed, None),
        };
        landings.push(landing);
        destinations.push(destination);
    }
    destinations
}

/// Reads `keys` into new Python `bytes` objects: one master round trip, then one transfer batch.
/// Values of [`DIRECT_BYTES_MIN`] or more are written straight into their `bytes` object (no
/// intermediate buffer, no copy; the GIL is taken once for the whole batch to create them);
/// smaller ones go through one scratch buffer. The GIL is released for the round trip and the
/// transfer. `None` for a key that failed (missing, or any error).
pub(crate) fn read_to_bytes<'py>(
    py: Python<'py>,
    conn: &Connected,
    keys: &[&str],
) -> Vec<Option<Bound<'py, PyBytes>>> {
    if keys.is_empty() {
        return Vec::new();
    }
    let mut landings: Vec<Landing> = Vec::with_capacity(keys.len());
    let mut scratch: Vec<u8> = Vec::new();
    let results = {
        let landings = &mut landings;
        let scratch = &mut scratch;
        py.allow_threads(|| {
            conn.block_on(conn.client.get_batch_with(keys, move |sizes| {
                let small_bytes: u64 = sizes
                    .iter()
                    .flatten()
                    .filter(|&&len| len < DIRECT_BYTES_MIN)
                    .sum();
                *scratch = vec![0u8; small_bytes as usize];
                if sizes.iter().flatten().any(|&len| len >= DIRECT_BYTES_MIN) {
                    Python::with_gil(move |py| land(sizes, Some(py), scratch, landings))
                } else {
                    land(sizes, None, scratch, landings)
                }
            }))
        })
    };
    // The GIL is held again: failed keys' objects are released right here.
    let mut landings = landings.into_iter();
    results
        .into_iter()
        .map(|result| match (result, landings.next()?) {
            // Every byte of the object was written.
            (Ok(n), Landing::Direct(object, len)) if n == len => Some(object.into_bound(py)),
            (Ok(n), Landing::Scratch(range)) if n == range.len() as u64 => {
                Some(PyBytes::new(py, scratch.get(range)?))
            }
            _ => None,
        })
        .collect()
}

/// Where `batch_get_into_multi_buffers` puts one key's object.
enum MultiDestination<'a> {
    /// The buffers are adjacent: the transfer writes into them directly.
    Direct(&'a mut [u8]),
    /// Scattered buffers (in order) of `capacity` bytes in all: read privately, then copied.
    Scatter {
        buffers: Vec<&'a mut [u8]>,
        capacity: usize,
    },
}

/// Checks one key's buffers of `batch_get_into_multi_buffers`.
///
/// # Safety
/// Upstream's contract: each `(ptrs[j], sizes[j])` is writable caller memory during the call.
unsafe fn multi_destination<'a>(
    ptrs: &[usize],
    sizes: &[usize],
) -> Result<MultiDestination<'a>, i32> {
    if ptrs.len() != sizes.len() || ptrs.is_empty() {
        return Err(INVALID);
    }
    let capacity = sizes
        .iter()
        .try_fold(0usize, |a, &s| a.checked_add(s))
        .ok_or(INVALID)?;
    let contiguous = ptrs
        .windows(2)
        .zip(sizes)
        .all(|(w, &s)| w[0].checked_add(s) == Some(w[1]));
    if contiguous {
        // SAFETY: forwarded contract; adjacent buffers together form one writable range.
        return Ok(MultiDestination::Direct(unsafe {
            raw_slice_mut(ptrs[0], capacity)
        }?));
    }
    let buffers = ptrs
        .iter()
        .zip(sizes)
        // SAFETY: forwarded contract.
        .map(|(&p, &s)| unsafe { raw_slice_mut(p, s) })
        .collect::<Result<Vec<_>, i32>>()?;
    Ok(MultiDestination::Scatter { buffers, capacity })
}

/// `batch_get_into` once its arguments' shapes are checked (GIL released): reads each key's
/// object into `[buffer_ptrs[i], buffer_ptrs[i] + sizes[i])`, all in one master round trip and
/// one transfer batch. One result per key: bytes read or a negative code.
pub(crate) fn read_into_buffers(
    conn: &Connected,
    keys: &[String],
    buffer_ptrs: &[usize],
    sizes: &[usize],
) -> Vec<i64> {
    let mut out = vec![0i64; keys.len()];
    let mut refs = Vec::with_capacity(keys.len());
    let mut buffers = Vec::with_capacity(keys.len());
    let mut slots = Vec::with_capacity(keys.len());
    let ranges: Vec<(usize, usize)> = buffer_ptrs
        .iter()
        .copied()
        .zip(sizes.iter().copied())
        .collect();
    let checked = check_ranges(&conn.client, &ranges, Access::Write);
    for (i, key) in keys.iter().enumerate() {
        // SAFETY: upstream's contract: the caller's ranges are writable during the call;
        // `checked` says each is mapped (or inside a registered buffer).
        match checked[i].and_then(|()| unsafe { raw_slice_mut(ranges[i].0, ranges[i].1) }) {
            Ok(buffer) => {
                refs.push(key.as_str());
                buffers.push(buffer);
                slots.push(i);
            }
            Err(code) => out[i] = code as i64,
        }
    }
    if !refs.is_empty() {
        let results = conn.block_on(conn.client.get_batch_into(&refs, &mut buffers));
        for (slot, result) in slots.into_iter().zip(results) {
            out[slot] = to_i64(result);
        }
    }
    out
}

/// `batch_get_into_multi_buffers` once its arguments' shapes are checked (GIL released): reads
/// each key's object into its buffers `all_buffer_ptrs[i][j]` in order. One result per key: the
/// object's length, or a negative code.
pub(crate) fn read_into_multi_buffers(
    conn: &Connected,
    keys: &[String],
    all_buffer_ptrs: &[Vec<usize>],
    all_sizes: &[Vec<usize>],
) -> Vec<i64> {
    let mut out = vec![0i64; keys.len()];
    let mut refs = Vec::with_capacity(keys.len());
    let mut destinations = Vec::with_capacity(keys.len());
    let mut slots = Vec::with_capacity(keys.len());
    // Every buffer is checked first (one read of the process's mappings for the whole call).
    let flat: Vec<(usize, usize)> = all_buffer_ptrs
        .iter()
        .zip(all_sizes)
        .filter(|(p, s)| p.len() == s.len())
        .flat_map(|(p, s)| p.iter().copied().zip(s.iter().copied()))
        .collect();
    let mut checked = check_ranges(&conn.client, &flat, Access::Write).into_iter();
    for (i, key) in keys.iter().enumerate() {
        if all_buffer_ptrs[i].len() == all_sizes[i].len() {
            if let Err(code) = key_verdict(&mut checked, all_buffer_ptrs[i].len()) {
                out[i] = code as i64;
                continue;
            }
        }
        // SAFETY: upstream's contract: every buffer is writable during the call (each was
        // checked mapped above).
        match unsafe { multi_destination(&all_buffer_ptrs[i], &all_sizes[i]) } {
            Ok(destination) => {
                refs.push(key.as_str());
                destinations.push(destination);
                slots.push(i);
            }
            Err(code) => out[i] = code as i64,
        }
    }
    if refs.is_empty() {
        return out;
    }
    // Private buffers of the scattered keys, sized once the objects' sizes are known.
    let mut scratch: Vec<Vec<u8>> = Vec::new();
    let results = {
        let scratch = &mut scratch;
        let destinations = &mut destinations;
        conn.block_on(conn.client.get_batch_with(&refs, move |object_sizes| {
            *scratch = destinations
                .iter()
                .zip(object_sizes)
                .map(|(destination, size)| match (destination, size) {
                    (MultiDestination::Scatter { capacity, .. }, Some(size))
                        if *size <= *capacity as u64 =>
                    {
                        vec![0u8; *size as usize]
                    }
                    _ => Vec::new(),
                })
                .collect();
            destinations
                .iter_mut()
                .zip(scratch.iter_mut())
                .zip(object_sizes)
                .map(|((destination, private), size)| match destination {
                    MultiDestination::Direct(buffer) => Some(&mut **buffer),
                    // An object larger than the buffers gets none: BufferTooSmall.
                    MultiDestination::Scatter { .. } => size
                        .filter(|&s| s as usize == private.len())
                        .map(|_| private.as_mut_slice()),
                })
                .collect()
        }))
    };
    for (j, (slot, result)) in slots.into_iter().zip(results).enumerate() {
        out[slot] = match (result, &mut destinations[j]) {
            (Ok(n), MultiDestination::Scatter { buffers, .. }) => {
                let read = usize::try_from(n)
                    .ok()
                    .and_then(|n| scratch.get(j).and_then(|p| p.get(..n)));
                let Some(mut rest) = read else {
                    out[slot] = ErrorCode::INTERNAL_ERROR.as_i32() as i64;
                    continue;
                };
                for buffer in buffers.iter_mut() {
                    let take = buffer.len().min(rest.len());
                    buffer[..take].copy_from_slice(&rest[..take]);
                    rest = &rest[take..];
                }
                to_i64(Ok(n))
            }
            (result, _) => to_i64(result),
        }
    }
    out
}

/// `get_into_ranges` once its top-level shape is checked (GIL released): every fragment
/// `(i, j, k)` reads `all_sizes[i][j][k]` bytes of object `all_keys[i][j]` from offset
/// `all_src_offsets[i][j][k]` straight into `buffer_ptrs[i] + all_dst_offsets[i][j][k]`: one
/// master round trip for the distinct keys, one transfer batch of ranged reads. Results have
/// the shape of the fragments: bytes read or a negative code. A key whose three lists disagree
/// in length gets -600 in every slot (as many as its longest list, at least one); a range past
/// the end of its object, a missing key or a bad destination fails only its own slot.
pub(crate) fn gather_ranges(
    conn: &Connected,
    buffer_ptrs: &[usize],
    all_keys: &[Vec<String>],
    all_dst_offsets: &[Vec<Vec<usize>>],
    all_src_offsets: &[Vec<Vec<usize>>],
    all_sizes: &[Vec<Vec<usize>>],
) -> Vec<Vec<Vec<i64>>> {
    // Result shape first: one slot per fragment, -600 for a key whose lists disagree.
    let mut out: Vec<Vec<Vec<i64>>> = Vec::with_capacity(buffer_ptrs.len());
    let mut key_index: HashMap<&str, usize> = HashMap::new();
    let mut distinct: Vec<&str> = Vec::new();
    // (i, j, k, key index, destination address, size, source offset)
    let mut wanted: Vec<(usize, usize, usize, usize, usize, usize, u64)> = Vec::new();
    for (i, keys) in all_keys.iter().enumerate() {
        let mut per_buffer = Vec::with_capacity(keys.len());
        for (j, key) in keys.iter().enumerate() {
            let dsts = all_dst_offsets[i].get(j);
            let srcs = all_src_offsets[i].get(j);
            let sizes = all_sizes[i].get(j);
            let lens = [dsts, srcs, sizes].map(|l| l.map_or(0, Vec::len));
            let (Some(dsts), Some(srcs), Some(sizes)) = (dsts, srcs, sizes) else {
                per_buffer.push(vec![
                    INVALID as i64;
                    lens.into_iter().max().unwrap_or(0).max(1)
                ]);
                continue;
            };
            if dsts.len() != srcs.len() || dsts.len() != sizes.len() {
                per_buffer.push(vec![
                    INVALID as i64;
                    lens.into_iter().max().unwrap_or(0).max(1)
                ]);
                continue;
            }
            let index = *key_index.entry(key.as_str()).or_insert_with(|| {
                distinct.push(key.as_str());
                distinct.len() - 1
            });
            let mut per_key = vec![0i64; sizes.len()];
            for k in 0..sizes.len() {
                match buffer_ptrs[i].checked_add(dsts[k]) {
                    Some(dst) => wanted.push((i, j, k, index, dst, sizes[k], srcs[k] as u64)),
                    None => per_key[k] = INVALID as i64,
                }
            }
            per_buffer.push(per_key);
        }
        out.push(per_buffer);
    }
    if wanted.is_empty() {
        return out;
    }
    let ranges: Vec<(usize, usize)> = wanted.iter().map(|w| (w.4, w.5)).collect();
    let checked = check_ranges(&conn.client, &ranges, Access::Write);
    let mut fragments = Vec::with_capacity(wanted.len());
    let mut placed = Vec::with_capacity(wanted.len());
    for (w, verdict) in wanted.iter().zip(checked) {
        let &(i, j, k, index, dst, size, src) = w;
        // SAFETY: upstream's contract: each destination range lies in caller memory that is
        // writable during the call; `verdict` says it is mapped (or inside a registered buffer).
        match verdict.and_then(|()| unsafe { raw_slice_mut(dst, size) }) {
            Ok(dst) => {
                fragments.push(RangeRead {
                    key: index,
                    offset: src,
                    dst,
                });
                placed.push((i, j, k));
            }
            Err(code) => out[i][j][k] = code as i64,
        }
    }
    if fragments.is_empty() {
        return out;
    }
    let results = conn.block_on(conn.client.get_ranges(&distinct, &mut fragments));
    for ((i, j, k), result) in placed.into_iter().zip(results) {
        out[i][j][k] = to_i64(result);
    }
    out
}
