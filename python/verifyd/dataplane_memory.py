"""Memory the daemon knows: a registered region (`RegisteredMemory`) and the cpu backend's host
buffers (`HostBuffer`, a /dev/shm file mapped on both sides)."""
from __future__ import annotations

import fcntl
import mmap
import os
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from .dataplane_library import check
from .dataplane_tensors import nbytes_of
from .errors import invalid_argument

if TYPE_CHECKING:
    from .dataplane import DataPlane

TENSOR_ALIGNMENT = 64


class RegisteredMemory:
    """A region the daemon knows: `region` (its id), `base` (the address of its byte 0 in this
    process: for a CUDA tensor, the base of the allocation holding it), `bytes`, `device` (True
    for device memory). Keeps the registered object alive until released."""

    def __init__(self, plane: "DataPlane", region: int, base: int, nbytes: int, device: bool,
                 keep: Any = None):
        self.plane = plane
        self.region = region
        self.base = base
        self.bytes = nbytes
        self.device = device
        self._keep = keep

    def contains(self, address: int, nbytes: int) -> bool:
        return self.base <= address and address + nbytes <= self.base + self.bytes

    def release(self) -> None:
        """ReleaseExternalMemory (the daemon's lease drops a forgotten one)."""
        if self.region:
            region, self.region = self.region, 0
            self.plane._forget(self)
            check(self.plane._lib.vd_release_memory(self.plane._handle, region, None),
                   "ReleaseExternalMemory")
        self._keep = None

    def __repr__(self) -> str:
        kind = "device" if self.device else "host"
        return f"RegisteredMemory(region={self.region}, base=0x{self.base:x}, bytes={self.bytes}, {kind})"


def _buffer_address(buffer) -> int:
    """The address of a writable buffer's first byte (the view does not outlive the call, so the
    mapping can still be closed)."""
    return np.frombuffer(buffer, dtype=np.uint8).__array_interface__["data"][0]


class HostBuffer:
    """Host memory the cpu backend's daemon can map: a memfd of this process with its pages
    allocated and sealed so that it can never shrink (the daemon maps nothing else: a file that
    shrinks under its mapping would kill it), mapped here and registered as one region through
    /proc/<pid>/fd/<n>. `take(shape, dtype)` hands out 64-byte-aligned numpy views (torch CPU
    tensors with torch=True), one after another; `view(offset, ...)` any range. release()
    releases the region and unmaps; nothing is left in /dev/shm."""

    def __init__(self, plane: "DataPlane", nbytes: int, *, torch: bool = False):
        if nbytes < 1:
            raise invalid_argument(f"bytes = {nbytes} must be >= 1")
        fd = os.memfd_create("verifyd-host-buffer", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, nbytes)
            os.posix_fallocate(fd, 0, nbytes)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._mm: Optional[mmap.mmap] = mmap.mmap(fd, nbytes, mmap.MAP_SHARED,
                                                      mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self.path = f"/proc/{os.getpid()}/fd/{fd}"
        self.memory: Optional[RegisteredMemory] = None
        self.bytes = nbytes
        self.torch = torch
        self._cursor = 0
        self.address = _buffer_address(self._mm)
        try:
            self.memory = plane.register_file(self.path, nbytes, self.address, keep=self)
        except BaseException:
            self._close()
            raise
        finally:
            # The daemon mapped the pages while registering; the mapping here keeps them too.
            os.close(fd)

    @property
    def region(self) -> int:
        return self.memory.region

    def view(self, offset: int, shape: Sequence[int], dtype: str = "bfloat16",
             torch: Optional[bool] = None):
        """A view of [offset, offset + size): dtype "bfloat16" (numpy uint16 bits / torch bf16),
        "float32", "uint32", "int32", "uint8"."""
        np_dtype = {"bfloat16": np.uint16, "float32": np.float32, "uint32": np.uint32,
                    "int32": np.int32, "uint8": np.uint8}.get(dtype)
        if np_dtype is None:
            raise invalid_argument(f"dtype = '{dtype}' must be bfloat16, float32, uint32, int32 "
                                   "or uint8")
        count = int(np.prod(shape)) if len(shape) else 1
        size = count * np.dtype(np_dtype).itemsize
        if offset < 0 or offset + size > self.bytes:
            raise invalid_argument(f"offset = {offset} + {size} bytes must be <= the buffer's "
                                   f"{self.bytes} bytes")
        a = np.frombuffer(self._mm, dtype=np_dtype, count=count, offset=offset).reshape(shape)
        if not (self.torch if torch is None else torch):
            return a
        import torch as _torch  # noqa: PLC0415
        if dtype == "bfloat16":
            return _torch.from_numpy(a.view(np.int16)).view(_torch.bfloat16)
        if dtype == "uint32":
            return _torch.from_numpy(a.view(np.int32))
        return _torch.from_numpy(a)

    def take(self, shape: Sequence[int], dtype: str = "bfloat16", torch: Optional[bool] = None):
        """The next free range, at a multiple of 64 bytes."""
        offset = -(-self._cursor // TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT
        v = self.view(offset, shape, dtype, torch)
        self._cursor = offset + nbytes_of(v)
        return v

    def reset(self) -> None:
        """take() starts again at offset 0 (views handed out earlier stay valid)."""
        self._cursor = 0

    def release(self) -> None:
        try:
            if self.memory is not None:
                self.memory.release()
        finally:
            self.memory = None
            self._close()

    def _close(self) -> None:
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views still export it: the mapping goes with the last view

    def __enter__(self) -> "HostBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
