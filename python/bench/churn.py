"""Churn of mixed sizes into a full store, through the Python API against a real master.

One client puts fresh keys of 4 KiB..16 MiB (log-uniform: weighted toward small) into a store of
one 512 MiB segment as fast as it can, so the store turns over many times a second and every put
past the first fill needs eviction. Reports failed puts (by return code), put latency
percentiles and the master's eviction counters. Default master flags (only the ports are set).

    python python/bench/churn.py [--seconds 30] [--segment 512MB] [--seed 1]
        [--master-cmd "python -m mooncake_rs.master"] [-- extra master flags]

Needs the mooncake_rs package (python/run_tests.sh builds it into python/.venv). Prints one
summary line per figure; exits 1 when no put succeeded.
"""

import argparse
import math
import random
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter

from mooncake_rs.store import MooncakeDistributedStore

MIN_SIZE = 4 << 10
MAX_SIZE = 16 << 20


class Master:
    """A master process on 127.0.0.1 with free ports, stopped by its PID."""

    def __init__(self, cmd, extra):
        argv = cmd + ["--port=0", "--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1",
                      "--metrics_port=0"] + extra
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        self.addr = self.metrics = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("mooncake master listening: rpc "):
                words = line.split()
                self.addr, self.metrics = words[4], words[6]
                break
        if self.addr is None:
            self.stop()
            raise RuntimeError("master did not start")

    def scrape(self):
        """The master's /metrics counters whose names mention eviction."""
        url = self.metrics.rstrip("/") + "/metrics"
        if not url.startswith("http"):
            url = "http://" + url
        out = {}
        with urllib.request.urlopen(url, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("master_") and "evict" in line:
                    name, _, value = line.partition(" ")
                    out[name] = float(value)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def with_store(args, local_buffer, workload, extra=(), **setup_kwargs):
    """Starts a master (`args.master_cmd` with `args.extra` and `extra`), sets up one store with
    a segment of `args.segment` (and `setup_kwargs`), runs `workload(store)`, scrapes the
    master's eviction counters and stops both. Returns (the workload's result, the counters),
    the result None when setup failed."""
    master = Master(shlex.split(args.master_cmd), list(args.extra) + list(extra))
    store = MooncakeDistributedStore()
    try:
        rc = store.setup("127.0.0.1", "P2PHANDSHAKE", args.segment, local_buffer, "tcp", "",
                         master.addr, **setup_kwargs)
        if rc != 0:
            print("setup failed: %d" % rc, file=sys.stderr)
            return None, {}
        result = workload(store)
        return result, master.scrape()
    finally:
        store.close()
        master.stop()


def sizes(rng):
    """Log-uniform sizes in [MIN_SIZE, MAX_SIZE], 4 KiB aligned."""
    lo, hi = math.log(MIN_SIZE), math.log(MAX_SIZE)
    while True:
        size = int(math.exp(rng.uniform(lo, hi)))
        yield max(MIN_SIZE, size - size % 4096)


def percentile(sorted_values, p):
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, int(math.ceil(p / 100.0 * len(sorted_values))) - 1)
    return sorted_values[max(i, 0)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--segment", default="512MB")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--master-cmd", default="%s -m mooncake_rs.master" % shlex.quote(sys.executable))
    ap.add_argument("extra", nargs="*", help="extra master flags (after --)")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    payload = memoryview(bytes(rng.getrandbits(8) for _ in range(4096)) * (MAX_SIZE // 4096))
    gen = sizes(rng)
    codes = Counter()
    lat = []

    def workload(store):
        put_bytes = 0
        start = time.perf_counter()
        end = start + args.seconds
        i = 0
        while time.perf_counter() < end:
            size = next(gen)
            t0 = time.perf_counter()
            rc = store.put("churn/%d" % i, payload[:size])
            lat.append(time.perf_counter() - t0)
            codes[rc] += 1
            if rc == 0:
                put_bytes += size
            i += 1
        return i, time.perf_counter() - start, put_bytes

    result, metrics = with_store(args, "64MB", workload)
    if result is None:
        return 1
    i, wall, put_bytes = result
    lat.sort()
    failed = i - codes[0]
    print("puts %d in %.1f s (%.0f/s, %.0f MiB/s stored, store %s)"
          % (i, wall, i / wall, put_bytes / wall / (1 << 20), args.segment))
    print("failed puts %d (%.3f%%) by code %s"
          % (failed, 100.0 * failed / max(i, 1),
             dict((k, v) for k, v in codes.items() if k != 0)))
    print("put latency ms: p50 %.2f p90 %.2f p99 %.2f p99.9 %.2f max %.2f"
          % tuple(1000 * percentile(lat, p) for p in (50, 90, 99, 99.9, 100)))
    for name in sorted(metrics):
        if not name.endswith("_mem"):
            print("%s %d" % (name, metrics[name]))
    return 0 if codes[0] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
