"""The co-located data plane of SPEC §3.1 from Python: registered memory, a channel per scheduler
thread, stream-ordered Verify (plans/0013, plans/0017).

The work is done by `libverifyd_dataplane.so` (client/c_api/verifyd_dataplane.h), loaded with
ctypes: one build serves every Python version (3.11 here, 3.12 on the GPU hosts) and other
languages, with no compiled Python extension. Where it is looked for, in order: the path in
$VERIFYD_DATAPLANE_LIB, next to this package, the repository's build tree (build/client/c_api/),
the loader's search path (ldconfig, LD_LIBRARY_PATH). Where it is found changes nothing it
computes. Missing or of another ABI: `DataPlaneUnavailable` saying which and why.

    plane = client.data_plane()                    # one per Client (its client_id owns regions)
    # cuda backend: any torch CUDA tensor / __cuda_array_interface__ / DLPack kDLCUDA object
    mem = plane.register(pool)                     # CUDA IPC handle made inside the library
    # cpu backend: memory the daemon can map = a sealed memfd of this process
    buf = plane.host_buffer(8 << 20)               # created, mapped, registered
    q = buf.take((n, H, 576), "bfloat16")          # numpy uint16 bits (torch=True: torch bf16)
    flags = buf.take((2,), "uint32")
    ch = plane.open_channel()
    ch.verify(0, [(7, [-1, 0, 0])], q, tree_kv, out, ready=(flags[0:1], step),
              done=(flags[1:2], step))             # returns the descriptor id
    ch.result()                                    # next completion; raises VerifydError

Stream order (CUDA): `verify` enqueues the descriptor (a host action) and then, on `stream`
(default `torch.cuda.current_stream().cuda_stream`), "write ready = value" after the stream's
earlier work and "wait until done >= value" before its later work — the CPU never blocks; the
daemon's stream waits for ready and writes done after out/lse. On host memory (cpu backend) the
host is the stream: `verify` stores ready = value after the descriptor is published, and the
caller waits with `result()` (or reads done).

Failures: every descriptor completes. A refused or failed Verify has NaN outputs and its done
flag written (the scheduler never hangs); its completion carries the gRPC code and the daemon's
message, the same as the gRPC Verify's for the same mistake. `Completion.raise_for_status()` /
`Channel.result()` raise the VerifydError subclass of that code.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import mmap
import os
from collections import deque
from dataclasses import dataclass
from typing import (Any, Callable, Deque, Dict, Iterable, List, NamedTuple, Optional, Sequence,
                    Tuple, Union)

import grpc
import numpy as np

from .errors import VerifydError, invalid_argument, make_error
from .tensors import ROW, V_DIM, is_torch

__all__ = ["LIBRARY_NAME", "ABI_VERSION", "ENV_LIBRARY", "DataPlaneUnavailable", "available",
           "why_unavailable", "load", "has_cuda", "device_pointer", "DataPlane",
           "RegisteredMemory", "HostBuffer", "Channel", "Completion", "Flag", "Ref"]

LIBRARY_NAME = "libverifyd_dataplane.so"
ABI_VERSION = 1
ENV_LIBRARY = "VERIFYD_DATAPLANE_LIB"  # an explicit path to the library
MESSAGE_BYTES = 256
TENSOR_ALIGNMENT = 64
FLAG_ALIGNMENT = 4


class DataPlaneUnavailable(NotImplementedError):
    """The data-plane library is missing or incompatible (the message says which and where it was
    looked for); the gRPC and shared-memory paths still work."""


# -- the C ABI (client/c_api/verifyd_dataplane.h) ------------------------------------------------
class _TensorRef(ctypes.Structure):
    _fields_ = [("region", ctypes.c_uint64), ("offset", ctypes.c_uint64)]


class _Flag(ctypes.Structure):
    _fields_ = [("region", ctypes.c_uint64), ("offset", ctypes.c_uint64),
                ("value", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


_NO_TENSOR, _NO_FLAG = _TensorRef(0, 0), _Flag(0, 0, 0, 0)


class _Sequence(ctypes.Structure):
    _fields_ = [("sequence_id", ctypes.c_uint64), ("parents", ctypes.POINTER(ctypes.c_int32)),
                ("num_parents", ctypes.c_uint32), ("has_commit", ctypes.c_uint32),
                ("commit_path", ctypes.POINTER(ctypes.c_int32)),
                ("commit_length", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


class _VerifyDesc(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("layer", ctypes.c_uint32),
                ("num_sequences", ctypes.c_uint32), ("sequences", ctypes.POINTER(_Sequence)),
                ("q", _TensorRef), ("tree_kv", _TensorRef), ("out", _TensorRef),
                ("lse", _TensorRef), ("return_lse", ctypes.c_uint32),
                ("has_softmax_scale", ctypes.c_uint32), ("softmax_scale", ctypes.c_float),
                ("reserved", ctypes.c_uint32), ("ready", _Flag), ("done", _Flag)]


class _Completion(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("committed_length", ctypes.c_uint64),
                ("code", ctypes.c_int32), ("reserved", ctypes.c_uint32),
                ("message", ctypes.c_char * MESSAGE_BYTES)]


_P = ctypes.c_void_p
_U64 = ctypes.c_uint64
_U32 = ctypes.c_uint32
_SIGNATURES = {
    "vd_abi_version": (ctypes.c_int, []),
    "vd_has_cuda": (ctypes.c_int, []),
    "vd_last_error_code": (ctypes.c_int, []),
    "vd_last_error": (ctypes.c_char_p, []),
    "vd_connect": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                  ctypes.c_double, ctypes.POINTER(_P)]),
    "vd_disconnect": (None, [_P]),
    "vd_client_id": (ctypes.c_char_p, [_P]),
    "vd_register_file": (ctypes.c_int, [_P, ctypes.c_char_p, _U64, _U32,
                                        ctypes.POINTER(_U64)]),
    "vd_register_cuda": (ctypes.c_int, [_P, _U64, _U64, ctypes.POINTER(_U64),
                                        ctypes.POINTER(_U64)]),
    "vd_release_memory": (ctypes.c_int, [_P, _U64, ctypes.POINTER(_U64)]),
    "vd_channel_open": (ctypes.c_int, [_P, _U32, ctypes.POINTER(_P)]),
    "vd_channel_close": (ctypes.c_int, [_P]),
    "vd_channel_id": (_U64, [_P]),
    "vd_channel_entries": (_U32, [_P]),
    "vd_channel_in_flight": (_U64, [_P]),
    "vd_channel_heartbeat": (None, [_P]),
    "vd_enqueue_verify": (ctypes.c_int, [_P, ctypes.POINTER(_VerifyDesc)]),
    "vd_enqueue_commit": (ctypes.c_int, [_P, _U64, _U64, ctypes.POINTER(ctypes.c_int32), _U32]),
    "vd_poll_completions": (ctypes.c_int, [_P, ctypes.POINTER(_Completion), _U32]),
    "vd_wait_completion": (ctypes.c_int, [_P, ctypes.c_double, ctypes.POINTER(_Completion)]),
    "vd_stream_write_value32": (ctypes.c_int, [_P, _U64, _U32]),
    "vd_stream_wait_value32": (ctypes.c_int, [_P, _U64, _U32]),
}

_lib: Optional[ctypes.CDLL] = None
_why: Optional[str] = None
_CODES = {s.value[0]: s for s in grpc.StatusCode}


def _candidates() -> List[str]:
    found = []
    if os.environ.get(ENV_LIBRARY):
        return [os.environ[ENV_LIBRARY]]  # an explicit choice is the only one tried
    here = os.path.dirname(os.path.abspath(__file__))
    found.append(os.path.join(here, LIBRARY_NAME))  # installed next to the package
    repo = os.path.dirname(os.path.dirname(here))
    found.append(os.path.join(repo, "build", "client", "c_api", LIBRARY_NAME))  # the build tree
    system = ctypes.util.find_library("verifyd_dataplane")
    if system:
        found.append(system)
    found.append(LIBRARY_NAME)  # the loader's own search path (LD_LIBRARY_PATH)
    return found


def _try_load() -> Tuple[Optional[ctypes.CDLL], Optional[str]]:
    reasons = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            reasons.append(f"{path}: no such file")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            reasons.append(f"{path}: {e}")
            continue
        try:
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype = restype
                fn.argtypes = argtypes
        except AttributeError as e:
            return None, f"{path} is not libverifyd_dataplane ABI {ABI_VERSION}: {e}"
        version = lib.vd_abi_version()
        if version != ABI_VERSION:
            return None, (f"{path} has ABI version {version}; this package speaks "
                          f"{ABI_VERSION}: install the library and the package from one build")
        return lib, None
    return None, (f"the verifyd data-plane library {LIBRARY_NAME} was not found (build target "
                  f"verifyd_dataplane, or set ${ENV_LIBRARY} to its path); looked at: "
                  + "; ".join(reasons))


def load(raise_if_missing: bool = True) -> Optional[ctypes.CDLL]:
    """The loaded library; DataPlaneUnavailable (or None) when it cannot be had."""
    global _lib, _why
    if _lib is None and _why is None:
        _lib, _why = _try_load()
    if _lib is None and raise_if_missing:
        raise DataPlaneUnavailable(_why)
    return _lib


def _reset_for_tests() -> None:
    global _lib, _why
    _lib, _why = None, None


def available() -> bool:
    """Whether the data plane can be used in this process."""
    return load(raise_if_missing=False) is not None


def why_unavailable() -> Optional[str]:
    load(raise_if_missing=False)
    return _why


def has_cuda() -> bool:
    """Whether the library was built with CUDA (device registration, stream order)."""
    lib = load(raise_if_missing=False)
    return bool(lib is not None and lib.vd_has_cuda())


def _check(rc: int, method: str) -> int:
    if rc >= 0:
        return rc
    lib = load()
    code = _CODES.get(lib.vd_last_error_code(), grpc.StatusCode.UNKNOWN)
    raise make_error(code, (lib.vd_last_error() or b"").decode("utf-8", "replace"), method)


# -- memory --------------------------------------------------------------------------------------
def _nbytes(x: Any) -> int:
    if is_torch(x):
        return x.numel() * x.element_size()
    return int(np.asarray(x).nbytes)


def host_pointer(x: Any) -> Tuple[int, int]:
    """(address, bytes) of a C-contiguous numpy array or torch CPU tensor."""
    if is_torch(x):
        if x.is_cuda or not x.is_contiguous():
            raise invalid_argument("need a contiguous CPU tensor")
        return x.data_ptr(), _nbytes(x)
    if not isinstance(x, np.ndarray) or not x.flags["C_CONTIGUOUS"]:
        raise invalid_argument("need a C-contiguous numpy array or torch tensor")
    return x.__array_interface__["data"][0], x.nbytes


def device_pointer(tensor: Any, name: str = "tensor", method: str = "") -> Tuple[int, int, int]:
    """(device pointer, bytes, device index or -1) of a contiguous CUDA tensor: torch, anything
    exposing `__cuda_array_interface__`, or a DLPack kDLCUDA object (`__dlpack__`). Never touches
    the data."""
    if is_torch(tensor):
        if not tensor.is_cuda or not tensor.is_contiguous():
            raise invalid_argument("need a contiguous CUDA tensor")
        return tensor.data_ptr(), _nbytes(tensor), tensor.device.index
    cai = getattr(tensor, "__cuda_array_interface__", None)
    if cai is None:
        if _uses_dlpack(tensor):
            t = _dlpack_tensor(tensor, name, method)
            if not t.device:
                raise invalid_argument(f"{name} is host memory (DLPack device type "
                                       f"{_dl_device_name(t.device_type)}); need a CUDA tensor",
                                       method)
            return t.address, t.nbytes, t.device_id
        raise invalid_argument("need a torch CUDA tensor, an object with "
                               "__cuda_array_interface__ or a DLPack kDLCUDA tensor")
    if cai.get("strides") not in (None,):
        expected = []
        step = np.dtype(cai["typestr"]).itemsize
        for n in reversed(cai["shape"]):
            expected.insert(0, step)
            step *= n
        if tuple(cai["strides"]) != tuple(expected):
            raise invalid_argument("__cuda_array_interface__ object is not C-contiguous")
    nbytes = int(np.prod(cai["shape"])) * np.dtype(cai["typestr"]).itemsize
    return int(cai["data"][0]), nbytes, -1


# -- DLPack (the Python array API standard's data interchange) ----------------------------------
# The last way in, for objects that are neither torch tensors nor numpy arrays and have no
# __cuda_array_interface__ (JAX, TensorFlow, wrappers): the capsule of `__dlpack__()` is read with
# ctypes. Its layout is dlpack.h's unversioned DLManagedTensor in a "dltensor" capsule: what a
# producer returns when the consumer passes no `max_version` (the versioned struct, in a
# "dltensor_versioned" capsule, goes only to consumers that ask for it).
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST = 1, 2, 3  # DLDeviceType; 3 is pinned host memory
_DL_DEVICE_NAMES = {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan",
                    8: "kDLMetal", 9: "kDLVPI", 10: "kDLROCM", 11: "kDLROCMHost",
                    12: "kDLExtDev", 13: "kDLCUDAManaged", 14: "kDLOneAPI", 15: "kDLWebGPU",
                    16: "kDLHexagon"}
# (DLDataTypeCode, bits) -> name: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4. uint16 is bf16's
# bits, as numpy's uint16 arrays are; int32/uint32 are the flag words.
_DL_DTYPES = {(4, 16): "bfloat16", (1, 16): "uint16", (2, 32): "float32", (0, 32): "int32",
              (1, 32): "uint32"}
_DLTENSOR = b"dltensor"
# Own function objects (pythonapi[...] makes a fresh one; attribute access would share, and set
# the types of, the one every other ctypes user of pythonapi gets). PyDLL: called with the GIL.
_capsule_is_valid = ctypes.pythonapi["PyCapsule_IsValid"]
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi["PyCapsule_GetPointer"]
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class DLPackTensor(NamedTuple):
    """What an object's DLPack capsule says (read by _dlpack_tensor)."""
    address: int             # data + byte_offset
    nbytes: int
    shape: Tuple[int, ...]
    dtype: str               # a _DL_DTYPES name, or "code C bits B" for any other
    device: bool             # CUDA memory (kDLCUDA); False: host (kDLCPU, kDLCUDAHost)
    device_type: int
    device_id: int


