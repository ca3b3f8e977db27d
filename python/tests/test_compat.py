"""The opt-in ``mooncake.store`` shim: nothing changes unless asked; when asked (install() or
MOONCAKE_RS_AS_MOONCAKE=1), ``import mooncake.store`` is ours, also next to upstream's package,
whose other modules keep loading."""

import os
import subprocess
import sys
import textwrap

import pytest


def run(code, tmp_path, with_upstream, env_on=False):
    env = dict(os.environ)
    env.pop("MOONCAKE_RS_AS_MOONCAKE", None)
    if env_on:
        env["MOONCAKE_RS_AS_MOONCAKE"] = "1"
    if with_upstream:
        # A stand-in for upstream's package: mooncake/store.py and mooncake/engine.py.
        pkg = tmp_path / "mooncake"
        pkg.mkdir(exist_ok=True)
        (pkg / "__init__.py").write_text("UPSTREAM = True\n")
        (pkg / "store.py").write_text("WHO = 'upstream'\n")
        (pkg / "engine.py").write_text("WHO = 'upstream engine'\n")
        env["PYTHONPATH"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.parametrize("with_upstream", [False, True])
def test_nothing_changes_unless_asked(tmp_path, with_upstream):
    code = """
    try:
        import mooncake.store as s
        print(getattr(s, "WHO", "ours"))
    except ImportError:
        print("absent")
    """
    assert run(code, tmp_path, with_upstream) == (["upstream"] if with_upstream else ["absent"])


@pytest.mark.parametrize("with_upstream", [False, True])
@pytest.mark.parametrize("how", ["install", "env"])
def test_asked_for_mooncake_store_is_ours(tmp_path, with_upstream, how):
    code = """
    import sys
    if %r == "install":
        import mooncake_rs.compat
        mooncake_rs.compat.install()
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    import mooncake.store, mooncake_rs.store
    print(mooncake.store is mooncake_rs.store)
    print(MooncakeDistributedStore is mooncake_rs.store.MooncakeDistributedStore)
    try:
        import mooncake.engine
        print(mooncake.engine.WHO.replace(" ", "_"))
    except ImportError:
        print("no_engine")
    """ % how
    out = run(code, tmp_path, with_upstream, env_on=(how == "env"))
    assert out[:2] == ["True", "True"]
    assert out[2] == ("upstream_engine" if with_upstream else "no_engine")


def test_install_after_upstream_was_imported_replaces_it_with_a_warning(tmp_path):
    code = """
    import warnings
    import mooncake.store
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import mooncake_rs.compat
        mooncake_rs.compat.install()
    import mooncake, mooncake.store, mooncake_rs.store
    print(mooncake.store is mooncake_rs.store, len(caught) == 1)
    mooncake_rs.compat.uninstall()
    print(mooncake_rs.compat.installed())
    """
    assert run(code, tmp_path, with_upstream=True) == ["True", "True", "False"]
