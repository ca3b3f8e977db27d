"""setup/close/health_check/get_hostname: both forms, sizes, refusals, bad master, re-setup."""

import os
import time

import pytest

from mooncake_rs.store import MooncakeDistributedStore
from conftest import make_store


def test_positional_form_with_human_sizes_and_upstream_extras(master, key):
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", "32 MB", "16MB", "tcp", "", master.addr, None,
                 enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
                 enable_client_http_server=False, client_http_port=9300)
    assert rc == 0
    assert s.health_check() == 0
    host = s.get_hostname()
    assert host.startswith("127.0.0.1:") and int(host.rsplit(":", 1)[1]) > 0
    assert s.put(key, b"v") == 0 and s.get(key) == b"v"
    assert s.close() == 0
    assert s.health_check() == 1


def test_dict_form_with_upstream_keys_and_string_bools(master, key):
    s = MooncakeDistributedStore()
    rc = s.setup({"local_hostname": "127.0.0.1", "metadata_server": "http://127.0.0.1:1/metadata",
                  "global_segment_size": "16MB", "local_buffer_size": 16 << 20,
                  "protocol": "tcp", "rdma_devices": "", "master_server_addr": master.addr,
                  "enable_ssd_offload": False, "ssd_offload_path": "", "tenant_id": "default",
                  "enable_client_http_server": "False", "client_http_port": 9300,
                  "some_unknown_key": "ignored like upstream"})
    assert rc == 0
    assert s.put(key, b"dict") == 0 and s.get(key) == b"dict"
    assert s.close() == 0


def test_percentage_and_bad_sizes_refused(master):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "50%", "16MB", "tcp", "", master.addr) == -600
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": "50%", "master_server_addr": master.addr}) == -600
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "lots", "16MB", "tcp", "", master.addr) == -600
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", -1, "16MB", "tcp", "", master.addr) == -600
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "ucx", "", master.addr) == -600
    assert s.health_check() == 1


def test_zero_segment_is_a_pure_requester(master, store, key):
    s = make_store(master.addr, segment=0)
    try:
        assert s.put(key, b"x" * 1000) == 0  # lands in `store`'s segment
        assert store.get(key) == b"x" * 1000
        assert s.get(key) == b"x" * 1000
    finally:
        s.close()


def test_unknown_or_unsupported_kwargs_raise_typeerror_naming_them(master):
    s = MooncakeDistributedStore()
    args = ("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", master.addr)
    with pytest.raises(TypeError, match="no_such_option"):
        s.setup(*args, no_such_option=1)
    # enable_ssd_offload=True without a directory (nor MOONCAKE_OFFLOAD_FILE_STORAGE_PATH) is a
    # bad value, not a TypeError: the option is supported.
    if not os.environ.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"):
        assert s.setup(*args, enable_ssd_offload=True) == -600
    with pytest.raises(TypeError, match="enable_client_http_server"):
        s.setup(*args, enable_client_http_server="True")
    with pytest.raises(TypeError, match="local_hostname"):
        s.setup(local_hostname=1, metadata_server="P2PHANDSHAKE")
    assert s.health_check() == 1


def test_bad_master_address_fails_fast_with_a_code(master):
    s = MooncakeDistributedStore()
    for addr in ("127.0.0.1:1", "not-a-host-name.invalid:50051", "127.0.0.1"):
        t0 = time.monotonic()
        rc = s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", addr)
        assert rc < 0, addr
        assert time.monotonic() - t0 < 10, addr
    assert s.health_check() == 1
    # Calls on a store whose setup failed fail cleanly.
    assert s.get("k") == b""
    assert s.put("k", b"v") < 0
    assert s.is_exist("k") < 0
    assert s.batch_is_exist(["a", "b"]) == [-1010, -1010]
    assert s.close() == 0


def test_close_and_setup_again(master, key):
    s = make_store(master.addr)
    assert s.put(key, b"first") == 0
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", master.addr) == -1010
    assert s.close() == 0
    assert s.close() == 0
    assert s.get(key) == b""
    assert s.put(key, b"x") == -1010
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", master.addr) == 0
    assert s.health_check() == 0
    # The first segment was unmounted by close, so the object is gone with it.
    assert s.is_exist(key) == 0
    assert s.put(key, b"second") == 0 and s.get(key) == b"second"
    assert s.close() == 0


def test_health_check_reports_a_dead_master(key):
    from conftest import Master
    m = Master()
    s = make_store(m.addr)
    try:
        assert s.health_check() == 0
        m.stop()
        assert s.health_check() == 2
        assert s.put(key, b"v") < 0
        assert s.get(key) == b""
    finally:
        m.stop()
        s.close()


