"""Run a mooncake-rs master: ``python -m mooncake_rs.master [flags]`` (``mooncake_master``).

Takes ``mooncake master``'s flags (upstream's names: ``--rpc_port``, ``--rpc_address``,
``--metrics_port``, ``--default_kv_lease_ttl``, ...). Prints
``mooncake master listening: rpc ADDR metrics URL`` once serving; stops on SIGINT/SIGTERM.
"""

import sys

from mooncake_rs._native import run_master


def main(argv=None):
    argv = list(sys.argv if argv is None else argv)
    return run_master(argv)


def console_main():
    """Entry point of the ``mooncake_master`` console script."""
    sys.exit(main(["mooncake_master"] + sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
