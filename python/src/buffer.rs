//! Reading Python buffer-protocol objects (bytes, bytearray, memoryview, numpy arrays) without a
//! copy, caller memory given by address (upstream's zero-copy calls), and the memory behind
//! `get_buffer` handles.
//!
//! PyO3 offers the buffer protocol only outside the 3.9 limited API, so the two functions are
//! declared here. `PyObject_GetBuffer`/`PyBuffer_Release` and the `Py_buffer` layout are part of
//! the stable ABI since 3.11 and unchanged in every CPython 3.x before it, so one abi3 wheel works
//! on 3.9 and up.

use mooncake_client::{Access, StoreClient};
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use std::os::raw::{c_char, c_int, c_void};

use crate::codes::{code_of, INVALID};

/// CPython's `Py_buffer`.
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

extern "C" {
    #[link_name = "PyObject_GetBuffer"]
    fn py_object_get_buffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    #[link_name = "PyBuffer_Release"]
    fn py_buffer_release(view: *mut RawBuffer);
}

/// `PyBUF_SIMPLE`: a C-contiguous run of bytes.
const PYBUF_SIMPLE: c_int = 0;

/// A read-only view of a Python object's bytes; released (GIL held) on drop.
pub struct ByteView {
    raw: Box<RawBuffer>,
}

impl std::fmt::Debug for ByteView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ByteView({} bytes)", self.raw.len)
    }
}

impl ByteView {
    /// Borrows the bytes of `obj` (any C-contiguous buffer-protocol object).
    pub fn new(obj: &Bound<'_, PyAny>) -> PyResult<ByteView> {
        let mut raw = Box::new(RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: the GIL is held (we have a Bound); `raw` is a zeroed Py_buffer the call fills.
        let rc = unsafe { py_object_get_buffer(obj.as_ptr(), &mut *raw, PYBUF_SIMPLE) };
        if rc != 0 {
            let cause = PyErr::take(obj.py());
            let type_name = obj
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default();
            let error = PyTypeError::new_err(format!(
                "a bytes-like object (C-contiguous buffer) is required, not '{type_name}'"
            ));
            if let Some(cause) = cause {
                error.set_cause(obj.py(), Some(cause));
            }
            return Err(error);
        }
        Ok(ByteView { raw })
    }

    /// The bytes (valid while `self` lives; the exporter cannot resize them meanwhile).
    pub fn as_slice(&self) -> &[u8] {
        if self.raw.buf.is_null() || self.raw.len <= 0 {
            return &[];
        }
        // SAFETY: the exporter guarantees `len` readable bytes at `buf` until the view is
        // released, which happens only in `drop`.
        unsafe { std::slice::from_raw_parts(self.raw.buf as *const u8, self.raw.len as usize) }
    }
}

impl Drop for ByteView {
    fn drop(&mut self) {
        // Releasing needs the GIL; a ByteView is only created and dropped by code holding it
        // (`Python::with_gil` is a no-op re-entry then).
        Python::with_gil(|_| {
            // SAFETY: `raw` was filled by a successful PyObject_GetBuffer and is released once.
            unsafe { py_buffer_release(&mut *self.raw) }
        });
    }
}

// SAFETY: the view's pointers stay valid until release; only `as_slice` (a shared read) is used
// off the GIL, and release happens on the GIL-holding thread in `drop`.
unsafe impl Send for ByteView {}
// SAFETY: as above: shared access only reads the bytes.
unsafe impl Sync for ByteView {}

/// Memory owned by a `get_buffer` handle: the object's bytes, read once, never reallocated.
/// `mooncake_rs.store.BufferHandle` exposes it through the buffer protocol (as a ctypes array
/// over `ptr()`), keeping this object alive as long as the handle lives.
#[pyclass(module = "mooncake_rs._native", frozen)]
#[derive(Debug)]
pub struct NativeBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the allocation is owned exclusively by this object and freed only in `drop`.
unsafe impl Send for NativeBuffer {}
// SAFETY: Rust never touches the bytes after construction; Python writes go through ctypes.
unsafe impl Sync for NativeBuffer {}

impl NativeBuffer {
    pub fn from_vec(bytes: Vec<u8>) -> NativeBuffer {
        let boxed = bytes.into_boxed_slice();
        let len = boxed.len();
        let ptr = Box::into_raw(boxed) as *mut u8;
        NativeBuffer { ptr, len }
    }
}

impl Drop for NativeBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a boxed slice of exactly `len` bytes.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr, self.len,
            )))
        };
    }
}