def test_rdma_falls_back_to_tcp_with_a_warning(master, key, caplog):
    s = MooncakeDistributedStore()
    with caplog.at_level("WARNING", logger="mooncake_rs"):
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "rdma", "", master.addr) == 0
    assert any("rdma" in r.getMessage() for r in caplog.records)
    assert s.put(key, b"over tcp") == 0 and s.get(key) == b"over tcp"
    assert s.close() == 0


def test_malformed_tuning_variables_are_named_in_a_warning_and_ignored(master, key, caplog,
                                                                      monkeypatch):
    monkeypatch.setenv("MC_RS_BUSY_POLL_US", "fast")
    monkeypatch.setenv("MC_RS_TRANSPORT", "carrier-pigeon")
    monkeypatch.setenv("MC_RS_IO_THREADS", "-3")
    s = MooncakeDistributedStore()
    with caplog.at_level("WARNING", logger="mooncake_rs"):
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", master.addr) == 0
    messages = " ".join(r.getMessage() for r in caplog.records)
    for name in ("MC_RS_BUSY_POLL_US", "MC_RS_TRANSPORT", "MC_RS_IO_THREADS"):
        assert name in messages, messages
    # The defaults applied: the store works.
    assert s.put(key, b"defaults") == 0 and s.get(key) == b"defaults"
    assert s.close() == 0


@pytest.mark.parametrize("busy_poll_us", [None, "0", "250"])
def test_busy_poll_setting_takes_effect_and_calls_are_served(master, key, caplog, monkeypatch,
                                                             busy_poll_us):
    if busy_poll_us is None:
        monkeypatch.delenv("MC_RS_BUSY_POLL_US", raising=False)
    else:
        monkeypatch.setenv("MC_RS_BUSY_POLL_US", busy_poll_us)
    s = MooncakeDistributedStore()
    assert s._master_caller_reads() == -1
    assert s._master_poll_stats() is None
    with caplog.at_level("WARNING", logger="mooncake_rs"):
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", master.addr) == 0
    assert not any("MC_RS_BUSY_POLL_US" in r.getMessage() for r in caplog.records)
    for i in range(50):
        assert s.put("%s/%d" % (key, i), b"x" * (i + 1)) == 0
        assert s.is_exist("%s/%d" % (key, i)) == 1
        assert s.get("%s/%d" % (key, i)) == b"x" * (i + 1)
    # Polling on (the default, or 250 µs): this thread read its answers itself, spinning first
    # or not; off: never. The default asks before each spin whether the host has a core to
    # spare (either verdict is fine here); 250 µs spins on every call.
    if busy_poll_us != "0":
        # Calls overlapping another call (the heartbeat's) leave the answers to the reader task
        # for 50 ms: go on until a call ran alone (bounded; on a starved machine the heartbeat's
        # calls can overlap ours for a while).
        deadline = time.monotonic() + 30
        while s._master_caller_reads() == 0 and time.monotonic() < deadline:
            assert s.is_exist("%s/0" % key) == 1
    stats = s._master_poll_stats()
    verdicts = stats["spins"] + stats["skipped_host_busy"] + stats["skipped_backing_off"]
    if busy_poll_us == "0":
        assert s._master_caller_reads() == 0
        assert stats == {"caller_reads": 0, "spins": 0, "skipped_host_busy": 0,
                         "skipped_backing_off": 0}
    else:
        assert s._master_caller_reads() > 0 and stats["caller_reads"] > 0
        assert verdicts > 0, stats
        if busy_poll_us == "250":
            assert stats["skipped_host_busy"] == 0 and stats["skipped_backing_off"] == 0, stats
    assert s.close() == 0


def test_setup_config_keyword(master, key):
    a = MooncakeDistributedStore()
    assert a.setup(config={"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                           "global_segment_size": "16 MB", "master_server_addr": master.addr,
                           "tenant_id": "default"}) == 0
    try:
        assert a.put(key, b"v") == 0 and a.get(key) == b"v"
    finally:
        a.remove_all(force=True)
        a.close()


def test_master_that_accepts_but_never_answers_fails_within_seconds():
    import socket
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    addr = "127.0.0.1:%d" % silent.getsockname()[1]
    s = MooncakeDistributedStore()
    try:
        t0 = time.monotonic()
        rc = s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", addr)
        elapsed = time.monotonic() - t0
        assert rc < 0
        assert elapsed < 15, elapsed
        assert s.health_check() == 1
    finally:
        silent.close()
        s.close()


def test_init_all_is_upstreams_one_call_setup(master):
    s = make_store(master.addr)
    try:
        assert s.init_all("tcp", "") == 1  # already set up, as upstream
    finally:
        s.close()
    fresh = MooncakeDistributedStore()
    assert fresh.init_all("ucx", "", 16 << 20) == -600  # refused before connecting
    assert fresh.get_hostname() == ""
