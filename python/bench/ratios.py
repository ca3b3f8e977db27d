"""Prints, per row of upstream_bench.py's JSON, ours/upstream ops/s and p50 (the ratio > 1 means
we are faster), with the issue's target for the row."""

import json
import sys

TARGETS = {
    ("put", 4096): 1.3, ("get", 4096): 1.3, ("is_exist(hit)", 0): 1.3,
    ("is_exist(miss)", 0): 1.3, ("batch_is_exist", 0): 1.3,
    ("xclient_get", 1 << 20): 2.0, ("xclient_put_from", 1 << 20): 2.0,
    ("put_batch", 65536): 1.5, ("get_batch", 65536): 1.5,
    ("batch_put_from", 65536): 1.5, ("batch_get_into", 65536): 1.5,
}


def load(path):
    with open(path) as f:
        return {(r["case"], r["size"]): r for r in json.load(f)["results"]}


def main():
    up, rs = load(sys.argv[1]), load(sys.argv[2])
    print("%-16s %6s %12s %12s %7s %9s %9s %7s %7s %s" % (
        "case", "value", "upstream/s", "ours/s", "ratio", "up_p50us", "rs_p50us", "target",
        "met", "errs(up/rs)"))
    for k, r in rs.items():
        u = up.get(k)
        if not u:
            continue
        ratio = r["ops_per_s"] / u["ops_per_s"] if u["ops_per_s"] else 0.0
        target = TARGETS.get(k, 1.0)
        size = k[1]
        label = "-" if not size else ("%dMiB" % (size >> 20) if size >= 1 << 20 else "%dKiB" % (size >> 10))
        print("%-16s %6s %12.1f %12.1f %6.2fx %9.1f %9.1f %6.1fx %7s %d/%d" % (
            k[0], label, u["ops_per_s"], r["ops_per_s"], ratio, u["p50_us"], r["p50_us"], target,
            "yes" if ratio >= target else "NO", u["errors"], r["errors"]))


if __name__ == "__main__":
    main()
