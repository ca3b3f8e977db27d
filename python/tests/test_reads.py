"""The read paths in detail: exact bytes, per-key results in order, a failing key inside a batch
that otherwise succeeds, and the smallest (and refused empty) values. get/get_batch read straight
into new bytes objects and the batch calls use one master round trip; these pin the results."""

import ctypes

import numpy as np

OBJECT_NOT_FOUND = -704
INVALID_PARAMS = -600


def cbuf(n, fill=None):
    buf = (ctypes.c_ubyte * n)()
    if fill is not None:
        ctypes.memmove(buf, fill, len(fill))
    return buf, ctypes.addressof(buf)


def pattern(n, seed):
    """n distinct-looking bytes (no constant runs that would hide an offset error)."""
    return bytes((i * 31 + seed * 7 + (i >> 8)) & 0xFF for i in range(n))


def test_get_exact_bytes_small_large_missing_and_fresh_objects(store, key):
    small = pattern(1, 1)
    odd = pattern(70_001, 2)  # above the old 64 KiB copy threshold, odd length
    large = pattern(3 * (1 << 20) + 7, 3)
    for suffix, value in (("/1", small), ("/odd", odd), ("/large", large)):
        assert store.put(key + suffix, value) == 0
    assert store.get(key + "/1") == small
    got = store.get(key + "/odd")
    assert type(got) is bytes and len(got) == len(odd) and got == odd
    assert store.get(key + "/large") == large
    assert store.get(key + "/missing") == b""
    # Two reads give two independent objects with the same contents.
    a, b = store.get(key + "/odd"), store.get(key + "/odd")
    assert a == b == odd and a is not b
    # Empty values are refused at put (as upstream), so such a key reads as missing: b"".
    assert store.put(key + "/empty", b"") == INVALID_PARAMS
    assert store.get(key + "/empty") == b""


def test_get_batch_exact_bytes_missing_in_order_and_duplicates(store, key):
    values = [pattern(1, 4), pattern(4096, 5), pattern(70_001, 6), pattern((1 << 20) + 3, 7)]
    keys = ["%s/%d" % (key, i) for i in range(len(values))]
    assert store.put_batch(keys, values) == 0
    asked = [keys[0], key + "/missing-a", keys[1], keys[2], key + "/empty", keys[3],
             key + "/missing-b", keys[1]]
    assert store.put(key + "/empty", b"") == INVALID_PARAMS
    got = store.get_batch(asked)
    assert len(got) == len(asked)
    assert all(type(g) is bytes for g in got)
    assert got == [values[0], b"", values[1], values[2], b"", values[3], b"", values[1]]
    assert got[2] is not got[7]  # a key asked twice gets two objects
    assert store.get_batch([key + "/missing"]) == [b""]
    assert store.get_batch([]) == []


def test_batch_get_into_exact_bytes_and_per_key_results(store, key):
    n = 5000
    values = [pattern(n, 8), pattern(n - 1, 9), pattern(1, 10), pattern(n, 11)]
    keys = ["%s/%d" % (key, i) for i in range(len(values))]
    assert store.put_batch(keys, values) == 0
    dst, dp = cbuf(8 * n)
    stride = n + 13  # unaligned, non-adjacent destinations
    ptrs = [dp + i * stride for i in range(6)]
    asked = [keys[0], key + "/missing", keys[1], keys[2], keys[3], key + "/missing-2"]
    sizes = [n, n, n, n, n - 1, n]  # keys[3] (n bytes) gets a buffer one byte short
    before = bytes(dst)
    res = store.batch_get_into(asked, ptrs, sizes)
    assert res == [n, OBJECT_NOT_FOUND, n - 1, 1, INVALID_PARAMS, OBJECT_NOT_FOUND]
    out = bytes(dst)
    assert out[ptrs[0] - dp:ptrs[0] - dp + n] == values[0]
    assert out[ptrs[2] - dp:ptrs[2] - dp + n - 1] == values[1]
    assert out[ptrs[3] - dp:ptrs[3] - dp + 1] == values[2]
    # The too-small buffer and the missing keys' buffers are left as they were.
    for i in (1, 4, 5):
        lo = ptrs[i] - dp
        assert out[lo:lo + sizes[i]] == before[lo:lo + sizes[i]], i
    # A null pointer fails its key only; a zero-size buffer fails an existing key as too small.
    res = store.batch_get_into([keys[0], keys[1], keys[2], key + "/missing"],
                               [0, dp, dp + 2 * n, 0], [n, n, 0, 0])
    assert res == [INVALID_PARAMS, n - 1, INVALID_PARAMS, OBJECT_NOT_FOUND]
    assert bytes(dst)[:n - 1] == values[1]
    # Mismatched lengths: every key INVALID_PARAMS.
    assert store.batch_get_into(keys, [dp] * 3, [n] * 4) == [INVALID_PARAMS] * 4
    assert store.batch_get_into(keys[:2], [dp] * 2, [n]) == [INVALID_PARAMS] * 2
    assert store.batch_get_into([], [], []) == []


def test_batch_get_into_registered_and_numpy(store, key):
    """32 keys into one registered numpy array (the benchmark's shape), in reverse order."""
    count, n = 32, 4096
    src = np.frombuffer(pattern(count * n, 12), dtype=np.uint8).copy()
    keys = ["%s/%d" % (key, i) for i in range(count)]
    assert store.batch_put_from(keys, [src.ctypes.data + i * n for i in range(count)],
                                [n] * count) == [0] * count
    dst = np.zeros(count * n, dtype=np.uint8)
    assert store.register_buffer(dst.ctypes.data, dst.nbytes) == 0
    try:
        ptrs = [dst.ctypes.data + (count - 1 - i) * n for i in range(count)]
        assert store.batch_get_into(keys, ptrs, [n] * count) == [n] * count
        for i in range(count):
            j = count - 1 - i
            assert np.array_equal(dst[j * n:(j + 1) * n], src[i * n:(i + 1) * n]), i
    finally:
        assert store.unregister_buffer(dst.ctypes.data) == 0


