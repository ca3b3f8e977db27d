"""Put and get sessions (layer-wise KV writes and reads) and put_from_with_metadata."""

import ctypes

import numpy as np

from conftest import make_store

INVALID_PARAMS = -600
OBJECT_ALREADY_EXISTS = -705


def test_layerwise_put_session_then_get_session(store, key):
    layers, page, nkeys = 4, 4096, 3
    keys = ["%s/%d" % (key, i) for i in range(nkeys)]
    src = np.random.default_rng(1).integers(0, 256, nkeys * layers * page, dtype=np.uint8)
    base = src.ctypes.data
    assert store.register_buffer(base, src.nbytes) == 0
    assert store.batch_put_session_start(keys, [layers * page] * nkeys) == [0] * nkeys
    assert store.batch_is_exist(keys) == [0] * nkeys  # reserved, not readable yet
    assert store.batch_put_session_start(keys[:1], [layers * page]) == [INVALID_PARAMS]
    for layer in range(layers):
        ptrs = [[base + (i * layers + layer) * page] for i in range(nkeys)]
        got = store.batch_put_from_multi_buffer_ranges(
            keys, ptrs, [[page]] * nkeys, [[layer * page]] * nkeys)
        assert got == [page] * nkeys
    assert store.batch_put_session_end(keys) == [0] * nkeys
    assert store.batch_put_session_end(keys[:1]) == [INVALID_PARAMS]  # no session any more
    for i, k in enumerate(keys):
        assert store.get(k) == bytes(src[i * layers * page:(i + 1) * layers * page])
    assert store.batch_put_session_start(keys[:1], [10]) == [OBJECT_ALREADY_EXISTS]

    dst = np.zeros_like(src)
    assert store.register_buffer(dst.ctypes.data, dst.nbytes) == 0
    assert store.batch_get_session_start(keys + [key + "/missing"]) == [0] * nkeys + [-704]
    for layer in reversed(range(layers)):
        ptrs = [[dst.ctypes.data + (i * layers + layer) * page] for i in range(nkeys)]
        got = store.batch_get_into_multi_buffer_ranges(
            keys, ptrs, [[page]] * nkeys, [[layer * page]] * nkeys)
        assert got == [page] * nkeys
    assert np.array_equal(src, dst)
    assert store.batch_get_session_end(keys) == 0
    assert store.unregister_buffer(base) == 0
    assert store.unregister_buffer(dst.ctypes.data) == 0


def test_revoked_put_session_leaves_the_key_free(store, key):
    assert store.batch_put_session_start([key], [64]) == [0]
    buf = ctypes.create_string_buffer(b"x" * 64, 64)
    assert store.batch_put_from_multi_buffer_ranges([key], [[ctypes.addressof(buf)]], [[64]],
                                                    [[0]]) == [64]
    assert store.batch_put_from_multi_buffer_ranges([key], [[ctypes.addressof(buf)]], [[64]],
                                                    [[1]]) == [INVALID_PARAMS]  # past the end
    assert store.batch_put_session_revoke([key]) == [0]
    assert store.is_exist(key) == 0
    assert store.put(key, b"fresh") == 0 and store.get(key) == b"fresh"
    assert store.batch_put_session_revoke([key]) == [INVALID_PARAMS]


def test_closing_revokes_open_put_sessions(master, key):
    s = make_store(master.addr, segment=0)
    other = make_store(master.addr)
    try:
        assert s.batch_put_session_start([key], [64]) == [0]
        assert s.close() == 0
        assert other.put(key, b"not reserved any more") == 0
        assert other.get(key) == b"not reserved any more"
    finally:
        other.remove_all(force=True)
        other.close()


def test_put_from_with_metadata_stores_metadata_then_data(store, key):
    data = ctypes.create_string_buffer(b"DATA-BYTES", 10)
    meta = ctypes.create_string_buffer(b"META", 4)
    assert store.put_from_with_metadata(key, ctypes.addressof(data), ctypes.addressof(meta),
                                        10, 4) == 0
    assert store.get(key) == b"METADATA-BYTES"
    assert store.put_from_with_metadata(key + "/empty", ctypes.addressof(data),
                                        ctypes.addressof(meta), 0, 4) == 0
    assert store.is_exist(key + "/empty") == 0  # size 0 stores nothing, as upstream
