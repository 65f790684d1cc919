"""The co-located data plane of SPEC §3.1 from Python: device tensors, a channel per scheduler
thread, stream-ordered Verify. **Not available yet**: the C++ side (the data-plane issue) is not
built. This module is the Python half of the design in plans/0013-python-package.md: a thin ctypes
loader of a C-ABI shared library, `libverifyd_dataplane.so`, so that one build serves every Python
version (3.11 here, 3.12 on the GPU hosts) and other languages, with no compiled Python extension.

What the library will export (C ABI, all functions return 0 or a negative error whose text
`vd_last_error()` gives; the gRPC control plane — registration answers, errors in full — goes
through the normal verifyd.Client):

    int  vd_abi_version(void);
    int  vd_channel_open(const char* target, const char* channel_token, vd_channel** out);
    void vd_channel_close(vd_channel*);
    int  vd_register_device_buffer(vd_channel*, void* device_ptr, uint64_t bytes, int device,
                                   uint64_t* region_id);      // CUDA IPC handle made inside
    int  vd_verify_enqueue(vd_channel*, const vd_verify_desc*, void* cuda_stream);
         // writes the descriptor into the channel's ring, then enqueues on `cuda_stream`:
         // signal "q ready" (device-memory flag) and wait "out ready"; no CPU blocking.
    int  vd_commit_enqueue(vd_channel*, uint64_t sequence_id, const int32_t* path, uint32_t k);
    int  vd_poll_errors(vd_channel*, char* buffer, uint64_t bytes);  // failed calls' reasons

Python side (to come with the library): `register(tensor)` takes a torch CUDA tensor or anything
with `__cuda_array_interface__` / `__dlpack__` (pointer, bytes, device only; nothing crosses the
host); `Channel.verify(layer, sequences, q, tree_kv, out, lse=None, stream=None)` names the
registered ranges and passes `torch.cuda.current_stream().cuda_stream` when stream is None.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any, Optional, Tuple

__all__ = ["LIBRARY_NAME", "ABI_VERSION", "DataPlaneUnavailable", "available", "load",
           "device_pointer", "Channel"]

LIBRARY_NAME = "libverifyd_dataplane.so"
ABI_VERSION = 1
ENV_LIBRARY = "VERIFYD_DATAPLANE_LIB"  # an explicit path to the library


class DataPlaneUnavailable(NotImplementedError):
    """The data-plane library is missing or incompatible; use the gRPC / shared-memory paths."""


_lib: Optional[ctypes.CDLL] = None
_why: Optional[str] = None


def _candidates():
    if os.environ.get(ENV_LIBRARY):
        yield os.environ[ENV_LIBRARY]
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, LIBRARY_NAME)  # installed next to the package
    found = ctypes.util.find_library("verifyd_dataplane")
    if found:
        yield found
    yield LIBRARY_NAME  # the loader's own search path (LD_LIBRARY_PATH, ldconfig)


def _try_load() -> Tuple[Optional[ctypes.CDLL], Optional[str]]:
    reasons = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            reasons.append(f"{path}: {e}")
            continue
        try:
            lib.vd_abi_version.restype = ctypes.c_int
            version = lib.vd_abi_version()
        except AttributeError:
            return None, f"{path} has no vd_abi_version"
        if version != ABI_VERSION:
            return None, f"{path} has ABI {version}, this package speaks {ABI_VERSION}"
        return lib, None
    return None, ("the verifyd data-plane library is not built yet (SPEC §3.1; "
                  f"{LIBRARY_NAME} not found: {'; '.join(reasons[-1:])})")


def available() -> bool:
    """Whether the device data plane can be used in this process."""
    return load(raise_if_missing=False) is not None


def why_unavailable() -> Optional[str]:
    load(raise_if_missing=False)
    return _why


def load(raise_if_missing: bool = True) -> Optional[ctypes.CDLL]:
    global _lib, _why
    if _lib is None and _why is None:
        _lib, _why = _try_load()
    if _lib is None and raise_if_missing:
        raise DataPlaneUnavailable(_why)
    return _lib


def device_pointer(tensor: Any) -> Tuple[int, int, int]:
    """(device pointer, bytes, device index) of a CUDA tensor: torch, or anything exposing
    `__cuda_array_interface__`. Never touches the data."""
    if hasattr(tensor, "data_ptr") and hasattr(tensor, "is_cuda"):
        if not tensor.is_cuda or not tensor.is_contiguous():
            raise ValueError("need a contiguous CUDA tensor")
        return tensor.data_ptr(), tensor.numel() * tensor.element_size(), tensor.device.index
    cai = getattr(tensor, "__cuda_array_interface__", None)
    if cai is None:
        raise ValueError("need a torch CUDA tensor or an object with __cuda_array_interface__")
    import numpy as np  # noqa: PLC0415
    nbytes = int(np.prod(cai["shape"])) * np.dtype(cai["typestr"]).itemsize
    return int(cai["data"][0]), nbytes, -1


class Channel:
    """A scheduler thread's channel to one daemon (SPEC §3.1). Raises DataPlaneUnavailable until
    libverifyd_dataplane.so exists."""

    def __init__(self, client, token: str = ""):
        self._lib = load()
        raise DataPlaneUnavailable("the data-plane channel is not implemented yet (plans/0013)")

    def register(self, tensor: Any):  # pragma: no cover - until the library exists
        raise DataPlaneUnavailable("register: not implemented yet")

    def verify(self, layer, sequences, q, tree_kv, out, lse=None, stream=None):  # pragma: no cover
        raise DataPlaneUnavailable("stream-ordered verify: not implemented yet")
