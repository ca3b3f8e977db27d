"""Serve ``import mooncake.store`` from mooncake_rs, only when asked.

Engines (SGLang, vLLM, LMCache) import upstream's module by name. One opt-in step makes that
import return ``mooncake_rs.store``:

* call ``mooncake_rs.compat.install()`` before the engine imports ``mooncake.store``, or
* set ``MOONCAKE_RS_AS_MOONCAKE=1`` in the environment of the engine's process (the wheel's
  ``mooncake_rs_compat.pth`` calls ``install()`` at interpreter start when it is set).

Nothing happens otherwise, and upstream's package, when installed, keeps working for every
other module: only ``mooncake.store`` is redirected. Without upstream's package a minimal
``mooncake`` package is provided whose ``store`` is ours. ``uninstall()`` undoes it.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings

ENV_VAR = "MOONCAKE_RS_AS_MOONCAKE"
_TARGET = "mooncake.store"


class _StoreLoader(importlib.abc.Loader):
    """Loads ``mooncake.store`` as mooncake_rs.store itself (the same module object)."""

    def create_module(self, spec):
        import mooncake_rs.store as ours

        return ours

    def exec_module(self, module):
        pass


class _ShimPackageLoader(importlib.abc.Loader):
    """An empty ``mooncake`` package, used only when upstream's is not installed."""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = "mooncake_rs standing in for upstream's mooncake package"
        module.__path__ = []


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == _TARGET:
            return importlib.machinery.ModuleSpec(fullname, _StoreLoader())
        if fullname == "mooncake":
            # Upstream's package, when installed, loads as usual (only its .store is ours).
            if importlib.machinery.PathFinder.find_spec("mooncake", path) is not None:
                return None
            return importlib.machinery.ModuleSpec(fullname, _ShimPackageLoader(),
                                                  is_package=True)
        return None


_finder = _Finder()


def installed():
    """True while ``mooncake.store`` is served from mooncake_rs."""
    return _finder in sys.meta_path


def install():
    """Make ``import mooncake.store`` (and ``from mooncake.store import ...``) return
    ``mooncake_rs.store``. Idempotent. If upstream's ``mooncake.store`` was already imported,
    it is replaced in ``sys.modules`` and on the ``mooncake`` package (with a warning: objects
    already created from it stay upstream's)."""
    if not installed():
        sys.meta_path.insert(0, _finder)
    import mooncake_rs.store as ours

    loaded = sys.modules.get(_TARGET)
    if loaded is not None and loaded is not ours:
        warnings.warn("mooncake.store was imported before mooncake_rs.compat.install(); "
                      "replacing it from now on", RuntimeWarning, stacklevel=2)
        sys.modules[_TARGET] = ours
        parent = sys.modules.get("mooncake")
        if parent is not None:
            setattr(parent, "store", ours)
    return ours


def uninstall():
    """Undo ``install()`` for later imports (modules already imported stay as they are)."""
    while _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    import mooncake_rs.store as ours

    if sys.modules.get(_TARGET) is ours:
        del sys.modules[_TARGET]


def _install_from_env():
    """Called by mooncake_rs_compat.pth at interpreter start."""
    if os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes", "on"):
        install()