def _dl_device_name(device_type: int) -> str:
    return f"{device_type} ({_DL_DEVICE_NAMES.get(device_type, 'unknown')})"


def _uses_dlpack(x: Any) -> bool:
    """Whether x is reached through DLPack: it has `__dlpack__` and none of the other ways in
    (torch, numpy, `__cuda_array_interface__`) applies."""
    return hasattr(x, "__dlpack__") and not is_torch(x) and not isinstance(x, np.ndarray) and \
        not hasattr(x, "__cuda_array_interface__")


def _dlpack_device(x: Any, name: str, method: str = "") -> Tuple[int, int]:
    """`__dlpack_device__()`, refusing devices other than the CPU, CUDA and CUDA host memory."""
    query = getattr(x, "__dlpack_device__", None)
    if query is None:
        raise invalid_argument(f"{name} has __dlpack__ but no __dlpack_device__", method)
    device_type, device_id = query()
    device_type, device_id = int(device_type), int(device_id)
    if device_type not in (_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST):
        raise invalid_argument(f"{name} is on DLPack device type {_dl_device_name(device_type)}; "
                               "the data plane takes kDLCPU (1), kDLCUDA (2) and kDLCUDAHost (3) "
                               "memory", method)
    return device_type, device_id


def _dlpack_tensor(x: Any, name: str = "tensor", method: str = "") -> DLPackTensor:
    """Address, bytes, shape, dtype and device of a DLPack object, from its capsule; refuses
    (InvalidArgument naming `name`) other devices and non-row-major layouts. The data is not
    touched. The caller keeps `x` for as long as the address is used, as for any other kind: the
    producer owns the memory, and the capsule is gone when this returns."""
    expected_type, _ = _dlpack_device(x, name, method)  # first, as the standard's consumers do
    # stream=None (the default): for CPU memory the only value allowed; for CUDA "the legacy
    # default stream". Nothing here reads or writes the data: the daemon's accesses are ordered by
    # the ready/done flags on verify()'s stream, not by this export.
    try:
        capsule = x.__dlpack__(stream=None)
    except TypeError:  # a __dlpack__ without the stream keyword (older or hand-written producers)
        capsule = x.__dlpack__()
    if not _capsule_is_valid(capsule, _DLTENSOR):
        raise invalid_argument(f"{name}.__dlpack__() returned {capsule!r}; need an unconsumed "
                               "\"dltensor\" capsule", method)
    # The capsule is read, not consumed. Consuming it (renaming it "used_dltensor") is how a
    # consumer takes the DLManagedTensor over for an array of its own that views the memory, and
    # it makes calling the deleter the consumer's job. Nothing made here views the memory after
    # this call: the address goes to the daemon while the caller keeps `x`, and the producer keeps
    # owning the memory. So the capsule keeps its name, and the destructor that the protocol has
    # producers give every capsule (it calls the deleter while the name is still "dltensor")
    # frees it exactly once when the last reference goes: at the return below, or with the
    # exception of a refusal. Consuming and calling the deleter here would free it no better, and
    # would need a foreign function pointer called through ctypes (PYFUNCTYPE: a CFUNCTYPE call
    # drops the GIL that deleters which Py_DECREF need) and a try/finally around every refusal.
    t = _DLManagedTensor.from_address(_capsule_pointer(capsule, _DLTENSOR)).dl_tensor
    device_type, device_id = int(t.device.device_type), int(t.device.device_id)
    if device_type not in (_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST):
        raise invalid_argument(f"{name} is on DLPack device type {_dl_device_name(device_type)}; "
                               "the data plane takes kDLCPU (1), kDLCUDA (2) and kDLCUDAHost (3) "
                               "memory", method)
    if device_type != expected_type:
        raise invalid_argument(f"{name}: __dlpack_device__() says device type "
                               f"{_dl_device_name(expected_type)}, its capsule "
                               f"{_dl_device_name(device_type)}", method)
    ndim = int(t.ndim)
    if ndim < 0 or (ndim and not t.shape):
        raise invalid_argument(f"{name}: DLPack tensor with ndim = {ndim} and no shape", method)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    code, bits, lanes = int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes)
    if lanes != 1 or bits == 0 or bits % 8:
        raise invalid_argument(f"{name} has DLPack dtype code {code}, bits {bits}, lanes {lanes}; "
                               "need whole bytes and one lane", method)
    if t.strides and 0 not in shape:  # NULL strides: compact row-major
        strides = tuple(int(t.strides[i]) for i in range(ndim))
        step = 1
        for n, s in zip(reversed(shape), reversed(strides)):
            if n != 1 and s != step:  # a dimension of 1 may have any stride
                raise invalid_argument(f"{name} is not C-contiguous (DLPack shape {list(shape)}, "
                                       f"strides {list(strides)} in elements)", method)
            step *= n
    count = 1
    for n in shape:
        count *= n
    return DLPackTensor((t.data or 0) + int(t.byte_offset), count * bits // 8, shape,
                        _DL_DTYPES.get((code, bits), f"code {code} bits {bits}"),
                        device_type == _KDL_CUDA, device_type, device_id)


