"""The local disk tier from Python: setup(enable_ssd_offload=True, ssd_offload_path=DIR) against a
master started with --enable_offload. Objects put beyond the store's memory are offloaded to
its disk and read back byte-exact (get, get_into via batch_get_buffer, get_batch) after memory
evicted them; two stores given the same DIR each take their own subdirectory; a bad
MOONCAKE_OFFLOAD_* value fails setup with -600."""

import os
import time

import pytest

from mooncake_rs.store import MooncakeDistributedStore
from conftest import Master, make_store

MIB = 1 << 20
OBJECTS = 24


@pytest.fixture(scope="module")
def offload_master():
    m = Master("--enable_offload=true")
    yield m
    m.stop()


def value(i):
    return bytes([(i * 31 + j) % 251 for j in range(256)]) * (MIB // 256)


def put_with_retry(store, key, data):
    deadline = time.monotonic() + 60
    while True:
        rc = store.put(key, data)
        if rc == 0:
            return
        # Memory full of replicas still pinned by their offload: wait for the disk to catch up.
        assert time.monotonic() < deadline, "put %s kept failing: %d" % (key, rc)
        time.sleep(0.05)


def test_objects_beyond_memory_read_back_from_disk(offload_master, tmp_path):
    node = make_store(offload_master.addr, segment="8MB", enable_ssd_offload=True,
                      ssd_offload_path=str(tmp_path))
    reader = make_store(offload_master.addr, segment="0")
    try:
        keys = ["py-ssd/%d" % i for i in range(OBJECTS)]
        for i, k in enumerate(keys):
            put_with_retry(node, k, value(i))
        # Every object readable byte-exact, from memory or from the node's disk.
        deadline = time.monotonic() + 60
        for i, k in enumerate(keys):
            while True:
                got = reader.get(k)
                if got == value(i) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert got == value(i), k
        got = reader.get_batch(keys)
        assert [g == value(i) for i, g in enumerate(got)] == [True] * OBJECTS
        # 3x the memory was put: most objects are on disk only now.
        assert len(os.listdir(tmp_path)) == 1 and os.listdir(tmp_path)[0] == "client-0"
    finally:
        reader.close()
        node.close()


def test_a_shared_path_gives_each_store_its_own_subdirectory(offload_master, tmp_path):
    a = make_store(offload_master.addr, segment="8MB", enable_ssd_offload=True,
                   ssd_offload_path=str(tmp_path))
    b = make_store(offload_master.addr, segment="8MB", enable_ssd_offload=True,
                   ssd_offload_path=str(tmp_path))
    try:
        assert sorted(os.listdir(tmp_path)) == ["client-0", "client-1"]
    finally:
        a.close()
        b.close()


def test_a_bad_offload_knob_fails_setup(offload_master, tmp_path, monkeypatch):
    monkeypatch.setenv("MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR", "nvme_kv_storage_backend")
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", "8MB", "16MB", "tcp", "", offload_master.addr,
                 enable_ssd_offload=True, ssd_offload_path=str(tmp_path))
    assert rc == -600
