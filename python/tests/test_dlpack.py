"""DLPack-only objects (`__dlpack__` + `__dlpack_device__`, nothing else) read by the data plane's
helper (verifyd.dlpack.dlpack_tensor) without a daemon: address, bytes, shape, dtype and
device as numpy's own __array_interface__ / torch say; strided views and other devices refused,
naming the tensor; the capsule's deleter run exactly once per export, refusals included. The
channel and register() with such objects: test_dataplane.py."""
import collections
import gc
import sys

import numpy as np
import pytest

import verifyd
from verifyd import dataplane, dataplane_tensors, dlpack

from helpers import DELETED, DLPackOnly, HandmadeDLPack

read = dlpack.dlpack_tensor


def _interface(a):
    i = a.__array_interface__
    return i["data"][0], tuple(i["shape"])


def test_numpy_capsules_read_as_numpy_sees_the_array():
    big = np.zeros((8, 2, 576), np.uint16)
    cases = [
        (big[3:6], "uint16"),                             # a row range: data not at the base
        (np.zeros((5, 2), np.float32), "float32"),
        (np.zeros(16, np.uint32)[8:9], "uint32"),          # a flag word
        (np.zeros(4, np.int32), "int32"),
        (np.zeros((4, 1, 3), np.float32)[:, :, :], "float32"),
        (np.zeros((0, 576), np.uint16), "uint16"),
    ]
    for a, dtype in cases:
        w = DLPackOnly(a)
        t = read(w, "q")
        address, shape = _interface(a)
        assert (t.address, t.shape, t.nbytes) == (address, shape, a.nbytes), (a.shape, t)
        assert t.dtype == dtype and not t.device and t.device_type == 1
        # What the channel's general path asks of the object, through the same capsule.
        assert dataplane_tensors.address_of(w, "q") == (address, a.nbytes, False)
        assert dataplane_tensors.shape_of(w, "q") == shape
        assert dataplane_tensors.dtype_ok(w, True, "q") == (dtype == "uint16")
        assert dataplane_tensors.dtype_ok(w, False, "q") == (dtype == "float32")
        assert w.streams and set(w.streams) == {None}  # stream=None, as the standard has it


def test_torch_capsules_read_as_torch_sees_the_tensor():
    torch = pytest.importorskip("torch")
    base = torch.zeros((6, 2, 576), dtype=torch.bfloat16)
    for x, dtype in ((base[2:5], "bfloat16"), (torch.zeros(3, 2), "float32"),
                     (torch.zeros(16, dtype=torch.int32)[8:9], "int32"),
                     (torch.zeros(4, dtype=torch.int16), "code 0 bits 16")):
        t = read(DLPackOnly(x), "out")
        assert (t.address, t.shape, t.nbytes, t.dtype, t.device) == \
            (x.data_ptr(), tuple(x.shape), x.numel() * x.element_size(), dtype, False)
    assert dataplane_tensors.dtype_ok(DLPackOnly(base), True, "q")
    assert not dataplane_tensors.dtype_ok(DLPackOnly(torch.zeros(2, dtype=torch.int16)), True, "q")
    assert not dataplane_tensors.dtype_ok(DLPackOnly(base), False, "lse")


