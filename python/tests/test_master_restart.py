"""A store rides through a master restart: while the master is down every call fails fast with a
clear failure value (no hang beyond the RPC timeout), and once the master is back (restored from
its SIGTERM snapshot on the same port) the store re-mounts its segment and the objects it held
read back byte-exact, with no re-put."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import HERE, make_store

# Generous on a loaded 2-core machine; a call to a dead master must not take this long.
CALL_BOUND_S = 20.0
RESTART_BOUND_S = 60.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SnapshotMaster:
    """`python -m mooncake_rs.master` on a fixed port with snapshots in `dir`."""

    def __init__(self, port, directory, *extra):
        cmd = [sys.executable, "-m", "mooncake_rs.master", "--port=%d" % port,
               "--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1", "--metrics_port=0",
               "--enable_snapshot=true", "--snapshot_dir=%s" % directory] + list(extra)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=HERE)
        deadline = time.monotonic() + 30
        self.addr = None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("mooncake master listening: rpc "):
                self.addr = line.split()[4]
                break
        if self.addr is None:
            self.kill()
            raise RuntimeError("master did not start: %s" % self.proc.stderr.read()[-2000:])

    def terminate(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


def test_calls_fail_fast_during_a_master_outage_and_objects_come_back_after_restore():
    directory = tempfile.mkdtemp(prefix="mc-py-restart-")
    port = free_port()
    values = {"restart/%d" % i: os.urandom(1000 + 997 * i) for i in range(20)}
    master = SnapshotMaster(port, directory)
    restored = None
    store = None
    try:
        store = make_store(master.addr)
        for key, value in values.items():
            assert store.put(key, value) == 0, key

        master.terminate()  # takes the final snapshot before it exits

        # Outage: every call answers with a failure value, each well within the bound.
        got, took = timed(lambda: store.get("restart/0"))
        assert got == b"" and took < CALL_BOUND_S, (got[:8], took)
        rc, took = timed(lambda: store.is_exist("restart/0"))
        assert rc < 0 and took < CALL_BOUND_S, (rc, took)
        rc, took = timed(lambda: store.put("restart/new", b"x" * 100))
        assert rc < 0 and took < CALL_BOUND_S, (rc, took)

        restored = SnapshotMaster(port, directory, "--enable_snapshot_restore=true")
        assert restored.addr == master.addr
        # The store re-mounts its segment on its next heartbeat; until then its replicas wait.
        deadline = time.monotonic() + RESTART_BOUND_S
        while store.get("restart/0") != values["restart/0"]:
            assert time.monotonic() < deadline, "objects did not come back after the restore"
            time.sleep(0.2)
        for key, value in values.items():
            assert store.get(key) == value, key
        assert store.is_exist("restart/new") == 0  # the put during the outage stored nothing
        assert store.put("restart/new", b"y" * 100) == 0
        assert store.get("restart/new") == b"y" * 100
    finally:
        if store is not None:
            store.close()
        if restored is not None:
            restored.terminate()
        master.kill()
