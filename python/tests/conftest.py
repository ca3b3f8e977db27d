"""Fixtures: a mooncake-rs master per test session (``python -m mooncake_rs.master``) on
127.0.0.1 with free ports, and set-up stores. Everything started here is stopped here."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from mooncake_rs.store import MooncakeDistributedStore

HERE = os.path.dirname(os.path.abspath(__file__))


class Master:
    def __init__(self, *extra):
        cmd = [sys.executable, "-m", "mooncake_rs.master", "--port=0", "--rpc_address=127.0.0.1",
               "--metrics_host=127.0.0.1", "--metrics_port=0"] + list(extra)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=HERE)
        deadline = time.monotonic() + 30
        self.addr = None
        # The admin HTTP base URL ("http://127.0.0.1:PORT").
        self.http = None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("mooncake master listening: rpc "):
                words = line.split()
                self.addr, self.http = words[4], words[6]
                break
        if self.addr is None:
            self.stop()
            raise RuntimeError("master did not start: %s" % self.proc.stderr.read()[-2000:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture(scope="session")
def master():
    m = Master()
    yield m
    m.stop()


def make_store(addr, segment="64MB", local_buffer="16MB", **kw):
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", segment, local_buffer, "tcp", "", addr, **kw)
    assert rc == 0, rc
    return s


@pytest.fixture
def store(master):
    s = make_store(master.addr)
    yield s
    s.remove_all(force=True)
    assert s.close() == 0


@pytest.fixture
def key():
    return "test/%s" % uuid.uuid4().hex
