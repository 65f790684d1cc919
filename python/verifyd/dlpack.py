"""DLPack (the Python array API standard's data interchange) read with ctypes: the last way in to
the data plane, for objects that are neither torch tensors nor numpy arrays and have no
__cuda_array_interface__ (JAX, TensorFlow, wrappers)."""
from __future__ import annotations

import ctypes
from typing import Any, NamedTuple, Tuple

import numpy as np

from .errors import invalid_argument
from .tensors import is_torch

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


KDL_CPU, KDL_CUDA, KDL_CUDA_HOST = 1, 2, 3  # DLDeviceType; 3 is pinned host memory
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
    """What an object's DLPack capsule says (read by dlpack_tensor)."""
    address: int             # data + byte_offset
    nbytes: int
    shape: Tuple[int, ...]
    dtype: str               # a _DL_DTYPES name, or "code C bits B" for any other
    device: bool             # CUDA memory (kDLCUDA); False: host (kDLCPU, kDLCUDAHost)
    device_type: int
    device_id: int


def dl_device_name(device_type: int) -> str:
    return f"{device_type} ({_DL_DEVICE_NAMES.get(device_type, 'unknown')})"


def uses_dlpack(x: Any) -> bool:
    """Whether x is reached through DLPack: it has `__dlpack__` and none of the other ways in
    (torch, numpy, `__cuda_array_interface__`) applies."""
    return hasattr(x, "__dlpack__") and not is_torch(x) and not isinstance(x, np.ndarray) and \
        not hasattr(x, "__cuda_array_interface__")


def dlpack_device(x: Any, name: str, method: str = "") -> Tuple[int, int]:
    """`__dlpack_device__()`, refusing devices other than the CPU, CUDA and CUDA host memory."""
    query = getattr(x, "__dlpack_device__", None)
    if query is None:
        raise invalid_argument(f"{name} has __dlpack__ but no __dlpack_device__", method)
    device_type, device_id = query()
    device_type, device_id = int(device_type), int(device_id)
    if device_type not in (KDL_CPU, KDL_CUDA, KDL_CUDA_HOST):
        raise invalid_argument(f"{name} is on DLPack device type {dl_device_name(device_type)}; "
                               "the data plane takes kDLCPU (1), kDLCUDA (2) and kDLCUDAHost (3) "
                               "memory", method)
    return device_type, device_id


def dlpack_tensor(x: Any, name: str = "tensor", method: str = "") -> DLPackTensor:
    """Address, bytes, shape, dtype and device of a DLPack object, from its capsule; refuses
    (InvalidArgument naming `name`) other devices and non-row-major layouts. The data is not
    touched. The caller keeps `x` for as long as the address is used, as for any other kind: the
    producer owns the memory, and the capsule is gone when this returns."""
    expected_type, _ = dlpack_device(x, name, method)  # first, as the standard's consumers do
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
    if device_type not in (KDL_CPU, KDL_CUDA, KDL_CUDA_HOST):
        raise invalid_argument(f"{name} is on DLPack device type {dl_device_name(device_type)}; "
                               "the data plane takes kDLCPU (1), kDLCUDA (2) and kDLCUDAHost (3) "
                               "memory", method)
    if device_type != expected_type:
        raise invalid_argument(f"{name}: __dlpack_device__() says device type "
                               f"{dl_device_name(expected_type)}, its capsule "
                               f"{dl_device_name(device_type)}", method)
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
                        device_type == KDL_CUDA, device_type, device_id)
