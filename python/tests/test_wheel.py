"""The built wheel alone is enough: installed into a fresh venv (no Rust toolchain involved), it
gives the client, ``mooncake_master`` and ``mooncake_client`` console scripts, and a put/get
against its own master works. Needs the wheel that run_tests.sh builds (scripts/build-wheel):
``MOONCAKE_RS_WHEEL=path``; skipped, saying why, without it."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

WHEEL = os.environ.get("MOONCAKE_RS_WHEEL", "")


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    if not WHEEL:
        pytest.skip("MOONCAKE_RS_WHEEL is not set: run python/run_tests.sh (it builds the wheel)")
    assert os.path.isfile(WHEEL), WHEEL
    root = tmp_path_factory.mktemp("wheel-venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    py = os.path.join(root, "bin", "python")
    # --no-index: nothing but the wheel itself is installed (it has no dependencies).
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", WHEEL], check=True,
                   timeout=300)
    return root


def test_the_wheel_is_abi3_manylinux_and_has_no_rdma_or_rust_runtime(venv):
    name = os.path.basename(WHEEL)
    assert "-cp39-abi3-" in name, name
    assert "manylinux" in name, name
    with zipfile.ZipFile(WHEEL) as z:
        names = z.namelist()
    assert "mooncake_rs_compat.pth" in names
    [native] = [n for n in names if n.startswith("mooncake_rs/_native") and n.endswith(".so")]
    out = subprocess.run(["ldd", os.path.join(
        venv, "lib", "python%d.%d" % sys.version_info[:2], "site-packages", native)],
        capture_output=True, text=True, timeout=60).stdout
    for forbidden in ("ibverbs", "rdmacm", "libstd-", "librust"):
        assert forbidden not in out, out
    assert "not found" not in out, out


def test_fresh_venv_runs_a_master_and_puts_and_gets(venv):
    bin_dir = os.path.join(venv, "bin")
    for script in ("mooncake_master", "mooncake_client"):
        assert os.path.isfile(os.path.join(bin_dir, script)), script
    help_out = subprocess.run([os.path.join(bin_dir, "mooncake_client"), "--help"],
                              capture_output=True, text=True, timeout=60)
    assert help_out.returncode == 0 and "--master_server_address" in help_out.stdout
    master = subprocess.Popen(
        [os.path.join(bin_dir, "mooncake_master"), "--port=0", "--rpc_address=127.0.0.1",
         "--metrics_host=127.0.0.1", "--metrics_port=0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(venv))
    try:
        addr = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = master.stdout.readline()
            if not line:
                break
            if line.startswith("mooncake master listening: rpc "):
                addr = line.split()[4]
                break
        assert addr, master.stderr.read()[-2000:]
        code = textwrap.dedent("""
            import sys
            from mooncake_rs.store import MooncakeDistributedStore
            s = MooncakeDistributedStore()
            assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", sys.argv[1]) == 0
            assert s.put("wheel/key", b"from the wheel") == 0
            assert s.get("wheel/key") == b"from the wheel"
            assert s.close() == 0
            print("ok")
        """)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        out = subprocess.run([os.path.join(bin_dir, "python"), "-c", code, addr],
                             capture_output=True, text=True, timeout=120, cwd=str(venv), env=env)
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    finally:
        master.send_signal(signal.SIGTERM)
        try:
            master.wait(20)
        except subprocess.TimeoutExpired:
            master.kill()
            master.wait(5)