def test_layouts_numpy_and_torch_do_not_make():
    # byte_offset counts; bf16 is kDLBfloat (4, 16)
    t = read(HandmadeDLPack(0x10000, (3, 2, 576), code=4, bits=16, byte_offset=640), "q")
    assert (t.address, t.nbytes, t.shape, t.dtype) == (0x10000 + 640, 3 * 2 * 576 * 2,
                                                      (3, 2, 576), "bfloat16")
    # explicit compact strides (in elements), and any stride on a dimension of 1
    t = read(HandmadeDLPack(0x20000, (4, 1, 8), code=2, bits=32, strides=(8, 999, 1)), "lse")
    assert (t.address, t.nbytes, t.dtype) == (0x20000, 4 * 8 * 4, "float32")
    # kDLCUDAHost is host memory; kDLCUDA device memory with its device id
    t = read(HandmadeDLPack(0x30000, (16,), code=1, bits=32, device=(3, 0)), "ready.word")
    assert not t.device and t.device_type == 3 and t.dtype == "uint32"
    cuda = HandmadeDLPack(0x40000, (2, 576), device=(2, 3))
    t = read(cuda, "tree_kv")
    assert t.device and (t.device_type, t.device_id) == (2, 3)
    assert dataplane_tensors.address_of(cuda, "tree_kv") == (0x40000, 2 * 576 * 2, True)
    assert dataplane.device_pointer(cuda) == (0x40000, 2 * 576 * 2, 3)

    class Cai:  # the same memory through the CUDA array interface
        __cuda_array_interface__ = {"shape": (2, 576), "typestr": "<u2",
                                    "data": (0x40000, False), "version": 2}
    assert dataplane.device_pointer(Cai())[:2] == dataplane.device_pointer(cuda)[:2]
    with pytest.raises(verifyd.InvalidArgument, match="tensor is host memory"):
        dataplane.device_pointer(HandmadeDLPack(0x50000, (4,)))
    # more than one lane or a part of a byte: refused
    with pytest.raises(verifyd.InvalidArgument, match="q has DLPack dtype code 2, bits 32, "
                                                      "lanes 4"):
        read(HandmadeDLPack(0x60000, (4,), code=2, bits=32, lanes=4), "q")


def test_non_contiguous_views_are_refused_by_name():
    a = np.zeros((4, 2, 1152), np.uint16)
    with pytest.raises(verifyd.InvalidArgument, match=r"q is not C-contiguous \(DLPack shape "
                                                      r"\[4, 2, 576\], strides \[2304, 1152, "
                                                      r"2\] in elements\)"):
        read(DLPackOnly(a[:, :, ::2]), "q")
    with pytest.raises(verifyd.InvalidArgument, match="tree_kv is not C-contiguous"):
        dataplane_tensors.address_of(DLPackOnly(np.zeros((576, 4), np.uint16).T), "tree_kv")
    with pytest.raises(verifyd.InvalidArgument, match="out is not C-contiguous"):
        read(HandmadeDLPack(0x1000, (4, 4), strides=(1, 4)), "out")
    torch = pytest.importorskip("torch")
    with pytest.raises(verifyd.InvalidArgument, match="lse is not C-contiguous"):
        dataplane_tensors.shape_of(DLPackOnly(torch.zeros(8, 2)[::2]), "lse")


def test_other_devices_are_refused_by_name():
    rocm = HandmadeDLPack(0x1000, (4,), device=(10, 0))
    with pytest.raises(verifyd.InvalidArgument, match=r"q is on DLPack device type 10 \(kDLROCM\)"):
        read(rocm, "q")
    assert rocm.calls == 0  # refused from __dlpack_device__(), before an export
    with pytest.raises(verifyd.InvalidArgument, match="out is on DLPack device type 10"):
        dataplane_tensors.address_of(rocm, "out")
    # the capsule is what counts: a device __dlpack_device__() did not say
    managed = HandmadeDLPack(0x1000, (4,), device=(13, 0), reported_device=(2, 0))
    with pytest.raises(verifyd.InvalidArgument,
                       match=r"lse is on DLPack device type 13 \(kDLCUDAManaged\)"):
        read(managed, "lse")
    assert managed.calls == 1
    with pytest.raises(verifyd.InvalidArgument, match=r"q: __dlpack_device__\(\) says device "
                                                      r"type 1 \(kDLCPU\), its capsule 2"):
        read(HandmadeDLPack(0x1000, (4,), device=(2, 0), reported_device=(1, 0)), "q")


def test_other_producer_mistakes_are_refused_by_name():
    used = HandmadeDLPack(0x1000, (4,), capsule_name=b"used_dltensor")
    with pytest.raises(verifyd.InvalidArgument, match=r"q.__dlpack__\(\) returned <capsule "
                                                      r"object \"used_dltensor\""):
        read(used, "q")

    class NotACapsule:
        def __dlpack__(self, stream=None):
            return 42

        def __dlpack_device__(self):
            return (1, 0)
    with pytest.raises(verifyd.InvalidArgument, match="out.__dlpack__.. returned 42"):
        read(NotACapsule(), "out")

    class NoDevice:
        def __dlpack__(self, stream=None):
            return np.zeros(4).__dlpack__()
    with pytest.raises(verifyd.InvalidArgument, match="tree_kv has __dlpack__ but no "
                                                      "__dlpack_device__"):
        read(NoDevice(), "tree_kv")


