"""Raw pointers from Python are checked before anything touches them: an address that is not
mapped, or a size past the end of a registered buffer or of the memory, is refused with -600
(INVALID_PARAMS) instead of killing the process. Each case runs in its own process, so a crash
(SIGSEGV) fails that case and the suite goes on."""

import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
INVALID_PARAMS = -600

PRELUDE = """
import ctypes, sys, uuid
import numpy as np
from mooncake_rs.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
assert s.setup("127.0.0.1", "P2PHANDSHAKE", "16MB", "16MB", "tcp", "", sys.argv[1]) == 0
k = "raw/" + uuid.uuid4().hex
assert s.put(k, b"v" * 4096) == 0
good = np.zeros(4096, dtype=np.uint8)
UNMAPPED = 0x1000  # below vm.mmap_min_addr: never mapped
"""

# name -> (statement printing a result, expected printed value)
CASES = {
    "register_unmapped": ("print(s.register_buffer(UNMAPPED, 4096))", INVALID_PARAMS),
    "register_past_the_mapping": (
        "print(s.register_buffer(good.ctypes.data, 1 << 40))", INVALID_PARAMS),
    "put_from_unmapped": ("print(s.put_from(k + '/new', UNMAPPED, 4096))", INVALID_PARAMS),
    "get_into_unmapped": ("print(s.get_into(k, UNMAPPED, 4096))", INVALID_PARAMS),
    "get_into_size_2_62_registered": (
        "assert s.register_buffer(good.ctypes.data, 4096) == 0\n"
        "print(s.get_into(k, good.ctypes.data, 1 << 62))", INVALID_PARAMS),
    "get_into_size_2_62_unregistered": (
        "print(s.get_into(k, good.ctypes.data, 1 << 62))", INVALID_PARAMS),
    "put_from_past_registration": (
        "assert s.register_buffer(good.ctypes.data, 2048) == 0\n"
        "print(s.put_from(k + '/new', good.ctypes.data, 4096))", INVALID_PARAMS),
    "batch_get_into_fails_only_the_bad_key": (
        "print(s.batch_get_into([k, k], [UNMAPPED, good.ctypes.data], [4096, 4096]) == "
        "[-600, 4096])", True),
    "batch_put_from_fails_only_the_bad_key": (
        "print(s.batch_put_from([k + '/a', k + '/b'], [UNMAPPED, good.ctypes.data], [16, 16]) == "
        "[-600, 0] and s.is_exist(k + '/a') == 0)", True),
    "multi_buffers": (
        "r = s.batch_put_from_multi_buffers([k + '/m1', k + '/m2'], "
        "[[good.ctypes.data, UNMAPPED], [good.ctypes.data]], [[8, 8], [8]])\n"
        "g = s.batch_get_into_multi_buffers([k, k], [[UNMAPPED], [good.ctypes.data]], "
        "[[4096], [4096]])\n"
        "print(r == [-600, 0] and g == [-600, 4096])", True),
    "get_into_ranges": (
        "r = s.get_into_ranges([UNMAPPED, good.ctypes.data], [[k], [k]], [[[0]], [[0]]], "
        "[[[0]], [[0]]], [[[16]], [[16]]])\n"
        "print(r == [[[-600]], [[16]]])", True),
    "metadata_pointer": (
        "print(s.put_from_with_metadata(k + '/md', good.ctypes.data, UNMAPPED, 16, 16))",
        INVALID_PARAMS),
    "upsert_from_unmapped": ("print(s.upsert_from(k, UNMAPPED, 4096))", INVALID_PARAMS),
    "read_only_memory_is_not_written": (
        # A bytes object's buffer is readable; the code of the interpreter is not writable.
        "code = ctypes.cast(ctypes.pythonapi.Py_Initialize, ctypes.c_void_p).value\n"
        "print(s.get_into(k, code, 4096))", INVALID_PARAMS),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_pointers_are_refused_not_crashed(master, name):
    statement, expected = CASES[name]
    script = PRELUDE + statement + "\nassert s.get(k) == b'v' * 4096\nassert s.close() == 0\n"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), master.addr],
                          capture_output=True, text=True, timeout=120, cwd=HERE)
    assert proc.returncode == 0, (
        "the process died (rc %d): %s" % (proc.returncode, proc.stderr[-2000:]))
    assert proc.stdout.strip().splitlines()[-1] == str(expected), proc.stdout