def test_get_buffer_exact_bytes_missing_and_empty(store, key):
    value = pattern(70_001, 13)
    assert store.put(key, value) == 0
    assert store.put(key + "/1", b"z") == 0
    h = store.get_buffer(key)
    assert bytes(h) == value and h.size() == len(value)
    assert bytes(store.get_buffer(key + "/1")) == b"z"
    assert store.get_buffer(key + "/missing") is None
    assert store.put(key + "/empty", b"") == INVALID_PARAMS
    assert store.get_buffer(key + "/empty") is None
    hs = store.batch_get_buffer([key + "/missing", key, key + "/1", key + "/empty"])
    assert hs[0] is None and hs[3] is None
    assert bytes(hs[1]) == value and bytes(hs[2]) == b"z"


def test_multi_buffers_mixed_batch(store, key):
    """One call mixing adjacent buffers, scattered buffers, a too-small key, a missing key and a
    malformed entry: each key gets its own result and the others' bytes are exact."""
    v_adj = pattern(3000, 14)
    v_sc = pattern(2500, 15)
    v_big = pattern(4000, 16)
    assert store.put_batch([key + "/adj", key + "/sc", key + "/big"], [v_adj, v_sc, v_big]) == 0
    whole, wp = cbuf(3000)
    adj = ([wp, wp + 1000, wp + 2500], [1000, 1500, 500])
    pieces = [cbuf(1200), cbuf(1300), cbuf(77)]  # capacity 2577 >= 2500, last one partly used
    before_last = bytes(pieces[2][0])
    sc = ([p for _, p in pieces], [1200, 1300, 77])
    small = [cbuf(1000), cbuf(1000)]  # 2000 < 4000
    sm = ([p for _, p in small], [1000, 1000])
    res = store.batch_get_into_multi_buffers(
        [key + "/adj", key + "/sc", key + "/big", key + "/missing", key + "/adj"],
        [adj[0], sc[0], sm[0], [wp], [wp, wp]],
        [adj[1], sc[1], sm[1], [3000], [3000]])  # last: 2 pointers, 1 size
    assert res == [3000, 2500, INVALID_PARAMS, OBJECT_NOT_FOUND, INVALID_PARAMS]
    assert bytes(whole) == v_adj
    got = bytes(pieces[0][0]) + bytes(pieces[1][0]) + bytes(pieces[2][0])[:0]
    assert got == v_sc
    assert bytes(pieces[2][0]) == before_last  # nothing left for the third buffer
    assert all(bytes(b) == bytes(1000) for b, _ in small)  # too small: untouched
    # Scattered buffers whose last piece is partly filled; one byte over their capacity fails.
    assert store.put_batch([key + "/2550", key + "/2578"], [pattern(2550, 17), pattern(2578, 1)]) == 0
    res = store.batch_get_into_multi_buffers([key + "/2578", key + "/2550"], [sc[0]] * 2,
                                             [sc[1]] * 2)
    assert res == [INVALID_PARAMS, 2550]
    got = bytes(pieces[0][0]) + bytes(pieces[1][0]) + bytes(pieces[2][0])[:50]
    assert got == pattern(2550, 17)
    assert bytes(pieces[2][0])[50:] == before_last[50:]
    assert store.batch_get_into_multi_buffers([], [], []) == []


def test_put_multi_buffers_mixed_batch(store, key):
    """Adjacent (one batch) and scattered (one by one) keys in one call, plus a malformed entry
    and an existing key; every stored value is the exact concatenation."""
    src, sp = cbuf(6000, pattern(6000, 18))
    a = pattern(6000, 18)
    far = [cbuf(100, pattern(100, 19)), cbuf(200, pattern(200, 20))]
    assert store.put(key + "/exists", b"old") == 0
    res = store.batch_put_from_multi_buffers(
        [key + "/adj", key + "/sc", key + "/bad", key + "/exists", key + "/one"],
        [[sp, sp + 1000], [far[0][1], far[1][1]], [sp, sp], [sp], [sp + 5000]],
        [[1000, 2000], [100, 200], [10], [3], [1000]])
    assert res == [0, 0, INVALID_PARAMS, 0, 0]
    assert store.get_batch([key + "/adj", key + "/sc", key + "/bad", key + "/exists",
                            key + "/one"]) == [
        a[:3000], pattern(100, 19) + pattern(200, 20), b"", b"old", a[5000:]]
    # A null pointer fails its key only.
    res = store.batch_put_from_multi_buffers([key + "/null", key + "/ok"], [[0], [sp]],
                                             [[10], [10]])
    assert res == [INVALID_PARAMS, 0]
    assert store.get(key + "/ok") == a[:10]


def test_batch_get_replica_desc_per_key(store, key):
    """One BatchGetReplicaList: each key maps to its own replicas ([] when missing)."""
    sizes = {key + "/a": 10, key + "/b": 70_001, key + "/c": 1}
    for k, n in sizes.items():
        assert store.put(k, pattern(n, 21)) == 0
    asked = [key + "/b", key + "/missing", key + "/a", key + "/c"]
    m = store.batch_get_replica_desc(asked)
    assert sorted(m) == sorted(asked) and m[key + "/missing"] == []
    for k, n in sizes.items():
        (desc,) = m[k]
        assert desc.get_memory_descriptor().buffer_descriptor.size == n, k
    assert store.batch_get_replica_desc([]) == {}
