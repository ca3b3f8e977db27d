"""Many threads on one store; the GIL is released during I/O."""

import ctypes
import threading
import time

import numpy as np


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
                assert store.put(shared, bytes([t]) * 64) == 0
                assert store.get(k) == bytes([t]) * 100
                v = store.get(shared)
                assert len(v) == 64 and len(set(v)) == 1
                assert store.is_exist(k) == 1
                assert store.put_from(k + "/z", buf.ctypes.data, buf.nbytes) == 0
                assert store.get_into(k + "/z", out.ctypes.data, out.nbytes) == 4096
                assert (out == t).all()
                assert store.batch_is_exist([k, k + "/none"]) == [1, 0]
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


def test_gil_is_released_during_io(store, key):
    """A pure-Python counter keeps running while other threads do store calls."""
    stop = threading.Event()
    ticks = [0]

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    big = bytes(8 << 20)
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        t0 = time.perf_counter()
        before = ticks[0]
        for i in range(5):
            assert store.put("%s/%d" % (key, i), big) == 0
            assert len(store.get("%s/%d" % (key, i))) == len(big)
        elapsed = time.perf_counter() - t0
        during = ticks[0] - before
    finally:
        stop.set()
        spinner.join()
    assert elapsed > 0 and during > 1000, (during, elapsed)
