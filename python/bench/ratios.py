"""Per row of upstream_bench.py: ours vs upstream in ops/s (ratio > 1 = we are faster), with the
issue's target for the row. Each input is the bench's --json output or its printed table.

usage: ratios.py OURS UPSTREAM_SAME_RUN [UPSTREAM_REFERENCE]
"""

import json
import sys

TARGETS = {
    ("put", "4KiB"): 1.3, ("get", "4KiB"): 1.3, ("is_exist(hit)", "-"): 1.3,
    ("is_exist(miss)", "-"): 1.3, ("batch_is_exist", "-"): 1.3,
    ("xclient_get", "1MiB"): 2.0, ("xclient_put_from", "1MiB"): 2.0,
    ("put_batch", "64KiB"): 1.5, ("get_batch", "64KiB"): 1.5,
    ("batch_put_from", "64KiB"): 1.5, ("batch_get_into", "64KiB"): 1.5,
}


def label(size):
    if not size:
        return "-"
    if size >= 1 << 20:
        return "%dMiB" % (size >> 20)
    return "%dKiB" % (size >> 10)


def load(path):
    rows = {}
    if path.endswith(".json"):
        with open(path) as f:
            for r in json.load(f)["results"]:
                rows[(r["case"], label(r["size"]))] = (r["ops_per_s"], r["p50_us"], r["errors"])
        return rows
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 11 and parts[3].startswith("x") and parts[4].isdigit():
                rows[(parts[0], parts[2])] = (float(parts[6]), float(parts[9]), int(parts[5]))
    return rows


def main():
    ours, same = load(sys.argv[1]), load(sys.argv[2])
    ref = load(sys.argv[3]) if len(sys.argv) > 3 else {}
    head = "| case | value | ours ops/s | upstream ops/s (same run) | ratio | ours p50 µs | upstream p50 µs | target | met |"
    if ref:
        head += " upstream reference ops/s | ratio vs reference |"
    print(head)
    print("|" + "|".join(["---"] * (head.count("|") - 1)) + "|")
    for k, (ops, p50, errs) in ours.items():
        if k not in same:
            continue
        u_ops, u_p50, u_errs = same[k]
        ratio = ops / u_ops if u_ops else 0.0
        target = TARGETS.get(k, 1.0)
        row = "| %s | %s | %.0f | %.0f | %.2fx | %.1f | %.1f | %.1fx | %s |" % (
            k[0], k[1], ops, u_ops, ratio, p50, u_p50, target, "yes" if ratio >= target else "**no**")
        if errs or u_errs:
            row += " errors %d/%d" % (errs, u_errs)
        if ref:
            r = ref.get(k)
            row += " %s | %s |" % (("%.0f" % r[0], "%.2fx" % (ops / r[0])) if r else ("-", "-"))
        print(row)


if __name__ == "__main__":
    main()
