"""Upstream's edge-case behaviour: close() unmounts at once, get_hostname's port range,
local_buffer_size as the cap on unregistered objects, ranged calls with bad shapes, and every
call before setup() or after close()."""

import ctypes

import numpy as np

from conftest import make_store
from mooncake_rs.store import (MooncakeDistributedStore, MooncakeHostMemAllocator,
                               ReplicateConfig)

INVALID_PARAMS = -600
NOT_READY = -1010


def test_close_unmounts_at_once_for_every_reader_and_setup_works_again(master, key):
    owner = make_store(master.addr)
    reader = make_store(master.addr, segment=0)
    try:
        here = ReplicateConfig()
        here.preferred_segment = owner.get_hostname()
        assert owner.put(key, b"only on the owner", here) == 0
        desc = reader.get_replica_desc(key)
        assert len(desc) == 1
        endpoint = desc[0].get_memory_descriptor().buffer_descriptor.transport_endpoint
        assert owner.get_hostname() in endpoint, endpoint
        assert reader.get(key) == b"only on the owner"
        assert owner.close() == 0
        # Gone for the other reader right away, not after the master's client_ttl.
        assert reader.is_exist(key) == 0
        assert reader.get(key) == b""
        # The same object sets up again and works.
        assert owner.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "",
                           master.addr) == 0
        assert owner.put(key, b"again") == 0
        assert reader.get(key) == b"again"
    finally:
        reader.remove_all(force=True)
        owner.close()
        reader.close()


def test_get_hostname_without_a_port_is_in_upstreams_client_range(master):
    s = make_store(master.addr)
    try:
        host, port = s.get_hostname().rsplit(":", 1)
        assert host == "127.0.0.1"
        assert 12300 <= int(port) <= 14300, port
    finally:
        s.close()


def test_local_buffer_size_zero_refuses_plain_bytes_and_keeps_zero_copy(master, key):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", 0, "tcp", "", master.addr) == 0
    other = make_store(master.addr, segment=0)
    try:
        assert s.put(key, b"plain bytes") == INVALID_PARAMS
        assert other.is_exist(key) == 0, "no key left behind"
        assert s.put_batch([key + "/a"], [b"x"]) == INVALID_PARAMS
        assert s.upsert(key, b"x") == INVALID_PARAMS
        assert other.is_exist(key + "/a") == 0
        # Registered memory: zero copy, not capped.
        buf = np.frombuffer(b"registered!" * 100, dtype=np.uint8).copy()
        assert s.register_buffer(buf.ctypes.data, buf.nbytes) == 0
        assert s.put_from(key, buf.ctypes.data, buf.nbytes) == 0
        out = np.zeros(buf.nbytes, dtype=np.uint8)
        assert s.register_buffer(out.ctypes.data, out.nbytes) == 0
        assert s.get_into(key, out.ctypes.data, out.nbytes) == buf.nbytes
        assert bytes(out) == bytes(buf)
        # Reading into memory the store allocates (or unregistered memory) is capped too.
        assert s.get(key) == b""
        plain = np.zeros(buf.nbytes, dtype=np.uint8)
        assert s.get_into(key, plain.ctypes.data, plain.nbytes) == INVALID_PARAMS
        assert other.get(key) == bytes(buf)
        assert s.unregister_buffer(buf.ctypes.data) == 0
        assert s.unregister_buffer(out.ctypes.data) == 0
    finally:
        other.remove_all(force=True)
        other.close()
        s.close()


def test_local_buffer_size_caps_the_largest_unregistered_object(master, key):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", 4096, "tcp", "", master.addr) == 0
    try:
        assert s.put(key + "/small", bytes(4096)) == 0
        assert s.put(key + "/big", bytes(4097)) == INVALID_PARAMS
        assert s.put_parts(key + "/parts", bytes(2048), bytes(2049)) == INVALID_PARAMS
        assert s.get(key + "/small") == bytes(4096)
        assert s.is_exist(key + "/big") == 0 and s.is_exist(key + "/parts") == 0
    finally:
        s.remove_all(force=True)
        s.close()


def test_ranged_calls_with_bad_shapes_fail_only_their_key(store, key):
    value = bytes(range(256)) * 4
    assert store.put(key, value) == 0
    buf = (ctypes.c_ubyte * 128)()
    ptr = ctypes.addressof(buf)
    res = store.get_into_ranges(
        [ptr, ptr],
        [[key, key, key + "/missing"], [key]],
        [[[0], [8, 16], [32]], [[40]]],
        [[[4], [1000], [0]], [[100]]],      # key 1 of buffer 0: two dsts, one src
        [[[4], [8, 8], [4]], [[30]]])
    assert res[0][0] == [4]
    assert res[0][1] == [INVALID_PARAMS, INVALID_PARAMS]  # lists disagree in length
    assert res[0][2] == [-704]
    assert res[1] == [[30]]
    assert bytes(buf[0:4]) == value[4:8] and bytes(buf[40:70]) == value[100:130]
    # A source range past the end of the object fails its slot only.
    res = store.get_into_ranges([ptr], [[key, key]], [[[0], [8]]], [[[1020], [0]]],
                                [[[8], [8]]])
    assert res == [[[INVALID_PARAMS], [8]]]
    # Key-major ranged reads: a key whose lists disagree gets -600, the others their bytes.
    res = store.batch_get_into_multi_buffer_ranges(
        [key, key, key], [[ptr], [ptr, ptr + 8], [ptr]], [[8], [8], [8]], [[0], [0, 8], [1020]])
    assert res == [8, INVALID_PARAMS, INVALID_PARAMS]
    assert store.batch_get_into_multi_buffer_ranges([key], [], [], []) == [INVALID_PARAMS]


