"""Replay of a multi-turn prefix-cache workload through the Python API against a real master,
compared with an ideal LRU of the same capacity.

Sessions are Zipf-popular; each turn of a session extends its chain of blocks (the prompt is the
whole chain so far plus the turn's new blocks). One client replays the turns as fast as it goes:
`get_batch` of the prompt's blocks (the prefix hit is the run of leading blocks found), then a
`put` of every block from the first miss on. The same turn sequence is run through an LRU cache
holding as many blocks as the store's segment, with the same rule. Default master flags (only
the ports are set).

    python python/bench/prefix_replay.py [--turns 6000] [--segment 128MB] [--block 64KB]
        [--sessions 400] [--zipf 1.0] [--lookup get|exist] [--tiered eager|on-evict]
        [-- extra master flags]

`--tiered MODE` runs the replay twice against fresh masters: memory only, with a segment of 1/8
of the working set (the distinct blocks of the replay), then the same segment plus a disk tier
(`setup(enable_ssd_offload=True)`, the master with `--enable_offload`, `MODE` on-evict adding
`--offload_on_evict`) holding the other 7/8 (`MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`; its
directory is a fresh temporary one). It prints both hit rates, the tiered store's against an
ideal LRU of memory + disk blocks, and against the memory-only store.

`--lookup exist` asks `batch_is_exist` first, as SGLang and LMCache do (each hit is held until
the next lookup; upstream holds it for the whole 10 s lease). Needs the mooncake_rs package
(python/run_tests.sh). Prints the hit rates and their ratio.
"""

import argparse
import bisect
import os
import random
import shlex
import sys
import tempfile
import time
from collections import OrderedDict

from churn import percentile, with_store  # same folder

UNITS = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def size_of(text):
    for unit, mult in UNITS.items():
        if text.upper().endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


def turns(args):
    """The replay: one list of block keys (the prompt) per turn."""
    rng = random.Random(args.seed)
    weights = [1.0 / (i + 1) ** args.zipf for i in range(args.sessions)]
    cdf = []
    total = 0.0
    for w in weights:
        total += w
        cdf.append(total)
    length = [0] * args.sessions
    generation = [0] * args.sessions
    for _ in range(args.turns):
        s = bisect.bisect_left(cdf, rng.random() * total)
        length[s] += rng.randint(args.min_new, args.max_new)
        if length[s] > args.max_blocks:
            # The conversation ends; a new one takes the slot.
            generation[s] += 1
            length[s] = rng.randint(args.min_new, args.max_new)
        yield ["s%d.%d/b%d" % (s, generation[s], i) for i in range(length[s])]


def lru_replay(prompts, capacity):
    cache = OrderedDict()
    hits = total = 0
    for prompt in prompts:
        total += len(prompt)
        i = 0
        while i < len(prompt) and prompt[i] in cache:
            cache.move_to_end(prompt[i])
            i += 1
        hits += i
        for key in prompt[i:]:
            if key in cache:
                cache.move_to_end(key)
            else:
                cache[key] = True
                if len(cache) > capacity:
                    cache.popitem(last=False)
    return hits, total


def store_replay(store, prompts, block, lookup):
    value = bytes(range(256)) * (block // 256)
    hits = total = failed = 0
    lat = []
    for prompt in prompts:
        total += len(prompt)
        t0 = time.perf_counter()
        if lookup == "exist":
            found = store.batch_is_exist(prompt)
            i = 0
            while i < len(prompt) and found[i] == 1:
                i += 1
            got = store.get_batch(prompt[:i]) if i else []
            i = next((j for j, v in enumerate(got) if len(v) != block), len(got))
        else:
            got = store.get_batch(prompt)
            i = next((j for j, v in enumerate(got) if len(v) != block), len(got))
        hits += i
        for key in prompt[i:]:
            rc = store.put(key, value)
            if rc not in (0, -705):  # OBJECT_ALREADY_EXISTS: still cached
                failed += 1
        lat.append(time.perf_counter() - t0)
    return hits, total, failed, lat


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=6000)
    ap.add_argument("--sessions", type=int, default=400)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--min-new", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--max-blocks", type=int, default=64)
    ap.add_argument("--segment", default="128MB")
    ap.add_argument("--block", default="64KB")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lookup", choices=["get", "exist"], default="get")
    ap.add_argument("--tiered", choices=["eager", "on-evict"],
                    help="memory = 1/8 of the working set, disk = the rest; compare with memory only")
    ap.add_argument("--master-cmd", default="%s -m mooncake_rs.master" % shlex.quote(sys.executable))
    ap.add_argument("extra", nargs="*", help="extra master flags (after --)")
    args = ap.parse_args()
    block = size_of(args.block)
    prompts = list(turns(args))
    if args.tiered:
        return tiered(args, prompts, block)
    out = replay(args, prompts, block)
    return 0 if out is not None else 1


def replay(args, prompts, block, extra=(), disk_blocks=0, **setup_kwargs):
    """One replay against a fresh master; prints its figures and returns the store's hit rate
    (None when setup failed). The ideal LRU holds the segment's blocks plus `disk_blocks`."""
    segment = size_of(args.segment)

    def workload(store):
        start = time.perf_counter()
        out = store_replay(store, prompts, block, args.lookup)
        return out + (time.perf_counter() - start,)

    result, metrics = with_store(args, "256MB", workload, extra, **setup_kwargs)
    if result is None:
        return None
    hits, total, failed, lat, wall = result

    capacity = segment // block + disk_blocks
    lru_hits, lru_total = lru_replay(prompts, capacity)
    lat.sort()
    ours = hits / max(total, 1)
    ideal = lru_hits / max(lru_total, 1)
    print("turns %d (%d blocks of %d KiB looked up) in %.1f s (%.0f turns/s), lookup %s"
          % (len(prompts), total, block >> 10, wall, len(prompts) / wall, args.lookup))
    print("prefix hit: store %.4f, ideal LRU of %d blocks %.4f, ratio %.3f"
          % (ours, capacity, ideal, ours / ideal if ideal else float("nan")))
    print("failed puts %d; turn latency ms p50 %.2f p99 %.2f"
          % (failed, 1000 * percentile(lat, 50), 1000 * percentile(lat, 99)))
    for name in ("master_evicted_key_count", "master_put_start_inline_evictions_total"):
        print("%s %d" % (name, metrics.get(name, -1)))
    return ours


def tiered(args, prompts, block):
    """Memory only (1/8 of the working set), then memory + disk (the other 7/8)."""
    working = len({key for prompt in prompts for key in prompt})
    memory_blocks = max(working // 8, 1)
    disk_blocks = working - memory_blocks
    args.segment = str(memory_blocks * block)
    print("working set %d blocks of %d KiB: memory %d blocks, disk %d blocks, offload %s"
          % (working, block >> 10, memory_blocks, disk_blocks, args.tiered))
    print("-- memory only")
    alone = replay(args, prompts, block)
    print("-- memory + disk")
    flags = ["--enable_offload=true"]
    if args.tiered == "on-evict":
        flags.append("--offload_on_evict=true")
    os.environ["MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"] = str(disk_blocks * block)
    with tempfile.TemporaryDirectory(prefix="prefix-replay-disk-") as disk:
        both = replay(args, prompts, block, flags, disk_blocks, enable_ssd_offload=True,
                      ssd_offload_path=disk)
    if alone is None or both is None:
        return 1
    print("tiered / memory only: %.2f" % (both / alone if alone else float("nan")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
