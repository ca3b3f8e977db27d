"""mooncake-rs for Python.

``mooncake_rs.store`` is a drop-in for upstream Mooncake's ``mooncake.store``:
``from mooncake_rs.store import MooncakeDistributedStore, ReplicateConfig``.
``python -m mooncake_rs.master --rpc_port=50051`` runs a master.
"""

from mooncake_rs._native import error_name

__all__ = ["error_name"]
__version__ = "0.1.0"
