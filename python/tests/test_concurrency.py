"""Many threads on one store; the GIL is released during I/O."""

import ctypes
import threading
import time

import numpy as np

from conftest import make_store


def test_threads_hammering_one_store(store, key):
    errors = []
    threads = 8
    rounds = 40
    barrier = threading.Barrier(threads)

    def worker(t):
        try:
            barrier.wait(10)
            buf = np.full(4096, t, dtype=np.uint8)
            out = np.zeros(4096, dtype=np.uint8)
            for r in range(rounds):
                k = "%s/%d/%d" % (key, t, r)
                shared = "%s/shared/%d" % (key, r)  # every thread writes this one
                assert store.put(k, bytes([t]) * 100) == 0
                # 0, or -703 (REPLICA_IS_NOT_READY) while another thread's write of it is
                # still in flight (nothing written by this call).
                assert store.put(shared, bytes([t]) * 64) in (0, -703)
                assert store.get(k) == bytes([t]) * 100
                v = store.get(shared)
                # b"" while another thread's write of it is still in flight; otherwise one
                # writer's value, whole.
                assert v == b"" or (len(v) == 64 and len(set(v)) == 1), v
                assert store.is_exist(k) == 1
                assert store.put_from(k + "/z", buf.ctypes.data, buf.nbytes) == 0
                assert store.get_into(k + "/z", out.ctypes.data, out.nbytes) == 4096
                assert (out == t).all()
                assert store.batch_is_exist([k, k + "/none"]) == [1, 0]
                # Batch reads; a value of 64 KiB or more makes the call retake the GIL mid-call
                # to create its bytes object while the other threads run Python code.
                if r % 8 == 0:
                    assert store.put(k + "/big", bytes([t]) * 70_001) == 0
                    got = store.get_batch([k + "/big", k, k + "/none"])
                    assert got == [bytes([t]) * 70_001, bytes([t]) * 100, b""], t
                got = store.get_batch([k, k + "/none", k + "/z"])
                assert got[:2] == [bytes([t]) * 100, b""] and got[2] == bytes(buf), t
                out[:] = 0
                half = out.nbytes // 2
                rcs = store.batch_get_into([k + "/z", k + "/none", k], [out.ctypes.data,
                                           out.ctypes.data + half, out.ctypes.data + half],
                                           [half, half, half])
                assert rcs == [-600, -704, 100], rcs
                assert (out[half:half + 100] == t).all() and (out[:half] == 0).all()
        except Exception as e:  # noqa
            errors.append((t, repr(e)))

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts)
    assert errors == []
    # Every shared key holds one writer's value, whole.
    for r in range(rounds):
        v = store.get("%s/shared/%d" % (key, r))
        assert len(v) == 64 and len(set(v)) == 1


def test_gil_is_released_during_io(master, key):
    """Another Python thread runs *during* a long store call: stamps taken by a spinning thread
    fall strictly inside the call's time window (with the GIL held there would be none)."""
    # local_buffer_size caps objects in unregistered memory (as upstream's staging arena).
    store = make_store(master.addr, segment="128MB", local_buffer="64MB")
    try:
        _gil_is_released_during_io(store, key)
    finally:
        store.remove_all(force=True)
        store.close()


def _gil_is_released_during_io(store, key):
    value = bytes(48 << 20)
    assert store.put(key, value) == 0
    stop = threading.Event()
    stamps = []

    def spin():
        n = 0
        while not stop.is_set():
            n += 1
            if n % 200 == 0:
                stamps.append(time.perf_counter())

    spinner = threading.Thread(target=spin)
    spinner.start()
    windows = []
    try:
        for _ in range(4):
            t0 = time.perf_counter()
            assert len(store.get(key)) == len(value)
            t1 = time.perf_counter()
            windows.append((t0, t1))
    finally:
        stop.set()
        spinner.join()
    margin = 0.006  # > the interpreter's 5 ms switch interval
    inside = sum(1 for s in stamps for (t0, t1) in windows if t0 + margin < s < t1 - margin)
    long_enough = sum(max(0.0, t1 - t0 - 2 * margin) for t0, t1 in windows)
    assert long_enough > 0.01, "calls too short to tell: %r" % windows
    assert inside >= 5, (inside, windows)
