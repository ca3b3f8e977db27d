"""Run a mooncake-rs master: ``python -m mooncake_rs.master [flags]``.

Takes ``mooncake master``'s flags (upstream's names: ``--rpc_port``, ``--rpc_address``,
``--metrics_port``, ``--default_kv_lease_ttl``, ...). Prints
``mooncake master listening: rpc ADDR metrics URL`` once serving; stops on SIGINT/SIGTERM.
"""

import sys

from mooncake_rs._native import run_master


def main(argv=None):
    argv = list(sys.argv if argv is None else argv)
    return run_master(argv)


if __name__ == "__main__":
    sys.exit(main())
