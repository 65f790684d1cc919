"""Shared-memory regions for tensors (plans/0010-shared-memory-tensors.md), mapped into this
process: the Python twin of client/shared_memory_region.* and the layout of client/shared_calls.cc.

The daemon creates every region (Client.create_shared_memory) and answers its POSIX shared-memory
name; this module opens it O_RDWR (no O_CREAT, no O_TRUNC: a region never changes size) under
/dev/shm and mmaps it. The client must run as the daemon's user on the same host (mode 0600).
`multiprocessing.shared_memory` is not used: its resource tracker would unlink the daemon's object
when this process exits.

One region serves one call at a time: the daemon reads q/tree_kv and writes out/lse in place while
the call runs. Views (numpy arrays, torch tensors) returned by `ndarray` point into the mapping and
stay valid until the region is reused; after `release()` the mapping is closed as soon as no view
remains (a view keeps it alive).
"""
from __future__ import annotations

import errno
import mmap
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

import grpc
import numpy as np

from .errors import invalid_argument, make_error
from .tensors import ROW, V_DIM

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

ALIGNMENT = 64
SHM_DIR = "/dev/shm"

__all__ = ["ALIGNMENT", "align", "SharedVerifyLayout", "shared_verify_layout",
           "shared_verify_bytes", "SharedMemoryRegion"]


def align(offset: int) -> int:
    return (offset + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass(frozen=True)
class SharedVerifyLayout:
    """Where one Verify's tensors sit in a region (byte offsets, each a multiple of 64):
    q bf16 [sum Q, H, 576] | tree_kv bf16 [sum Q, 576] | out bf16 [sum Q, H, 512] | lse fp32
    [sum Q, H]; `end` is the first byte after them. Same as SharedVerifyLayoutAt in C++."""
    total_q: int
    heads: int
    return_lse: bool
    q: int
    tree_kv: int
    out: int
    lse: int
    end: int


def shared_verify_layout(base: int, total_q: int, heads: int,
                         return_lse: bool = False) -> SharedVerifyLayout:
    rows = total_q * heads
    q = align(base)
    tree_kv = align(q + rows * ROW * 2)
    out = align(tree_kv + total_q * ROW * 2)
    lse = align(out + rows * V_DIM * 2)
    end = lse + rows * 4 if return_lse else lse
    return SharedVerifyLayout(total_q, heads, return_lse, q, tree_kv, out, lse, end)


def shared_verify_bytes(total_q: int, heads: int, return_lse: bool = False) -> int:
    """Region bytes one Verify of this size needs at offset 0."""
    return shared_verify_layout(0, total_q, heads, return_lse).end


def _shm_file(path: str) -> str:
    name = path.lstrip("/")
    if not name or "/" in name:
        raise invalid_argument(f"shared-memory path '{path}' is not a POSIX shm name",
                               "CreateSharedMemory")
    return os.path.join(SHM_DIR, name)


class SharedMemoryRegion:
    """A region the daemon created, mapped here. Use as a context manager or call release()."""

    def __init__(self, owner: Optional["Client"], region: str, path: str, size: int):
        if not region or not path or size <= 0:
            raise invalid_argument(f"region '{region}' path '{path}' of {size} bytes: region, "
                                   "path and bytes must all be set", "CreateSharedMemory")
        file = _shm_file(path)
        try:
            fd = os.open(file, os.O_RDWR)
        except OSError as e:
            code = (grpc.StatusCode.PERMISSION_DENIED if e.errno == errno.EACCES
                    else grpc.StatusCode.NOT_FOUND)
            raise make_error(code, f"shm_open '{path}': {e.strerror} (the client must run as "
                             "the daemon's user on the same host)", "CreateSharedMemory") from e
        try:
            st = os.fstat(fd)
            if st.st_size < size:  # mapping past the end would SIGBUS on first touch
                raise make_error(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"shared memory '{path}' is smaller than the {size} bytes "
                                 "announced", "CreateSharedMemory")
            self._mm: Optional[mmap.mmap] = mmap.mmap(fd, size, mmap.MAP_SHARED,
                                                      mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._owner = owner
        self.region = region
        self.path = path
        self.size = size

    # -- mapping ---------------------------------------------------------------------------------
    @property
    def mapped(self) -> bool:
        return self._mm is not None

    @property
    def buffer(self) -> mmap.mmap:
        if self._mm is None:
            raise make_error(grpc.StatusCode.FAILED_PRECONDITION, "the region is not mapped")
        return self._mm

    def check_range(self, offset: int, length: int, field: str = "range") -> None:
        if self._mm is None:
            raise make_error(grpc.StatusCode.FAILED_PRECONDITION, "the region is not mapped")
        if offset % ALIGNMENT != 0:
            raise invalid_argument(f"{field}: offset = {offset} must be a multiple of {ALIGNMENT}")
        if offset < 0 or length < 0 or offset > self.size or length > self.size - offset:
            raise invalid_argument(f"{field}: offset = {offset} + length = {length} must be <= "
                                   f"the region's {self.size} bytes")

    def ndarray(self, offset: int, dtype, shape: Sequence[int]) -> np.ndarray:
        """A numpy view of [offset, offset + nbytes) (writable; no copy)."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape)) if len(shape) else 1
        self.check_range(offset, count * dtype.itemsize)
        return np.frombuffer(self.buffer, dtype=dtype, count=count, offset=offset).reshape(shape)

    def tensor(self, offset: int, shape: Sequence[int], dtype: str = "bfloat16"):
        """A torch CPU view (bfloat16 or float32) of a range; writes go straight to the region."""
        import torch  # noqa: PLC0415
        if dtype == "bfloat16":
            return torch.from_numpy(self.ndarray(offset, np.int16, shape)).view(torch.bfloat16)
        return torch.from_numpy(self.ndarray(offset, np.float32, shape))

    def ref(self, offset: int, length: int):
        """A SharedMemoryRef message for [offset, offset + length)."""
        from .v1 import verifyd_pb2 as pb  # noqa: PLC0415
        self.check_range(offset, length)
        return pb.SharedMemoryRef(region=self.region, offset=offset, length=length)

    # -- life cycle ------------------------------------------------------------------------------
    def release(self, timeout: Optional[float] = None) -> None:
        """Tells the daemon (ReleaseSharedMemory), then unmaps. Unmapped even when the call
        fails (the daemon's lease drops the region then); the call's error is raised."""
        if self._mm is None:
            return
        error = None
        if self._owner is not None:
            try:
                self._owner.release_shared_memory(self.region, timeout=timeout)
            except Exception as e:  # noqa: BLE001 - raised after unmapping
                error = e
        self._unmap()
        self._owner = None
        if error is not None:
            raise error

    def _unmap(self) -> None:
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views still export it: the mapping goes when the last view does

    def __enter__(self) -> "SharedMemoryRegion":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        try:
            if self._mm is not None and self._owner is not None:
                self.release()
        except Exception:  # noqa: BLE001 - best effort at garbage collection
            pass

    def __repr__(self) -> str:
        return f"SharedMemoryRegion(region={self.region!r}, path={self.path!r}, size={self.size})"
