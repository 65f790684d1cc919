"""Shared test helpers: random bf16 inputs (never zeros), the float64 reference check, and
DLPack-only producers (a wrapper of numpy/torch, and one written with ctypes)."""
import ctypes

import numpy as np

from verifyd.reference import check_close, verify_reference
from verifyd.tensors import random_bf16

from conftest import HEADS, LAYERS


def prefill(client, sid, rng, tokens, layers=LAYERS, **kwargs):
    kv = random_bf16(rng, (layers, tokens, 576))
    r = client.append(sid, kv, **kwargs)
    return kv, r


def tree_inputs(rng, q_nodes, heads=HEADS):
    return random_bf16(rng, (q_nodes, heads, 576)), random_bf16(rng, (q_nodes, 576))


def check_sequence(out_bits, prefix_kv_layer, tree_kv, q, parents, scale, lse=None):
    o, ref_lse = verify_reference(prefix_kv_layer, tree_kv, q, parents, scale)
    return check_close(np.asarray(out_bits), o, lse=lse, ref_lse=ref_lse if lse is not None
                       else None)


class DLPackOnly:
    """Only the DLPack protocol (`__dlpack__` + `__dlpack_device__`: no shape, dtype, array or
    CUDA array interface), delegating to a numpy array or a torch tensor; `calls` counts the
    exports and `streams` records the stream each was asked with."""

    def __init__(self, inner):
        self._inner = inner
        self.calls = 0
        self.streams = []

    def __dlpack__(self, stream=None):
        self.calls += 1
        self.streams.append(stream)
        return self._inner.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._inner.__dlpack_device__()


# -- a DLPack producer written here (ctypes), for layouts numpy and torch do not make -----------
class _DLManaged(ctypes.Structure):
    """dlpack.h's DLManagedTensor, written out again (not the package's copy)."""
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
                ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.CFUNCTYPE(None, ctypes.c_void_p))]


_CAPSULE_NAMES = {name: ctypes.create_string_buffer(name)  # outlive every capsule
                  for name in (b"dltensor", b"used_dltensor")}
_capsule_new = ctypes.pythonapi["PyCapsule_New"]
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_capsule_valid = ctypes.pythonapi["PyCapsule_IsValid"]  # takes the capsule as an address: it
_capsule_valid.restype = ctypes.c_int                  # is being destroyed (no new references)
_capsule_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_get = ctypes.pythonapi["PyCapsule_GetPointer"]
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

DELETED = []  # addresses of the DLManagedTensors whose deleter ran


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _deleter(managed):
    DELETED.append(managed)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _destructor(capsule):
    """What the protocol asks of a producer: an unconsumed "dltensor" capsule frees its tensor;
    a consumed ("used_dltensor") one is the consumer's to free."""
    if _capsule_valid(capsule, b"dltensor"):
        managed = _capsule_get(capsule, b"dltensor")
        _DLManaged.from_address(managed).deleter(managed)


class HandmadeDLPack:
    """A DLPack-only producer of any layout: each __dlpack__() makes a new DLManagedTensor whose
    deleter records its address in DELETED (`made`: the addresses made; nothing is allocated at
    `data`, so only what reads the capsule, never the memory, may be given one)."""

    def __init__(self, data, shape, code=1, bits=16, lanes=1, strides=None, device=(1, 0),
                 byte_offset=0, reported_device=None, capsule_name=b"dltensor"):
        self.data, self.shape, self.strides = data, tuple(shape), strides
        self.code, self.bits, self.lanes = code, bits, lanes
        self.device, self.byte_offset = device, byte_offset
        self.reported_device = device if reported_device is None else reported_device
        self.capsule_name = capsule_name
        self.made = []
        self._keep = []  # the structs and their arrays outlive every capsule (addresses unique)
        self.calls = 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        m = _DLManaged()
        shape = (ctypes.c_int64 * max(len(self.shape), 1))(*self.shape)
        strides = None if self.strides is None else \
            (ctypes.c_int64 * max(len(self.strides), 1))(*self.strides)
        m.data, m.device_type, m.device_id = self.data, self.device[0], self.device[1]
        m.ndim = len(self.shape)
        m.code, m.bits, m.lanes = self.code, self.bits, self.lanes
        m.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        if strides is not None:
            m.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        m.byte_offset = self.byte_offset
        m.deleter = _deleter
        self._keep.append((m, shape, strides))
        self.made.append(ctypes.addressof(m))
        name = _CAPSULE_NAMES[self.capsule_name]
        return _capsule_new(ctypes.addressof(m), ctypes.addressof(name),
                            ctypes.cast(_destructor, ctypes.c_void_p))

    def __dlpack_device__(self):
        return self.reported_device
