"""Every method of MooncakeDistributedStore, with upstream's return conventions."""

import ctypes
import threading

import numpy as np
import pytest

from mooncake_rs.store import (BufferHandle, MooncakeDistributedStore, ReplicaStatus,
                               ReplicateConfig, SoftPinAction)
from mooncake_rs import error_name

OBJECT_NOT_FOUND = -704
INVALID_PARAMS = -600
NOT_SUPPORTED = -1012


def cbuf(n, fill=None):
    buf = (ctypes.c_ubyte * n)()
    if fill is not None:
        ctypes.memmove(buf, fill, len(fill))
    return buf, ctypes.addressof(buf)


def test_put_get_missing_and_first_write_wins(store, key):
    assert store.get(key) == b""
    assert store.put(key, b"first") == 0
    assert store.put(key, b"second, longer") == 0  # existing key: 0, object unchanged
    assert store.get(key) == b"first"
    assert store.put(key + "/ba", bytearray(b"ba")) == 0
    assert store.get(key + "/ba") == b"ba"
    assert store.put(key + "/mv", memoryview(b"xmvx")[1:3]) == 0
    assert store.get(key + "/mv") == b"mv"
    arr = np.arange(10, dtype=np.float32)
    assert store.put(key + "/np", arr) == 0
    assert np.array_equal(np.frombuffer(store.get(key + "/np"), dtype=np.float32), arr)
    with pytest.raises(TypeError):
        store.put(key, "a str is not bytes-like")
    assert store.put(key + "/empty", b"") == INVALID_PARAMS  # upstream refuses empty values


def test_keys_with_punctuation(store):
    k = "model-a_b:c@d/e.f_0123abcdef_k"
    assert store.put(k, b"1") == 0
    assert store.is_exist(k) == 1 and store.get(k) == b"1"


def test_put_batch_get_batch(store, key):
    keys = ["%s/%d" % (key, i) for i in range(5)]
    vals = [bytes([i]) * (100 + i) for i in range(5)]
    assert store.put_batch(keys, vals) == 0
    got = store.get_batch(keys + [key + "/missing"])
    assert got[:5] == vals and got[5] == b""
    assert store.put_batch(keys, vals) == 0  # all present: still 0
    assert store.put_batch(keys, vals[:2]) == INVALID_PARAMS
    assert store.get_batch([]) == []


def test_put_parts(store, key):
    assert store.put_parts(key, b"ab", bytearray(b"cd"), memoryview(b"ef"),
                           config=ReplicateConfig()) == 0
    assert store.get(key) == b"abcdef"
    assert store.put_parts(key, b"zz") == 0
    assert store.get(key) == b"abcdef"


def test_get_buffer_and_batch_get_buffer(store, key):
    val = bytes(range(256)) * 4
    assert store.put(key, val) == 0
    h = store.get_buffer(key)
    assert isinstance(h, BufferHandle)
    assert h.size() == len(h) == len(val)
    assert bytes(memoryview(h)) == val
    assert ctypes.string_at(h.ptr(), h.size()) == val
    assert np.frombuffer(h, dtype=np.uint8)[5] == 5
    assert store.get_buffer(key + "/missing") is None
    hs = store.batch_get_buffer([key, key + "/missing", key])
    assert hs[1] is None and bytes(hs[0]) == val and bytes(hs[2]) == val
    mv = memoryview(hs[0])
    del hs, h
    assert bytes(mv) == val  # the view keeps the memory alive


