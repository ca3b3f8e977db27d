"""Run a mooncake-rs real client: ``python -m mooncake_rs.client [flags]`` (``mooncake_client``).

Takes upstream ``mooncake_client``'s flags: ``--master_server_address``, ``--host``, ``--port``
(50052), ``--global_segment_size``, ``--local_buffer_size``, ``--protocol``, ``--tenant_id``, ...
Contributes ``--global_segment_size`` of this host's memory to the cluster and lets stores in
other processes of the host attach with ``setup_dummy(mem_pool_size, local_buffer_size,
"HOST:PORT")``. Prints ``mooncake_client: attach ADDR segment NAME ...`` once serving; stops
(unmounting its segment) on SIGINT/SIGTERM.
"""

import sys

from mooncake_rs._native import run_real_client


def main(argv=None):
    argv = list(sys.argv if argv is None else argv)
    return run_real_client(argv)


def console_main():
    """Entry point of the ``mooncake_client`` console script."""
    sys.exit(main(["mooncake_client"] + sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
