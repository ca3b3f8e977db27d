"""Access control from Python: a master started with --auth_token_file refuses setup() without
the token or with a wrong one (ILLEGAL_CLIENT, -601), and stores set up with MC_AUTH_TOKEN (or
MC_AUTH_TOKEN_FILE) put and get through each other's data ports, over shared memory and TCP,
which serve only the capabilities the master handed out."""

import pytest

from conftest import Master, make_store
from mooncake_rs.store import MooncakeDistributedStore

SECRET = "9b1e4c7a2f5d8e3b6a0c9d2e5f8a1b4c"
ILLEGAL_CLIENT = -601


@pytest.fixture
def token_master(tmp_path):
    path = tmp_path / "token"
    path.write_text(SECRET + "\n")
    m = Master("--auth_token_file=%s" % path)
    yield m, path
    m.stop()


@pytest.fixture
def no_token_env(monkeypatch):
    monkeypatch.delenv("MC_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("MC_AUTH_TOKEN_FILE", raising=False)
    return monkeypatch


def test_setup_without_the_token_or_with_a_wrong_one_is_refused(token_master, no_token_env):
    m, _ = token_master
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", m.addr) == ILLEGAL_CLIENT
    no_token_env.setenv("MC_AUTH_TOKEN", "0123456789abcdef-not-it")
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", m.addr) == ILLEGAL_CLIENT
    # A token too short to be one is refused before anything is sent.
    no_token_env.setenv("MC_AUTH_TOKEN", "short")
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", m.addr) != 0


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_stores_with_the_token_put_and_get_through_each_others_data_ports(
        token_master, no_token_env, transport):
    m, path = token_master
    no_token_env.setenv("MC_RS_TRANSPORT", transport)
    no_token_env.setenv("MC_AUTH_TOKEN", SECRET)
    owner = make_store(m.addr, segment="32MB")
    # Pure requesters: every object lands in the owner's segment, so each put and get crosses
    # the owner's data port.
    writer = make_store(m.addr, segment=0)
    no_token_env.delenv("MC_AUTH_TOKEN")
    no_token_env.setenv("MC_AUTH_TOKEN_FILE", str(path))
    reader = make_store(m.addr, segment=0)
    try:
        value = bytes(range(256)) * 4096  # 1 MiB
        assert writer.put("auth/k", value) == 0
        assert reader.get("auth/k") == value
        ep = reader.get_replica_desc("auth/k")[0].get_memory_descriptor().buffer_descriptor
        assert owner.get_hostname() in ep.transport_endpoint
        assert "cap=" in ep.transport_endpoint
        # get_replica_desc took a read lease: remove past it.
        assert reader.remove("auth/k", force=True) == 0
    finally:
        for s in (reader, writer, owner):
            s.close()
