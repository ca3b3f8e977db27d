"""Copy and move tasks (upstream's create_copy_task, create_move_task, query_task) and close()
with a grace period, against a real master: the store holding the source runs the task on its
heartbeat. Every wait is a bounded poll."""

import time
import urllib.request

from conftest import make_store
from mooncake_rs.store import (QueryTaskResponse, ReplicateConfig, TaskStatus, TaskType)

TASK_NOT_FOUND = -1400
DEADLINE_S = 60


def on(store):
    """A config that places the object on `store`'s segment."""
    config = ReplicateConfig()
    config.preferred_segment = store.get_hostname()
    return config


def holders(store, key):
    """The transport endpoints of `key`'s memory replicas, sorted."""
    return sorted(d.get_memory_descriptor().buffer_descriptor.transport_endpoint
                  for d in store.get_replica_desc(key) if d.is_memory_replica())


def used_bytes(master, segment):
    with urllib.request.urlopen("%s/query_segment?segment=%s" % (master.http, segment),
                                timeout=10) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith("Used(bytes):"):
            return int(line.split()[1])
    raise AssertionError("no Used(bytes) in %r" % text)


def finished(store, task_id):
    """Polls query_task until the task is SUCCESS or FAILED; returns the response."""
    deadline = time.monotonic() + DEADLINE_S
    last = None
    while time.monotonic() < deadline:
        last, code = store.query_task(task_id)
        assert code == 0, code
        if last.status in (TaskStatus.SUCCESS, TaskStatus.FAILED):
            return last
        time.sleep(0.1)
    raise AssertionError("task %r did not finish within %d s: %r" % (task_id, DEADLINE_S, last))


def test_a_copy_task_completes_and_the_target_holds_a_replica(master, key):
    a, b = make_store(master.addr), make_store(master.addr)
    try:
        value = bytes(range(256)) * 4096
        assert a.put(key, value, on(a)) == 0
        assert len(holders(b, key)) == 1
        task_id, code = b.create_copy_task(key, [b.get_hostname()])
        assert code == 0 and task_id != (0, 0), (task_id, code)
        done = finished(b, task_id)
        assert isinstance(done, QueryTaskResponse)
        assert done.status == TaskStatus.SUCCESS, done.message
        assert done.id == task_id and done.type == TaskType.REPLICA_COPY
        assert done.assigned_client != (0, 0)
        assert done.created_at_ms_epoch <= done.last_updated_at_ms_epoch
        found = holders(a, key)
        assert len(found) == 2, found
        assert any(b.get_hostname() in ep for ep in found), (found, b.get_hostname())
        assert b.get(key) == value
    finally:
        a.remove_all(force=True)
        a.close()
        b.close()


def test_a_move_task_frees_the_source(master, key):
    a, b = make_store(master.addr), make_store(master.addr)
    try:
        value = b"m" * (1 << 20)
        assert a.put(key, value, on(a)) == 0
        source, target = a.get_hostname(), b.get_hostname()
        used_before = used_bytes(master, source)
        assert used_before >= len(value)
        task_id, code = a.create_move_task(key, source, target)
        assert code == 0, code
        done = finished(a, task_id)
        assert done.status == TaskStatus.SUCCESS, done.message
        assert done.type == TaskType.REPLICA_MOVE
        found = holders(a, key)
        assert len(found) == 1 and target in found[0], (found, target)
        assert used_bytes(master, source) <= used_before - len(value)
        assert a.get(key) == value
    finally:
        a.remove_all(force=True)
        a.close()
        b.close()


def test_bad_tasks_answer_upstreams_codes(master, key):
    a = make_store(master.addr)
    try:
        assert a.query_task((12345, 67890)) == (None, TASK_NOT_FOUND)
        task_id, code = a.create_copy_task(key, [a.get_hostname()])
        assert task_id == (0, 0) and code < 0, (task_id, code)
        assert a.put(key, b"v", on(a)) == 0
        assert a.create_copy_task(key, [])[1] < 0
        assert a.create_copy_task(key, ["no-such-segment:1"])[1] < 0
        same = a.get_hostname()
        assert a.create_move_task(key, same, same) == ((0, 0), -600)
    finally:
        a.remove_all(force=True)
        a.close()


def test_close_with_a_grace_period_moves_the_objects_to_other_segments(master, key):
    owner, other = make_store(master.addr), make_store(master.addr)
    reader = make_store(master.addr, segment=0)
    keys = ["%s/%d" % (key, i) for i in range(20)]
    values = [("%d" % i).encode() * 5000 for i in range(20)]
    try:
        owner_name = owner.get_hostname()
        for k, v in zip(keys, values):
            assert owner.put(k, v, on(owner)) == 0
        assert owner.close(grace_period_seconds=30) == 0
        for k, v in zip(keys, values):
            assert reader.get(k) == v, k
            found = holders(reader, k)
            assert len(found) == 1 and owner_name not in found[0], (k, found)
    finally:
        reader.remove_all(force=True)
        reader.close()
        other.close()
        owner.close()
