"""Upstream Mooncake's ``mooncake.store`` API on the mooncake-rs client.

Engines switch by changing one import::

    from mooncake_rs.store import MooncakeDistributedStore, ReplicateConfig

Every method that does I/O releases the GIL; one store may be shared by many threads; the class
may be subclassed. Return codes are upstream's (0 / negative ``ErrorCode``); see docs/python.md for
the few deliberate differences.
"""

import ctypes

from mooncake_rs import _native
from mooncake_rs._native import (
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    MooncakeHostMemAllocator,
    QueryTaskResponse,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    TaskStatus,
    TaskType,
)

# Upstream exports its task enums' values at module level too.
REPLICA_COPY = TaskType.REPLICA_COPY
REPLICA_MOVE = TaskType.REPLICA_MOVE
PENDING = TaskStatus.PENDING
SUCCESS = TaskStatus.SUCCESS

__all__ = [
    "BufferHandle",
    "Descriptor",
    "DiskDescriptor",
    "MemoryDescriptor",
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "PENDING",
    "QueryTaskResponse",
    "REPLICA_COPY",
    "REPLICA_MOVE",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "ReplicateConfig",
    "SUCCESS",
    "SoftPinAction",
    "TaskStatus",
    "TaskType",
]


class BufferHandle:
    """Bytes of one object returned by ``get_buffer``/``batch_get_buffer``.

    Supports the buffer protocol (``memoryview(h)``, ``numpy.frombuffer(h, ...)``,
    ``torch.frombuffer(h, ...)``), ``len(h)``, and upstream's ``h.ptr()`` / ``h.size()``. The memory
    is owned by the handle and freed when the last reference (including memoryviews) goes away.
    Each handle is an instance of a ctypes ``c_ubyte`` array subclass of its own length.
    """

    __slots__ = ()

    def ptr(self):
        """Address of the first byte (an int)."""
        return ctypes.addressof(self)

    def size(self):
        """Length in bytes."""
        return len(self)

    def __repr__(self):
        return "<BufferHandle size=%d ptr=0x%x>" % (len(self), ctypes.addressof(self))


_handle_types = {}


def _handle_type(n):
    t = _handle_types.get(n)
    if t is None:
        if len(_handle_types) >= 256:
            _handle_types.clear()
        t = type("BufferHandle", (BufferHandle, ctypes.c_ubyte * n), {})
        _handle_types[n] = t
    return t


def _wrap(native):
    if native is None:
        return None
    handle = _handle_type(native.size()).from_address(native.ptr())
    # The ctypes array does not own the memory: keep its owner alive with it.
    handle._owner = native
    return handle


class MooncakeDistributedStore(_native.MooncakeDistributedStore):
    __doc__ = _native.MooncakeDistributedStore.__doc__

    def get_buffer(self, key):
        """The object's bytes as a BufferHandle, or None when the key is missing."""
        return _wrap(self._get_buffer_native(key))

    def batch_get_buffer(self, keys):
        """One BufferHandle (or None for a missing key) per key, in order."""
        return [_wrap(n) for n in self._batch_get_buffer_native(list(keys))]