def test_every_call_before_setup_and_after_close_fails_cleanly(master, key):
    buf = (ctypes.c_ubyte * 16)()
    p = ctypes.addressof(buf)

    def calls(s):
        return {
            "put": s.put(key, b"v"), "put_parts": s.put_parts(key, b"v"),
            "put_batch": s.put_batch([key], [b"v"]), "get": s.get(key),
            "get_batch": s.get_batch([key]), "get_buffer": s.get_buffer(key),
            "batch_get_buffer": s.batch_get_buffer([key]),
            "register_buffer": s.register_buffer(p, 16), "unregister_buffer": s.unregister_buffer(p),
            "put_from": s.put_from(key, p, 16), "get_into": s.get_into(key, p, 16),
            "batch_put_from": s.batch_put_from([key], [p], [16]),
            "batch_get_into": s.batch_get_into([key], [p], [16]),
            "batch_put_from_multi_buffers": s.batch_put_from_multi_buffers([key], [[p]], [[16]]),
            "batch_get_into_multi_buffers": s.batch_get_into_multi_buffers([key], [[p]], [[16]]),
            "get_into_ranges": s.get_into_ranges([p], [[key]], [[[0]]], [[[0]]], [[[4]]]),
            "is_exist": s.is_exist(key), "batch_is_exist": s.batch_is_exist([key]),
            "get_size": s.get_size(key), "get_replica_desc": s.get_replica_desc(key),
            "batch_get_replica_desc": s.batch_get_replica_desc([key]),
            "remove": s.remove(key), "batch_remove": s.batch_remove([key]),
            "remove_by_regex": s.remove_by_regex(".*"), "remove_all": s.remove_all(),
            "batch_replica_clear": s.batch_replica_clear([key]),
            "upsert": s.upsert(key, b"v"), "upsert_parts": s.upsert_parts(key, b"v"),
            "upsert_batch": s.upsert_batch([key], [b"v"]), "upsert_from": s.upsert_from(key, p, 16),
            "batch_upsert_from": s.batch_upsert_from([key], [p], [16]),
            "put_from_with_metadata": s.put_from_with_metadata(key, p, p, 8, 8),
            "health_check": s.health_check(), "get_hostname": s.get_hostname(),
            "alloc_from_mem_pool": s.alloc_from_mem_pool(4096),
            "mount_segment": s.mount_segment("/dev/null", 4096),
            "allocate_and_mount_segment": s.allocate_and_mount_segment(4096),
            "unmount_segment": s.unmount_segment(["00000000-0000-0000-0000-000000000001"]),
            "unmount_and_free_segment": s.unmount_and_free_segment([]),
            "unmount_local_disk_segment": s.unmount_local_disk_segment(),
            "get_offload_rpc_read_count": s.get_offload_rpc_read_count(),
            "batch_get_session_start": s.batch_get_session_start([key]),
            "batch_get_session_end": s.batch_get_session_end([key]),
            "batch_get_into_multi_buffer_ranges":
                s.batch_get_into_multi_buffer_ranges([key], [[p]], [[4]], [[0]]),
            "batch_put_session_start": s.batch_put_session_start([key], [16]),
            "batch_put_from_multi_buffer_ranges":
                s.batch_put_from_multi_buffer_ranges([key], [[p]], [[4]], [[0]]),
            "batch_put_session_end": s.batch_put_session_end([key]),
            "batch_put_session_revoke": s.batch_put_session_revoke([key]),
            "create_copy_task": s.create_copy_task(key, ["x"]),
            "create_move_task": s.create_move_task(key, "x", "y"),
            "query_task": s.query_task((1, 2)),
            "close": s.close(), "close_with_grace": s.close(grace_period_seconds=5),
        }

    expected = {
        "get": b"", "get_batch": [b""], "get_buffer": None, "batch_get_buffer": [None],
        "get_replica_desc": [], "batch_get_replica_desc": {key: []},
        "batch_replica_clear": [], "health_check": 1, "get_hostname": "",
        "alloc_from_mem_pool": 0, "mount_segment": {"ret": NOT_READY, "segment_ids": []},
        "allocate_and_mount_segment": {"ret": NOT_READY, "segment_ids": [], "allocated_size": 0},
        "get_offload_rpc_read_count": 0, "close": 0, "close_with_grace": 0,
        "create_copy_task": ((0, 0), NOT_READY), "create_move_task": ((0, 0), NOT_READY),
        "query_task": (None, NOT_READY),
        "get_into_ranges": [[[NOT_READY]]],
    }
    fresh = MooncakeDistributedStore()
    closed = make_store(master.addr)
    assert closed.close() == 0
    for s in (fresh, closed):
        for name, got in calls(s).items():
            want = expected.get(name, NOT_READY)
            if isinstance(got, list) and name not in expected:
                want = [NOT_READY] * len(got)
            assert got == want, (name, got)
    assert MooncakeHostMemAllocator().free(12345) == INVALID_PARAMS