#[pymethods]
impl NativeBuffer {
    /// Address of the first byte.
    fn ptr(&self) -> usize {
        self.ptr as usize
    }

    /// Length in bytes.
    fn size(&self) -> usize {
        self.len
    }

    fn __len__(&self) -> usize {
        self.len
    }
}

/// Caller memory `[ptr, ptr+size)` as a slice, or INVALID_PARAMS for a null pointer / bad size.
///
/// # Safety
/// The caller (Python code) promises the range is readable for the duration of the call, as
/// upstream's zero-copy API requires.
pub(crate) unsafe fn raw_slice<'a>(ptr: usize, size: usize) -> Result<&'a [u8], i32> {
    if size == 0 {
        return Ok(&[]);
    }
    if ptr == 0 || size > isize::MAX as usize || ptr.checked_add(size).is_none() {
        return Err(INVALID);
    }
    // SAFETY: forwarded to the caller's contract; non-null and in range checked above.
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const u8, size) })
}

/// # Safety
/// As [`raw_slice`], and writable.
pub(crate) unsafe fn raw_slice_mut<'a>(ptr: usize, size: usize) -> Result<&'a mut [u8], i32> {
    if size == 0 {
        return Ok(&mut []);
    }
    if ptr == 0 || size > isize::MAX as usize || ptr.checked_add(size).is_none() {
        return Err(INVALID);
    }
    // SAFETY: forwarded to the caller's contract; non-null and in range checked above.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, size) })
}

/// Checks caller memory given by address before anything touches it: null pointers, sizes
/// past `isize::MAX`, ranges that wrap, ranges that start in a registered buffer and run past
/// it, and ranges that are not mapped with `access` in this process (one read of
/// `/proc/self/maps` for the whole call) are INVALID_PARAMS. One result per `(ptr, size)`.
pub(crate) fn check_ranges(
    client: &StoreClient,
    ranges: &[(usize, usize)],
    access: Access,
) -> Vec<Result<(), i32>> {
    let mut out = vec![Ok(()); ranges.len()];
    let mut asked = Vec::with_capacity(ranges.len());
    let mut slots = Vec::with_capacity(ranges.len());
    for (i, &(ptr, size)) in ranges.iter().enumerate() {
        if size == 0 {
            continue;
        }
        if ptr == 0 || size > isize::MAX as usize || ptr.checked_add(size).is_none() {
            out[i] = Err(INVALID);
            continue;
        }
        asked.push((ptr, size, access));
        slots.push(i);
    }
    if !asked.is_empty() {
        for (slot, checked) in slots.into_iter().zip(client.check_caller_ranges(&asked)) {
            if let Err(error) = checked {
                out[slot] = Err(code_of(&error));
            }
        }
    }
    out
}

/// [`raw_slice`] of memory [`check_ranges`] accepted for reading.
///
/// # Safety
/// As [`raw_slice`]: the caller promises the range stays readable during the call (the check
/// proves it is mapped now).
pub(crate) unsafe fn checked_slice<'a>(
    client: &StoreClient,
    ptr: usize,
    size: usize,
) -> Result<&'a [u8], i32> {
    check_ranges(client, &[(ptr, size)], Access::Read)
        .pop()
        .unwrap_or(Err(INVALID))?;
    // SAFETY: forwarded to the caller's contract; the range was checked to be mapped.
    unsafe { raw_slice(ptr, size) }
}

/// [`raw_slice_mut`] of memory [`check_ranges`] accepted for writing.
///
/// # Safety
/// As [`raw_slice_mut`].
pub(crate) unsafe fn checked_slice_mut<'a>(
    client: &StoreClient,
    ptr: usize,
    size: usize,
) -> Result<&'a mut [u8], i32> {
    check_ranges(client, &[(ptr, size)], Access::Write)
        .pop()
        .unwrap_or(Err(INVALID))?;
    // SAFETY: forwarded to the caller's contract; the range was checked to be mapped.
    unsafe { raw_slice_mut(ptr, size) }
}

/// The verdict on one key's `n` buffers from the per-range results of [`check_ranges`]:
/// consumes exactly `n` of them (so the next key's start where they should) and returns the
/// first error.
pub(crate) fn key_verdict(
    checked: &mut impl Iterator<Item = Result<(), i32>>,
    n: usize,
) -> Result<(), i32> {
    let mut verdict = Ok(());
    for _ in 0..n {
        let one = checked.next().unwrap_or(Err(INVALID));
        if verdict.is_ok() {
            verdict = one;
        }
    }
    verdict
}