def test_zero_copy_with_ctypes(store, key):
    n = 1 << 20
    src, sp = cbuf(n, bytes(range(256)) * (n // 256))
    dst, dp = cbuf(n)
    assert store.register_buffer(sp, n) == 0
    assert store.register_buffer(dp, n) == 0
    try:
        assert store.put_from(key, sp, n) == 0
        assert store.put_from(key, sp, 10) == 0  # exists: unchanged
        assert store.get_size(key) == n
        assert store.get_into(key, dp, n) == n
        assert bytes(dst) == bytes(src)
        assert store.get_into(key, dp, n - 1) == INVALID_PARAMS  # buffer too small
        assert store.get_into(key + "/missing", dp, n) == OBJECT_NOT_FOUND
        assert store.get_into(key, 0, n) == INVALID_PARAMS
        # Unregistered memory works too (registered for the call).
        other, op = cbuf(n)
        assert store.get_into(key, op, n) == n and bytes(other) == bytes(src)
    finally:
        assert store.unregister_buffer(sp) == 0
        assert store.unregister_buffer(dp) == 0
    assert store.unregister_buffer(dp) < 0  # not registered any more


def test_zero_copy_with_numpy(store, key):
    a = np.arange(1 << 16, dtype=np.float32)
    b = np.zeros_like(a)
    assert store.register_buffer(a.ctypes.data, a.nbytes) == 0
    assert store.register_buffer(b.ctypes.data, b.nbytes) == 0
    try:
        assert store.put_from(key, a.ctypes.data, a.nbytes) == 0
        assert store.get_into(key, b.ctypes.data, b.nbytes) == a.nbytes
        assert np.array_equal(a, b)
        half = a.nbytes // 2
        keys = [key + "/lo", key + "/hi"]
        assert store.batch_put_from(keys, [a.ctypes.data, a.ctypes.data + half], [half, half]) == [0, 0]
        b[:] = 0
        assert store.batch_get_into(keys, [b.ctypes.data + half, b.ctypes.data], [half, half]) == [half, half]
        assert np.array_equal(b[: len(a) // 2], a[len(a) // 2:])
        assert np.array_equal(b[len(a) // 2:], a[: len(a) // 2])
    finally:
        store.unregister_buffer(a.ctypes.data)
        store.unregister_buffer(b.ctypes.data)


def test_batch_put_from_and_get_into_results_per_key(store, key):
    n = 4096
    src, sp = cbuf(3 * n, b"a" * n + b"b" * n + b"c" * n)
    dst, dp = cbuf(3 * n)
    keys = ["%s/%d" % (key, i) for i in range(3)]
    assert store.batch_put_from(keys, [sp, sp + n, sp + 2 * n], [n, n, n]) == [0, 0, 0]
    assert store.batch_put_from(keys, [sp, sp + n, sp + 2 * n], [n, n, n]) == [0, 0, 0]
    assert store.batch_put_from(keys, [sp], [n]) == [INVALID_PARAMS] * 3
    res = store.batch_get_into(keys[:2] + [key + "/missing"], [dp, dp + n, dp + 2 * n], [n, n, n])
    assert res == [n, n, OBJECT_NOT_FOUND]
    assert bytes(dst)[: 2 * n] == b"a" * n + b"b" * n
    # A short object reports its real length (LMCache trims partial chunks with it).
    assert store.put(key + "/short", b"xyz") == 0
    assert store.batch_get_into([key + "/short"], [dp], [n]) == [3]


def test_multi_buffers(store, key):
    parts = [b"L0" * 100, b"L1" * 50, b"L2" * 25]
    bufs = [cbuf(len(p), p) for p in parts]
    ptrs = [p for _, p in bufs]
    sizes = [len(p) for p in parts]
    cfg = ReplicateConfig()
    assert store.batch_put_from_multi_buffers([key], [ptrs], [sizes], cfg) == [0]
    assert store.get(key) == b"".join(parts)
    # Read back into scattered buffers and into adjacent ones.
    outs = [cbuf(s) for s in sizes]
    res = store.batch_get_into_multi_buffers([key, key + "/missing"], [[p for _, p in outs]] * 2,
                                             [sizes] * 2)
    assert res == [sum(sizes), OBJECT_NOT_FOUND]
    assert b"".join(bytes(b) for b, _ in outs) == b"".join(parts)
    whole, wp = cbuf(sum(sizes))
    adj = [wp, wp + sizes[0], wp + sizes[0] + sizes[1]]
    assert store.batch_get_into_multi_buffers([key], [adj], [sizes]) == [sum(sizes)]
    assert bytes(whole) == b"".join(parts)
    small = [cbuf(10)]
    assert store.batch_get_into_multi_buffers([key], [[small[0][1]]], [[10]]) == [INVALID_PARAMS]


def test_get_into_ranges(store, key):
    assert store.put(key + "/a", b"0123456789") == 0
    assert store.put(key + "/b", b"abcdefghij") == 0
    buf, bp = cbuf(32)
    res = store.get_into_ranges([bp], [[key + "/a", key + "/b", key + "/none"]],
                                [[[0, 4], [10], [20]]], [[[2, 8], [5], [0]]], [[[3, 2], [4], [1]]])
    assert res == [[[3, 2], [4], [OBJECT_NOT_FOUND]]]
    assert bytes(buf)[:6] == b"234" + b"\0" + b"89"
    assert bytes(buf)[10:14] == b"fghi"
    res = store.get_into_ranges([bp], [[key + "/a"]], [[[0]]], [[[8]]], [[[5]]])
    assert res == [[[INVALID_PARAMS]]]  # range past the end of the object


def test_is_exist_and_batch_is_exist(store, key):
    assert store.is_exist(key) == 0
    assert store.put(key, b"v") == 0
    assert store.is_exist(key) == 1
    assert store.batch_is_exist([key, key + "/no", key]) == [1, 0, 1]
    assert store.batch_is_exist([]) == []


def test_get_size_and_replica_desc(store, key):
    assert store.get_size(key) == OBJECT_NOT_FOUND
    assert store.put(key, b"x" * 1234) == 0
    assert store.get_size(key) == 1234
    descs = store.get_replica_desc(key)
    assert len(descs) == 1
    d = descs[0]
    assert d.is_memory_replica() and not d.is_disk_replica()
    assert d.status == ReplicaStatus.COMPLETE
    bd = d.get_memory_descriptor().buffer_descriptor
    assert bd.size == 1234 and bd.transport_endpoint
    with pytest.raises(ValueError):
        d.get_disk_descriptor()
    assert store.get_replica_desc(key + "/no") == []
    m = store.batch_get_replica_desc([key, key + "/no"])
    assert set(m) == {key, key + "/no"} and len(m[key]) == 1 and m[key + "/no"] == []


def test_remove_family(store, key):
    keys = ["%s/%d" % (key, i) for i in range(4)]
    for k in keys:
        assert store.put(k, b"v") == 0
    assert store.remove(keys[0]) == 0
    assert store.remove(keys[0]) == OBJECT_NOT_FOUND
    assert store.batch_remove([keys[1], key + "/none"]) == [0, OBJECT_NOT_FOUND]
    assert store.remove_by_regex("^" + key + "/[23]$") == 2
    assert store.remove_by_regex("(") < 0  # bad regex
    for k in keys:
        assert store.is_exist(k) == 0
    for k in keys:
        assert store.put(k, b"v") == 0
    assert store.remove_all(force=True) >= 4
    assert store.batch_is_exist(keys) == [0, 0, 0, 0]


def test_replicate_config_fields_and_validation():
    c = ReplicateConfig()
    assert (c.replica_num, c.with_soft_pin, c.with_hard_pin, c.soft_pin_ttl_ms) == (1, False, False, None)
    assert c.soft_pin_action == SoftPinAction.PRESERVE
    assert c.preferred_segments == [] and c.preferred_segment == "" and not c.prefer_alloc_in_same_node
    assert hasattr(c, "group_ids") and c.group_ids is None
    c.with_soft_pin = True
    assert c.soft_pin_action == SoftPinAction.ENABLE
    c.soft_pin_action = SoftPinAction.DISABLE
    assert not c.with_soft_pin
    c.soft_pin_ttl_ms = 0
    c.soft_pin_ttl_ms = 2 ** 64 - 1
    c.soft_pin_ttl_ms = None
    for bad in (-1, 2 ** 64, "5", 1.5):
        with pytest.raises(TypeError):
            c.soft_pin_ttl_ms = bad
    assert c.soft_pin_ttl_ms is None
    c.preferred_segments = ["a", "b"]
    c.group_ids = ["g"]
    assert c.preferred_segments == ["a", "b"] and c.group_ids == ["g"]
    assert int(SoftPinAction.ENABLE) == 1 and int(SoftPinAction.DISABLE) == 2
    assert "replica_num=1" in str(ReplicateConfig())


def test_config_reaches_the_master(store, key):
    c = ReplicateConfig()
    c.replica_num = 0
    assert store.put(key, b"v", c) == INVALID_PARAMS
    c = ReplicateConfig()
    c.soft_pin_ttl_ms = 1000  # a TTL without ENABLE is refused by the master, as upstream
    assert store.put(key, b"v", c) == INVALID_PARAMS
    c.soft_pin_action = SoftPinAction.ENABLE
    assert store.put(key, b"v", c) == 0
    c = ReplicateConfig()
    c.preferred_segment = store.get_hostname()
    c.with_hard_pin = True
    assert store.put(key + "/pinned", b"p", config=c) == 0
    ep = store.get_replica_desc(key + "/pinned")[0].get_memory_descriptor().buffer_descriptor
    assert store.get_hostname() in ep.transport_endpoint
    c = ReplicateConfig()
    c.group_ids = ["g1", "g2"]
    buf, bp = cbuf(8, b"grouped!")
    assert store.batch_put_from([key + "/g"], [bp], [8], c) == [INVALID_PARAMS]  # 2 groups, 1 key
    c.group_ids = ["g1"]
    assert store.batch_put_from([key + "/g"], [bp], [8], c) == [0]
    assert store.get(key + "/g") == b"grouped!"


def test_batch_replica_clear(master, store, key):
    """Clears this client's replicas whose lease has expired; skips leased keys, other clients'
    keys and missing keys."""
    from conftest import make_store
    other = make_store(master.addr, segment=0)
    try:
        assert store.put(key + "/mine", b"v") == 0
        assert store.put(key + "/leased", b"v") == 0
        assert store.is_exist(key + "/leased") == 1  # held until this store's next lookup
        assert other.put(key + "/theirs", b"v") == 0
        cleared = store.batch_replica_clear(
            [key + "/mine", key + "/leased", key + "/theirs", key + "/missing"],
            store.get_hostname())
        assert cleared == [key + "/mine"]
        assert store.batch_is_exist([key + "/mine", key + "/leased", key + "/theirs"]) == [0, 1, 1]
        assert store.put(key + "/all", b"v") == 0
        assert store.batch_replica_clear([key + "/all"]) == [key + "/all"]  # "" = whole object
    finally:
        other.remove_all(force=True)
        other.close()


def test_upsert_family_replaces_values(store, key):
    # put keeps the first write; upsert replaces it (same size in place, then a new size).
    assert store.put(key, b"first") == 0
    assert store.put(key, b"other") == 0
    assert store.get(key) == b"first"
    assert store.upsert(key, b"again") == 0
    assert store.get(key) == b"again"
    assert store.upsert(key, b"a longer value") == 0
    assert store.get(key) == b"a longer value"
    # upsert of a missing key inserts it.
    assert store.upsert_parts(key + "/parts", b"ab", b"", b"cd") == 0
    assert store.get(key + "/parts") == b"abcd"
    assert store.upsert_batch([key + "/b1", key + "/b2"], [b"x", b"yy"]) == 0
    assert store.get_batch([key + "/b1", key + "/b2"]) == [b"x", b"yy"]
    assert store.upsert_batch([key], [b"v", b"w"]) < 0  # length mismatch
    buf = ctypes.create_string_buffer(b"zero-copy!", 10)
    assert store.upsert_from(key, ctypes.addressof(buf), 10) == 0
    assert store.get(key) == b"zero-copy!"
    codes = store.batch_upsert_from([key + "/b1", key + "/b2"], [ctypes.addressof(buf)] * 2, [4, 10])
    assert codes == [0, 0]
    assert store.get_batch([key + "/b1", key + "/b2"]) == [b"zero", b"zero-copy!"]
    assert store.upsert_from(key, 0, 4) < 0  # null pointer
    assert error_name(NOT_SUPPORTED) == "NOT_SUPPORTED"


def test_subclassing_like_async_store(master, key):
    import asyncio
    import concurrent.futures

    class AsyncStore(MooncakeDistributedStore):
        def __init__(self, workers=4):
            super().__init__()
            self.pool = concurrent.futures.ThreadPoolExecutor(workers)

        def __getattr__(self, name):
            if name.startswith("async_"):
                method = getattr(self, name[len("async_"):])

                async def call(*a, **kw):
                    return await asyncio.get_running_loop().run_in_executor(
                        self.pool, lambda: method(*a, **kw))
                return call
            raise AttributeError(name)

    s = AsyncStore(workers=4)
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", master.addr) == 0

    async def run():
        rcs = await asyncio.gather(*[s.async_put("%s/%d" % (key, i), b"v%d" % i) for i in range(8)])
        vals = await asyncio.gather(*[s.async_get("%s/%d" % (key, i)) for i in range(8)])
        return rcs, vals

    rcs, vals = asyncio.run(run())
    assert rcs == [0] * 8 and vals == [b"v%d" % i for i in range(8)]
    s.remove_all(force=True)
    assert s.close() == 0
    s.pool.shutdown()
