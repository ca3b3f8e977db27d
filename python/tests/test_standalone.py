"""Standalone mode end to end: a real client process (``mooncake_client``, or
``python -m mooncake_rs.client``) contributes the memory; this process attaches with
setup_dummy and puts and gets, zero copy from alloc_from_mem_pool and MooncakeHostMemAllocator
memory, plain bytes too, with the bytes moving over shared memory."""

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import HERE
from mooncake_rs.store import MooncakeDistributedStore, MooncakeHostMemAllocator, ReplicateConfig

INVALID_PARAMS = -600


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RealClient:
    def __init__(self, master_addr, *extra):
        script = shutil.which("mooncake_client")
        cmd = [script] if script else [sys.executable, "-m", "mooncake_rs.client"]
        self.port = free_port()
        cmd += ["--master_server_address=" + master_addr, "--host=127.0.0.1",
                "--port=%d" % self.port, "--global_segment_size=64MB",
                "--local_buffer_size=0", "--protocol=tcp"] + list(extra)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=HERE)
        deadline = time.monotonic() + 30
        self.line = None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("mooncake_client: attach "):
                self.line = line.split()
                break
        if self.line is None:
            self.stop()
            raise RuntimeError("real client did not start: %s" % self.proc.stderr.read()[-2000:])
        self.attach = self.line[2]
        self.segment = self.line[4]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@pytest.fixture
def real(master):
    r = RealClient(master.addr, "--tenant_id=default")
    yield r
    r.stop()


def test_dummy_puts_and_gets_zero_copy_through_the_real_clients_memory(real, key):
    assert real.attach == "127.0.0.1:%d" % real.port
    s = MooncakeDistributedStore()
    assert s.setup_dummy(8 << 20, 16 << 20, real.attach) == 0
    try:
        assert s.get_hostname() == real.segment
        # Zero copy from the pool.
        n = 1 << 20
        src = s.alloc_from_mem_pool(n)
        dst = s.alloc_from_mem_pool(n)
        assert src != 0 and dst != 0 and src != dst
        assert s.register_buffer(src, n) == 0  # inside the pool: accepted as is
        payload = bytes((i * 7) % 251 for i in range(n))
        ctypes.memmove(src, payload, n)
        here = ReplicateConfig()
        here.preferred_segment = s.get_hostname()  # the real client's memory, as SGLang does
        assert s.put_from(key, src, n, here) == 0
        assert s.get_into(key, dst, n) == n
        assert ctypes.string_at(dst, n) == payload
        assert s.unregister_buffer(src) == 0
        # Plain bytes too, and batches.
        assert s.put(key + "/plain", b"plain value") == 0
        assert s.get(key + "/plain") == b"plain value"
        assert s.batch_get_into([key, key + "/plain"], [dst, dst + n // 2], [n // 2, 64]) == \
            [INVALID_PARAMS, 11]
        # The real client's segment is the only one this dummy can have used: it is mapped
        # over shared memory.
        assert s._shm_mapped_segments() >= 1
        # The pool is bounded by mem_pool_size (8 MiB, 2 MiB used).
        assert s.alloc_from_mem_pool(7 << 20) == 0
        assert s.alloc_from_mem_pool(4 << 20) != 0
    finally:
        s.remove_all(force=True)
        assert s.close() == 0


def test_host_memory_from_the_allocator_registers_and_moves_zero_copy(real, key):
    allocator = MooncakeHostMemAllocator()
    n = 256 << 10
    ptr = allocator.alloc(n)
    assert ptr != 0 and ptr % 4096 == 0
    assert ctypes.string_at(ptr, 16) == bytes(16)  # zeroed
    s = MooncakeDistributedStore()
    assert s.setup_dummy(0, 16 << 20, real.attach) == 0
    try:
        assert s.alloc_from_mem_pool(4096) == 0  # mem_pool_size 0: nothing to hand out
        assert s.register_buffer(ptr, n) == 0
        ctypes.memset(ptr, 0x5A, n)
        assert s.put_from(key, ptr, n) == 0
        ctypes.memset(ptr, 0, n)
        assert s.get_into(key, ptr, n) == n
        assert ctypes.string_at(ptr, n) == b"\x5a" * n
        assert s.unregister_buffer(ptr) == 0
    finally:
        s.remove_all(force=True)
        s.close()
    assert allocator.free(ptr) == 0
    assert allocator.free(ptr) == INVALID_PARAMS


def test_two_dummies_share_objects_and_a_closed_real_client_frees_them(master, key):
    real = RealClient(master.addr)
    a, b = MooncakeDistributedStore(), MooncakeDistributedStore()
    try:
        assert a.setup_dummy(0, 16 << 20, real.attach) == 0
        assert b.setup_dummy(0, 16 << 20, real.attach) == 0
        # On this host's memory (the master may hold other clients' segments too).
        here = ReplicateConfig()
        here.preferred_segment = a.get_hostname()
        assert here.preferred_segment == real.segment
        assert a.put(key, b"shared", here) == 0
        assert b.get(key) == b"shared"
        assert a.setup_dummy(0, 16 << 20, real.attach) == -1010  # already set up
        assert real.stop() == 0  # SIGTERM: unmounts and exits 0
        assert "unmounted" in real.proc.stdout.read()
        # Its memory left the cluster with it.
        assert b.is_exist(key) == 0
    finally:
        real.stop()
        a.close()
        b.close()


def test_setup_dummy_without_a_real_client_fails_fast(master):
    s = MooncakeDistributedStore()
    t0 = time.monotonic()
    assert s.setup_dummy(0, 0, "127.0.0.1:%d" % free_port()) < 0
    # The master is not a real client: it does not speak the attach protocol.
    assert s.setup_dummy(0, 0, master.addr) < 0
    assert time.monotonic() - t0 < 30
    assert s.get_hostname() == "" and s.close() == 0


def test_real_client_flags(master):
    script = shutil.which("mooncake_client")
    cmd = [script] if script else [sys.executable, "-m", "mooncake_rs.client"]
    out = subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--master_server_address" in out.stdout
    bad = subprocess.run(cmd + ["--bogus=1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--bogus" in bad.stderr
    refused = subprocess.run(cmd + ["--enable_offload=true"], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "enable_offload" in refused.stderr
    # No master at the address: exits 1 with the reason, quickly.
    dead = subprocess.run(cmd + ["--master_server_address=127.0.0.1:%d" % free_port(),
                                 "--host=127.0.0.1", "--port=0", "--global_segment_size=16MB"],
                          capture_output=True, text=True, timeout=120)
    assert dead.returncode == 1 and "master" in dead.stderr
