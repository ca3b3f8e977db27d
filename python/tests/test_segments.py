"""The mount_segment family (upstream's REST service mounts memory at run time), is_local_disk_replica
and get_offload_rpc_read_count."""

import os
import tempfile
import uuid

from conftest import make_store
from mooncake_rs.store import ReplicateConfig

INVALID_PARAMS = -600


def test_mount_a_file_serve_objects_from_it_and_unmount_it(master, key):
    owner = make_store(master.addr, segment=0)  # no memory until a segment is mounted
    writer = make_store(master.addr, segment=0)
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    path = os.path.join(base, "mc-rs-test-%s" % uuid.uuid4().hex)
    with open(path, "wb") as f:
        f.truncate(8 << 20)
    try:
        result = owner.mount_segment(path, 4 << 20, 4096, "tcp", "cpu:0")
        assert result["ret"] == 0, result
        [segment_id] = result["segment_ids"]
        assert isinstance(segment_id, str) and segment_id
        here = ReplicateConfig()
        here.preferred_segment = owner.get_hostname()
        value = b"in the file " * 1000
        assert writer.put(key, value, here) == 0
        assert writer.get(key) == value
        with open(path, "rb") as f:
            assert value[:4096] in f.read(), "the object's bytes live in the mounted file"
        for d in writer.get_replica_desc(key):
            assert d.is_memory_replica() and not d.is_local_disk_replica()
        assert owner.unmount_segment([segment_id]) == 0
        assert writer.get(key) == b""  # gone at once with its segment
        assert owner.unmount_segment([segment_id]) == INVALID_PARAMS  # not mounted any more
        assert owner.unmount_segment(["not-a-uuid"]) == INVALID_PARAMS
        assert owner.mount_segment(path, 4096, 1)["ret"] == INVALID_PARAMS  # unaligned offset
        assert owner.mount_segment(path + ".missing", 4096)["ret"] == INVALID_PARAMS
        assert owner.mount_segment(path, 16 << 20)["ret"] == INVALID_PARAMS  # past the end
        assert owner.mount_segment(path, 4096, 0, "ucx")["ret"] == INVALID_PARAMS
    finally:
        writer.remove_all(force=True)
        owner.close()
        writer.close()
        os.unlink(path)


def test_allocate_and_mount_then_unmount_and_free(master, key):
    owner = make_store(master.addr, segment=0)
    writer = make_store(master.addr, segment=0)
    try:
        result = owner.allocate_and_mount_segment(16 << 20)
        assert result["ret"] == 0 and result["allocated_size"] == 16 << 20, result
        [segment_id] = result["segment_ids"]
        here = ReplicateConfig()
        here.preferred_segment = owner.get_hostname()
        assert writer.put(key, b"v" * 5000, here) == 0
        assert writer.get(key) == b"v" * 5000
        # A grace period keeps the object readable while the segment leaves placement.
        assert owner.unmount_and_free_segment([segment_id], 30) == 0
        assert writer.get(key) == b"v" * 5000
        assert owner.unmount_and_free_segment([segment_id], -1) == INVALID_PARAMS
        assert owner.allocate_and_mount_segment(0)["ret"] == INVALID_PARAMS
        assert owner.unmount_local_disk_segment() == 0  # no SSD segment: nothing to do
        assert owner.get_offload_rpc_read_count() == 0
    finally:
        writer.remove_all(force=True)
        owner.close()
        writer.close()