def _is_cuda(x: Any, name: str = "tensor", method: str = "") -> bool:
    if is_torch(x):
        return bool(x.is_cuda)
    if hasattr(x, "__cuda_array_interface__"):
        return True
    if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__"):
        return False
    return _dlpack_device(x, name, method)[0] == _KDL_CUDA


def _pointer(x: Any, name: str = "tensor", method: str = "") -> Tuple[int, int, bool]:
    """(address, bytes, on the device) of a tensor/array."""
    if _is_cuda(x, name, method):
        p, n, _ = device_pointer(x, name, method)
        return p, n, True
    if _uses_dlpack(x):  # host memory through DLPack
        t = _dlpack_tensor(x, name, method)
        return t.address, t.nbytes, t.device
    p, n = host_pointer(x)
    return p, n, False


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
            _check(self.plane._lib.vd_release_memory(self.plane._handle, region, None),
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
        self._cursor = offset + _nbytes(v)
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


# -- descriptors ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ref:
    """A tensor named by region + byte offset (the descriptor's form)."""
    region: int
    offset: int


@dataclass(frozen=True)
class Flag:
    """A uint32 word in registered memory and the value it must reach (ready) or is set to
    (done). `word`: a tensor/array whose first element is the word, or a Ref."""
    word: Any
    value: int


@dataclass
class Completion:
    id: int
    code: grpc.StatusCode
    message: str
    committed_length: int = 0
    method: str = ""

    @property
    def ok(self) -> bool:
        return self.code == grpc.StatusCode.OK

    def error(self) -> Optional[VerifydError]:
        return None if self.ok else make_error(self.code, self.message, self.method)

    def raise_for_status(self) -> "Completion":
        if not self.ok:
            raise self.error()
        return self


_TORCH_TYPE: Dict[type, bool] = {}


def _torch_tensor(x: Any) -> bool:
    """is_torch with the answer kept per type (the hot path asks it several times a call)."""
    t = type(x)
    known = _TORCH_TYPE.get(t)
    if known is None:
        known = _TORCH_TYPE[t] = is_torch(x)
    return known


def _flag_parts(x: Any, name: str) -> Tuple[Any, int]:
    if isinstance(x, tuple) and len(x) == 2:
        return x[0], int(x[1])
    if isinstance(x, Flag):
        return x.word, int(x.value)
    raise invalid_argument(f"{name} must be a Flag or a (word, value) tuple", "Verify")


def _shape(x: Any, name: str = "tensor") -> Tuple[int, ...]:
    shape = getattr(x, "shape", None)
    if shape is None:
        if _uses_dlpack(x):
            return _dlpack_tensor(x, name, "Verify").shape
        shape = x.__cuda_array_interface__["shape"]
    return tuple(shape)


# (torch.Tensor, torch.bfloat16, torch.float32) once torch has been seen: the hot path compares
# against them without importing torch (which a numpy-only scheduler may not have).
_TORCH_CLASSES: Optional[Tuple[Any, Any, Any]] = None


def _dtype_ok(x: Any, bf16: bool, name: str = "tensor") -> bool:
    global _TORCH_CLASSES
    if _torch_tensor(x):
        if _TORCH_CLASSES is None:
            import torch  # noqa: PLC0415
            _TORCH_CLASSES = (torch.Tensor, torch.bfloat16, torch.float32)
        return x.dtype is _TORCH_CLASSES[1 if bf16 else 2]
    if isinstance(x, np.ndarray):
        return x.dtype == (np.uint16 if bf16 else np.float32)
    if _uses_dlpack(x):
        dtype = _dlpack_tensor(x, name, "Verify").dtype
        return dtype in ("bfloat16", "uint16") if bf16 else dtype == "float32"
    t = np.dtype(x.__cuda_array_interface__["typestr"])
    if bf16:
        return t == np.uint16 or (t.itemsize == 2 and t.kind == "V")
    return t == np.float32


class DataPlane:
    """A Client's data plane: its own C++ client inside the library, with the Python Client's
    client_id, so regions and channels belong to that Client (x-verifyd-client)."""

    def __init__(self, target: str, client_id: str, *, admin_token: str = "",
                 timeout: float = 30.0):
        self._lib = load()
        handle = _P()
        _check(self._lib.vd_connect(target.encode(), client_id.encode(), admin_token.encode(),
                                    float(timeout), ctypes.byref(handle)), "Connect")
        self._handle = handle
        self.target = target
        self.client_id = client_id
        self._memory: List[RegisteredMemory] = []
        self._refs: Dict[Tuple[int, int, bool], Tuple[Ref, int, bool]] = {}  # resolved tensors
        self.heads: Optional[int] = None  # the daemon's H, for shape checks (set by the Client)

    # -- registration ----------------------------------------------------------------------------
    def register_file(self, path: str, nbytes: int, address: int = 0, *, device: int = 0,
                      keep: Any = None) -> RegisteredMemory:
        """Registers host memory (cpu backend) mapped at `address` in this process: `path` is
        /proc/<this pid>/fd/<n>, a memfd sealed against shrinking with its pages allocated."""
        region = _U64()
        _check(self._lib.vd_register_file(self._handle, path.encode(), int(nbytes), int(device),
                                          ctypes.byref(region)), "RegisterExternalMemory")
        m = RegisteredMemory(self, region.value, address, int(nbytes), False, keep)
        self._memory.append(m)
        return m

    def register(self, tensor: Any) -> RegisteredMemory:
        """Registers device memory: a torch CUDA tensor, an object with
        `__cuda_array_interface__`, or a DLPack object (`__dlpack__` + `__dlpack_device__`) on
        kDLCUDA; contiguous. The CUDA IPC handle of its allocation is made inside the library;
        nothing crosses the host. The region is the CUDA allocation holding the tensor,
        from its base (what the daemon's cudaIpcOpenMemHandle maps), so register one tensor per
        allocation — a pool the engine carves its buffers from — and keep it alive while
        registered; a tensor inside an already registered range gets that region back. Host
        memory must come from host_buffer()."""
        if isinstance(tensor, HostBuffer):
            return tensor.memory
        method = "RegisterExternalMemory"
        if not _is_cuda(tensor, "tensor", method):
            raise invalid_argument("register() takes device memory (a CUDA tensor, "
                                   "__cuda_array_interface__ or DLPack kDLCUDA); host memory for "
                                   "the cpu backend comes from host_buffer(bytes)", method)
        pointer, nbytes, _ = device_pointer(tensor, "tensor", method)
        for m in self._memory:  # inside a registered allocation already: the same region
            if m.device and m.contains(pointer, nbytes):
                return m
        region, base = _U64(), _U64()
        _check(self._lib.vd_register_cuda(self._handle, pointer, nbytes, ctypes.byref(region),
                                          ctypes.byref(base)), "RegisterExternalMemory")
        m = RegisteredMemory(self, region.value, base.value, pointer + nbytes - base.value, True,
                             tensor)
        self._memory.append(m)
        return m

    def host_buffer(self, nbytes: int, *, torch: bool = False) -> HostBuffer:
        """A registered sealed memfd (the cpu backend's "device memory")."""
        return HostBuffer(self, nbytes, torch=torch)

    def _forget(self, m: RegisteredMemory) -> None:
        self._memory = [x for x in self._memory if x is not m]
        self._refs.clear()

    def ref(self, x: Any, name: str, method: str = "Verify") -> Tuple[Ref, int, bool]:
        """(Ref, address, on device) of a tensor inside registered memory."""
        if isinstance(x, Ref):
            return x, 0, False
        return self._resolve(x, name, method)

    def _resolve(self, x: Any, name: str, method: str = "Verify") -> Tuple[Ref, int, bool]:
        if _torch_tensor(x):  # the common case, without building __array_interface__ dicts
            if not x.is_contiguous():
                raise invalid_argument(f"{name} must be contiguous", method)
            key = (x.data_ptr(), x.numel() * x.element_size(), bool(x.is_cuda))
        elif isinstance(x, Ref):
            return x, 0, False
        else:
            key = _pointer(x, name, method)
        hit = self._refs.get(key)
        if hit is not None:
            return hit
        address, nbytes, on_device = key
        for m in self._memory:
            if m.device == on_device and m.contains(address, nbytes):
                found = (Ref(m.region, address - m.base), address, on_device)
                if len(self._refs) > 4096:
                    self._refs.clear()
                self._refs[key] = found
                return found
        where = "device" if on_device else "host"
        raise invalid_argument(f"{name} ({where} address 0x{address:x}, {nbytes} bytes) is not "
                               "inside a buffer registered by this client (register() / "
                               "host_buffer())", method)

    # -- channels --------------------------------------------------------------------------------
    def open_channel(self, entries: int = 64) -> "Channel":
        return Channel(self, entries)

    def close(self) -> None:
        if self._handle:
            for m in list(self._memory):
                try:
                    m.release()
                except VerifydError:
                    pass
            self._lib.vd_disconnect(self._handle)
            self._handle = _P()

    def __enter__(self) -> "DataPlane":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _int32_array(values: Sequence[int]):
    return (ctypes.c_int32 * max(len(values), 1))(*[int(v) for v in values])


_INT32_P = ctypes.POINTER(ctypes.c_int32)


class PreparedSequences:
    """A batch's sequences (ids, parents, riding commits) copied once into the descriptor's C
    form. Channel.prepare() makes one; verify() takes it in place of the list, so the layers of a
    step do not rebuild it (the adapter prepares the first layer's, with the riding commits, and
    the later layers'). Immutable: later changes to the source lists do not reach it."""

    __slots__ = ("sequences", "total_q", "_array", "_pointer", "_keep")

    def __init__(self, sequences: Iterable[Any]):
        from .client import _as_sequence  # noqa: PLC0415 - client imports this module
        seqs = [_as_sequence(s) for s in sequences]
        self.sequences = seqs
        self.total_q = sum(len(s.parents) for s in seqs)
        keep = []
        array = (_Sequence * max(len(seqs), 1))()
        for i, s in enumerate(seqs):
            parents = _int32_array(s.parents)
            keep.append(parents)
            c = array[i]
            c.sequence_id = int(s.sequence_id)
            c.parents = ctypes.cast(parents, _INT32_P)
            c.num_parents = len(s.parents)
            if s.commit_previous is not None:
                path = _int32_array(s.commit_previous)
                keep.append(path)
                c.has_commit = 1
                c.commit_path = ctypes.cast(path, _INT32_P)
                c.commit_length = len(s.commit_previous)
        self._array = array
        self._pointer = ctypes.cast(array, ctypes.POINTER(_Sequence))
        self._keep = keep

    def __len__(self) -> int:
        return len(self.sequences)


class Channel:
    """One scheduler thread's channel (not thread-safe, as the C++ Channel). Descriptor ids are
    assigned here (1, 2, ...) unless given."""

    def __init__(self, plane: DataPlane, entries: int = 64):
        self.plane = plane
        self._lib = plane._lib
        handle = _P()
        _check(self._lib.vd_channel_open(plane._handle, int(entries), ctypes.byref(handle)),
               "OpenChannel")
        self._handle = handle
        self._descriptor = _VerifyDesc()
        self._next_id = 1
        self._methods: Dict[int, str] = {}
        self._done: Dict[int, Completion] = {}   # read while waiting for another id
        self._order: Deque[int] = deque()

    @property
    def id(self) -> int:
        return int(self._lib.vd_channel_id(self._handle))

    @property
    def entries(self) -> int:
        return int(self._lib.vd_channel_entries(self._handle))

    @property
    def in_flight(self) -> int:
        return int(self._lib.vd_channel_in_flight(self._handle)) + len(self._done)

    def _take_id(self, given: Optional[int]) -> int:
        if given is not None:
            return int(given)
        i = self._next_id
        self._next_id += 1
        return i

    # -- Verify ----------------------------------------------------------------------------------
    def prepare(self, sequences: Iterable[Any]) -> PreparedSequences:
        """The batch in descriptor form, for several verify() calls (the layers of a step)."""
        return PreparedSequences(sequences)

    def enqueue_verify(self, layer: int, sequences: Any, *, q: Ref, tree_kv: Ref,
                       out: Ref, lse: Optional[Ref] = None, ready: Optional[Tuple[Ref, int]] = None,
                       done: Optional[Tuple[Ref, int]] = None, return_lse: Optional[bool] = None,
                       softmax_scale: Optional[float] = None, id: Optional[int] = None) -> int:
        """The raw descriptor: tensors and flags as Refs (region, offset) exactly as given; no
        checks here (the daemon's answer is the completion). Returns the descriptor id."""
        prepared = sequences if isinstance(sequences, PreparedSequences) \
            else PreparedSequences(sequences)
        d = self._descriptor  # reused: the library copies it into the ring before returning
        # Every field is written (no memset): the per-layer call is the hot path.
        d.id = self._take_id(id)
        d.layer = int(layer)
        d.num_sequences = len(prepared.sequences)
        d.sequences = prepared._pointer
        d.q = _TensorRef(q.region, q.offset)
        d.tree_kv = _TensorRef(tree_kv.region, tree_kv.offset)
        d.out = _TensorRef(out.region, out.offset)
        d.lse = _TensorRef(lse.region, lse.offset) if lse is not None else _NO_TENSOR
        d.return_lse = int(lse is not None if return_lse is None else bool(return_lse))
        d.has_softmax_scale = int(softmax_scale is not None)
        d.softmax_scale = 0.0 if softmax_scale is None else float(softmax_scale)
        d.ready = _NO_FLAG if ready is None else \
            _Flag(ready[0].region, ready[0].offset, int(ready[1]) & 0xFFFFFFFF, 0)
        d.done = _NO_FLAG if done is None else \
            _Flag(done[0].region, done[0].offset, int(done[1]) & 0xFFFFFFFF, 0)
        if self._lib.vd_enqueue_verify(self._handle, ctypes.byref(d)) != 0:
            _check(-1, "Verify")
        self._methods[d.id] = "Verify"
        return d.id

    def verify(self, layer: int, sequences: Any, q: Any, tree_kv: Any, out: Any,
               lse: Any = None, *, ready: Union[Flag, Tuple[Any, int]],
               done: Union[Flag, Tuple[Any, int]], stream: Any = None,
               softmax_scale: Optional[float] = None, id: Optional[int] = None) -> int:
        """Verify attention of `layer` into `out` (and `lse`), all in registered memory:
        q bf16 [sum Q, H, 576], tree_kv bf16 [sum Q, 576], out bf16 [sum Q, H, 512], lse fp32
        [sum Q, H]; ready/done: (uint32 word, value). Each tensor and word: a torch tensor, a
        numpy array (bf16 as uint16 bits), an object with `__cuda_array_interface__`, or a DLPack
        object (`__dlpack__` + `__dlpack_device__`; kDLCUDA is device memory, kDLCPU and
        kDLCUDAHost host memory; bf16 as kDLBfloat or uint16 bits), C-contiguous, inside
        registered memory (keep it alive until done). `sequences`: a list of VerifySequence /
        (id, parents[, commit]) or a PreparedSequences (prepare(); what the layers of a step
        share). Device memory: the descriptor is enqueued, then "write ready" and "wait done"
        are recorded on `stream` (default: torch's current stream) — nothing blocks the CPU.
        Host memory: ready is stored by the host after the descriptor is published. Returns the
        descriptor id (see result())."""
        prepared = sequences if isinstance(sequences, PreparedSequences) \
            else PreparedSequences(sequences)
        if not prepared.sequences:
            raise invalid_argument("sequences must not be empty", "Verify")
        refs = self._torch_refs(prepared.total_q, q, tree_kv, out, lse, ready, done)
        if refs is None:  # not plain torch tensors, or something to refuse: the general path
            refs = self._checked_refs(prepared.total_q, q, tree_kv, out, lse, ready, done)
        rq, rkv, rout, rlse, rready, rdone, ready_value, done_value = refs
        descriptor_id = self.enqueue_verify(
            layer, prepared, q=rq[0], tree_kv=rkv[0], out=rout[0],
            lse=None if rlse is None else rlse[0], ready=(rready[0], ready_value),
            done=(rdone[0], done_value), softmax_scale=softmax_scale, id=id)
        ready_value &= 0xFFFFFFFF
        if rq[2]:
            handle = _stream_handle(stream)
            if self._lib.vd_stream_write_value32(handle, rready[1], ready_value) != 0 or \
                    self._lib.vd_stream_wait_value32(handle, rdone[1], done_value & 0xFFFFFFFF):
                _check(-1, "Verify")
        else:
            ctypes.c_uint32.from_address(rready[1]).value = ready_value
        return descriptor_id

    def _torch_refs(self, total_q: int, q, tree_kv, out, lse, ready, done):
        """verify()'s hot path (the per-layer call of a Python scheduler, plans/0013): plain torch
        tensors of the right shapes, dtypes and layout whose places are known (the plane's cache),
        checked in straight-line code. None for anything else; the general path then accepts it
        or says what is wrong."""
        tensor = _TORCH_CLASSES[0] if _TORCH_CLASSES else None
        if tensor is None or type(q) is not tensor or type(tree_kv) is not tensor or \
                type(out) is not tensor or (lse is not None and type(lse) is not tensor) or \
                type(ready) is not tuple or type(done) is not tuple or len(ready) != 2 or \
                len(done) != 2 or type(ready[0]) is not tensor or type(done[0]) is not tensor:
            return None
        heads = self.plane.heads
        bf16 = _TORCH_CLASSES[1]
        rows = total_q * heads if heads is not None else -1
        if q.shape != (total_q, heads, ROW) or tree_kv.shape != (total_q, ROW) or \
                out.shape != (total_q, heads, V_DIM) or q.dtype is not bf16 or \
                tree_kv.dtype is not bf16 or out.dtype is not bf16 or not q.is_contiguous() or \
                not tree_kv.is_contiguous() or not out.is_contiguous():
            return None
        if lse is not None and (lse.shape != (total_q, heads) or lse.dtype is not _TORCH_CLASSES[2]
                                or not lse.is_contiguous()):
            return None
        known = self.plane._refs
        on_device = q.is_cuda
        rq = known.get((q.data_ptr(), rows * ROW * 2, on_device))
        rkv = known.get((tree_kv.data_ptr(), total_q * ROW * 2, tree_kv.is_cuda))
        rout = known.get((out.data_ptr(), rows * V_DIM * 2, out.is_cuda))
        rlse = None if lse is None else known.get((lse.data_ptr(), rows * 4, lse.is_cuda))
        word, done_word = ready[0], done[0]
        rready = known.get((word.data_ptr(), word.numel() * word.element_size(), word.is_cuda))
        rdone = known.get((done_word.data_ptr(), done_word.numel() * done_word.element_size(),
                           done_word.is_cuda))
        if rq is None or rkv is None or rout is None or rready is None or rdone is None or \
                (lse is not None and rlse is None) or not word.is_contiguous() or \
                not done_word.is_contiguous():
            return None  # first sight of a tensor (the general path resolves and keeps it)
        if rkv[2] != on_device or rout[2] != on_device or rready[2] != on_device or \
                rdone[2] != on_device or (rlse is not None and rlse[2] != on_device):
            return None
        return rq, rkv, rout, rlse, rready, rdone, int(ready[1]), int(done[1])

    def _checked_refs(self, total_q: int, q, tree_kv, out, lse, ready, done):
        self._check_tensors(total_q, q, tree_kv, out, lse)
        ready_word, ready_value = _flag_parts(ready, "ready")
        done_word, done_value = _flag_parts(done, "done")
        resolve = self.plane._resolve
        rq, rkv, rout = resolve(q, "q"), resolve(tree_kv, "tree_kv"), resolve(out, "out")
        rlse = resolve(lse, "lse") if lse is not None else None
        rready, rdone = resolve(ready_word, "ready.word"), resolve(done_word, "done.word")
        on_device = rq[2]
        for r in (rkv, rout, rlse, rready, rdone):
            if r is not None and r[2] != on_device:
                raise invalid_argument("q, tree_kv, out, lse and the flags must all be device "
                                       "memory or all host memory", "Verify")
        return rq, rkv, rout, rlse, rready, rdone, ready_value, done_value

    def _check_tensors(self, total_q: int, q, tree_kv, out, lse) -> None:
        heads = self.plane.heads
        q_shape = _shape(q, "q")
        h = q_shape[1] if len(q_shape) == 3 else -1
        if heads is not None and h != heads:
            raise invalid_argument(f"q has shape {list(q_shape)}; need [sum Q = {total_q}, "
                                   f"H = {heads}, {ROW}] (the daemon's heads)", "Verify")
        for name, x, want, bf16 in (("q", q, (total_q, h, ROW), True),
                                    ("tree_kv", tree_kv, (total_q, ROW), True),
                                    ("out", out, (total_q, h, V_DIM), True),
                                    ("lse", lse, (total_q, h), False)):
            if x is None:
                continue
            shape = q_shape if x is q else _shape(x, name)
            if shape != want:
                raise invalid_argument(f"{name} has shape {list(shape)}; need {list(want)} "
                                       f"(sum Q = {total_q})", "Verify")
            if not _dtype_ok(x, bf16, name):
                what = "bfloat16 (numpy: uint16 bits)" if bf16 else "float32"
                raise invalid_argument(f"{name} must be {what}", "Verify")

    # -- Commit ----------------------------------------------------------------------------------
    def commit(self, sequence_id: int, accepted_path: Sequence[int], *,
               id: Optional[int] = None) -> int:
        """A Commit descriptor; its completion carries committed_length. Returns the id."""
        path = [int(a) for a in accepted_path]
        arr = _int32_array(path)
        descriptor_id = self._take_id(id)
        _check(self._lib.vd_enqueue_commit(self._handle, descriptor_id, int(sequence_id),
                                           ctypes.cast(arr, ctypes.POINTER(ctypes.c_int32)),
                                           len(path)), "Commit")
        self._methods[descriptor_id] = "Commit"
        return descriptor_id

    # -- completions -----------------------------------------------------------------------------
    def _completion(self, c: _Completion) -> Completion:
        i = int(c.id)
        return Completion(i, _CODES.get(int(c.code), grpc.StatusCode.UNKNOWN),
                          c.message.decode("utf-8", "replace"), int(c.committed_length),
                          self._methods.pop(i, ""))

    def poll(self) -> List[Completion]:
        """Every completion written so far (and any read earlier by result(id)), in order."""
        out = [self._done.pop(i) for i in list(self._order) if i in self._done]
        self._order.clear()
        buf = (_Completion * 64)()
        while True:
            n = _check(self._lib.vd_poll_completions(self._handle, buf, 64), "PollCompletions")
            out.extend(self._completion(buf[k]) for k in range(n))
            if n < 64:
                return out

    def wait(self, timeout: float = 30.0) -> Completion:
        """The next completion (blocks up to `timeout` seconds: DeadlineExceeded)."""
        if self._order:
            return self._done.pop(self._order.popleft())
        c = _Completion()
        _check(self._lib.vd_wait_completion(self._handle, float(timeout), ctypes.byref(c)),
               "WaitCompletion")
        return self._completion(c)

    def result(self, id: Optional[int] = None, timeout: float = 30.0) -> Completion:
        """The completion of descriptor `id` (default: the next one); raises its VerifydError
        when it failed. Completions of other ids read meanwhile are kept for poll()/wait()."""
        if id is None:
            return self.wait(timeout).raise_for_status()
        if id in self._done:
            self._order.remove(id)
            return self._done.pop(id).raise_for_status()
        while True:
            raw = _Completion()
            _check(self._lib.vd_wait_completion(self._handle, float(timeout),
                                                ctypes.byref(raw)), "WaitCompletion")
            c = self._completion(raw)
            if c.id == id:
                return c.raise_for_status()
            self._done[c.id] = c
            self._order.append(c.id)

    def heartbeat(self) -> None:
        self._lib.vd_channel_heartbeat(self._handle)

    def close(self) -> None:
        """CloseChannel: descriptors in flight complete ABORTED (NaN, done written)."""
        if self._handle:
            handle, self._handle = self._handle, _P()
            _check(self._lib.vd_channel_close(handle), "CloseChannel")

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - best effort at garbage collection
            pass


_CURRENT_RAW_STREAM: Optional[Callable[[], int]] = None


def _stream_handle(stream: Any) -> Optional[int]:
    """A cudaStream_t as an int: given (int, torch.cuda.Stream, or anything with .cuda_stream),
    or torch's current stream."""
    if stream is None:
        global _CURRENT_RAW_STREAM
        if _CURRENT_RAW_STREAM is None:
            import torch  # noqa: PLC0415
            raw, device = (getattr(torch._C, "_cuda_getCurrentRawStream", None),
                           getattr(torch._C, "_cuda_getDevice", None))
            # What torch.cuda.current_stream() returns, without its Stream object (~µs a call
            # on the GPU hosts); torch builds without these private calls take the public way.
            _CURRENT_RAW_STREAM = (lambda: raw(device())) if raw and device else \
                (lambda: torch.cuda.current_stream().cuda_stream)
        return int(_CURRENT_RAW_STREAM()) or None
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream) or None
    return int(stream) or None