def test_a_dlpack_without_the_stream_keyword():
    a = np.zeros((3, 8), np.float32)

    class NoStream:  # an older producer's signature
        def __dlpack__(self):
            return a.__dlpack__()

        def __dlpack_device__(self):
            return a.__dlpack_device__()
    assert (read(NoStream()).address, read(NoStream()).shape) == _interface(a)


def test_the_other_kinds_keep_their_own_ways():
    torch = pytest.importorskip("torch")

    class Cai(DLPackOnly):
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<u2", "data": (64, False),
                                    "version": 2}
    assert not dlpack.uses_dlpack(np.zeros(4))
    assert not dlpack.uses_dlpack(torch.zeros(4))
    assert not dlpack.uses_dlpack(Cai(np.zeros(4)))
    assert dlpack.uses_dlpack(DLPackOnly(np.zeros(4)))
    cai = Cai(np.zeros(4, np.uint16))
    assert dataplane_tensors.address_of(cai) == (64, 8, True) and cai.calls == 0


def test_the_deleter_runs_exactly_once():
    # numpy's DLManagedTensor holds a reference to the array until its deleter runs: never run
    # is +1 a read, run twice is -1 (and a freed array).
    a = np.zeros((64, 576), np.uint16)
    before = sys.getrefcount(a)
    for _ in range(1000):
        read(DLPackOnly(a), "q")
    gc.collect()
    assert sys.getrefcount(a) == before
    strided = a[:, ::2]
    before = sys.getrefcount(strided)
    for _ in range(100):
        with pytest.raises(verifyd.InvalidArgument):
            read(DLPackOnly(strided), "q")
    gc.collect()
    assert sys.getrefcount(strided) == before
    # A hand-written producer: each export's tensor deleted once, whether read or refused.
    # (The producers stay alive, so no address is used twice.)
    gc.collect()
    DELETED.clear()
    producers = [HandmadeDLPack(0x1000, shape, strides=strides)
                 for shape, strides in [((4, 576), None), ((4, 4), (1, 4))] * 50]
    for h in producers:
        try:
            read(h, "q")
        except verifyd.InvalidArgument:
            pass
    gc.collect()
    made = [m for h in producers for m in h.made]
    assert len(made) == 100 and collections.Counter(DELETED) == collections.Counter(made)


def test_the_deleter_runs_exactly_once_for_torch_to_dlpack():
    """torch's DLManagedTensor holds the tensor in C++ (its Python refcount does not move), so the
    witness is a numpy array under the tensor (torch.from_numpy): an undeleted export keeps the
    tensor, and so the array, alive after the last Python reference is gone."""
    torch = pytest.importorskip("torch")
    from torch.utils.dlpack import to_dlpack
    base = np.zeros((32, 576), np.uint16)
    alone = sys.getrefcount(base)
    t = torch.from_numpy(base.view(np.int16)).view(torch.bfloat16)
    assert sys.getrefcount(base) > alone

    class Exporter:
        def __init__(self, tensor):
            self.tensor = tensor

        def __dlpack__(self, stream=None):
            return to_dlpack(self.tensor)

        def __dlpack_device__(self):
            return (1, 0)
    own = sys.getrefcount(t)
    for _ in range(500):
        assert read(Exporter(t), "q").address == t.data_ptr()
    assert sys.getrefcount(t) == own
    del t
    gc.collect()
    assert sys.getrefcount(base) == alone


def test_the_adapter_takes_dlpack_cuda_tensors_for_device_memory():
    """The adapter's device transport picks its flag memory by where q lives: a DLPack kDLCUDA q
    is device memory as a torch CUDA tensor is; a DLPack host q, numpy and a torch CPU tensor are
    not."""
    from verifyd.adapter import on_device_memory
    assert on_device_memory(HandmadeDLPack(0x60000, (2, 2, 576), code=4, device=(2, 0)))
    assert not on_device_memory(HandmadeDLPack(0x60000, (2, 2, 576), code=4, device=(1, 0)))
    assert not on_device_memory(np.zeros((2, 2, 576), np.uint16))
    torch = pytest.importorskip("torch")
    assert not on_device_memory(torch.zeros(2, 2, 576, dtype=torch.bfloat16))
