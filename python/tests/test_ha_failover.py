"""The Python package follows the leader of an HA pair: a real etcd started here, two masters
with ``--enable_ha`` (``python -m mooncake_rs.master``), a writer store given both masters'
addresses (``a,b``) and a reader store given ``etcd://`` (the leader key in etcd). The leader is
SIGKILLed: the standby takes over, both stores reconnect and re-mount their segments, every object
acknowledged before reads back byte-exact, every acknowledged removal stays removed, and new puts
succeed. etcd must be installed (Debian ``etcd-server``; the test command installs it): without
it this test fails, it does not skip."""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

from conftest import Master, make_store

# Generous for a loaded 2-core machine: the election lease is 5 s.
WAIT_S = 90.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """One etcd member on free loopback ports with its own data directory, killed by PID."""

    def __init__(self):
        binary = shutil.which("etcd")
        assert binary, "etcd must be installed (Debian etcd-server; scripts/install-deps)"
        self.dir = tempfile.TemporaryDirectory()
        self.port = free_port()
        peer = "http://127.0.0.1:%d" % free_port()
        client = "http://127.0.0.1:%d" % self.port
        self.log = open(os.path.join(self.dir.name, "etcd.log"), "wb")
        self.proc = subprocess.Popen(
            [binary, "--data-dir", os.path.join(self.dir.name, "data"), "--name", "default",
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "default=" + peer],
            stdout=subprocess.DEVNULL, stderr=self.log)
        wait_until(lambda: self.healthy(), "etcd healthy")

    def healthy(self):
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"
        except OSError:
            return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()
        self.dir.cleanup()


def wait_until(condition, what, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("%s: not within %.0f s" % (what, timeout))


def http_get(master, path):
    """The body of GET ``path`` on the master's admin port, or None when it does not answer."""
    try:
        with urllib.request.urlopen(master.http + path, timeout=5) as r:
            return r.read().decode().strip()
    except OSError:
        return None


def ha_master(etcd):
    # The etcd:// form finds the leader of upstream's default cluster id.
    return Master("--enable_ha", "--etcd_endpoints=127.0.0.1:%d" % etcd.port,
                  "--cluster_id=mooncake_cluster")


@pytest.fixture
def ha_pair():
    etcd = Etcd()
    started = []
    try:
        first = ha_master(etcd)
        started.append(first)
        wait_until(lambda: http_get(first, "/role") == "leader", "the first master leads")
        second = ha_master(etcd)
        started.append(second)
        wait_until(lambda: http_get(second, "/ha_status") == "standby", "the second stands by")
        wait_until(lambda: '"present":true' in (http_get(second, "/leader") or ""),
                   "the standby sees the leader")
        yield etcd, first, second
    finally:
        for m in started:
            if m.proc.poll() is None:
                m.proc.kill()
                m.proc.wait(10)
        etcd.stop()


def value_of(i):
    return bytes((i * 7 + j) % 251 for j in range(1000 + i * 997))


def test_stores_follow_the_standby_that_takes_over_a_sigkilled_leader(ha_pair):
    etcd, first, second = ha_pair
    writer = make_store("%s,%s" % (first.addr, second.addr))
    reader = make_store("etcd://127.0.0.1:%d" % etcd.port, segment="32MB")
    try:
        kept, removed = {}, []
        for i in range(40):
            key = "ha/%d" % i
            store = writer if i % 2 == 0 else reader
            assert store.put(key, value_of(i)) == 0, key
            if i % 5 == 0:
                assert writer.remove(key, True) == 0, key
                removed.append(key)
            else:
                kept[key] = value_of(i)
        for key, value in kept.items():
            assert reader.get(key) == value, key

        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        wait_until(lambda: http_get(second, "/role") == "leader", "the standby takes over")

        # Writes come back by themselves: a put is retried here only while it fails.
        after = b"after failover" * 100
        wait_until(lambda: writer.put("ha/after", after) == 0, "a put through the new leader")
        # Both stores' segments are mounted again with their objects: every acknowledged
        # object reads back exact through either store, every removal stays removed.
        wait_until(lambda: all(reader.get(k) == v for k, v in kept.items()),
                   "every acknowledged object readable through the reader")
        for store in (writer, reader):
            for key, value in kept.items():
                assert store.get(key) == value, key
                assert store.is_exist(key) == 1, key
            for key in removed:
                assert store.is_exist(key) == 0, key
                assert store.get(key) == b"", key
        assert reader.get("ha/after") == after
        assert reader.put("ha/after-reader", after) == 0
        assert writer.get("ha/after-reader") == after
    finally:
        writer.close()
        reader.close()
