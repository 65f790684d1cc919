"""Where a tensor is and what it is, for the data plane: its address, bytes and device (torch,
numpy, `__cuda_array_interface__`, DLPack), its shape and dtype. Nothing here touches the data."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from .dlpack import KDL_CUDA, dl_device_name, dlpack_device, dlpack_tensor, uses_dlpack
from .errors import invalid_argument
from .tensors import is_torch


def nbytes_of(x: Any) -> int:
    if is_torch(x):
        return x.numel() * x.element_size()
    return int(np.asarray(x).nbytes)


def host_pointer(x: Any) -> Tuple[int, int]:
    """(address, bytes) of a C-contiguous numpy array or torch CPU tensor."""
    if is_torch(x):
        if x.is_cuda or not x.is_contiguous():
            raise invalid_argument("need a contiguous CPU tensor")
        return x.data_ptr(), nbytes_of(x)
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
        return tensor.data_ptr(), nbytes_of(tensor), tensor.device.index
    cai = getattr(tensor, "__cuda_array_interface__", None)
    if cai is None:
        if uses_dlpack(tensor):
            t = dlpack_tensor(tensor, name, method)
            if not t.device:
                raise invalid_argument(f"{name} is host memory (DLPack device type "
                                       f"{dl_device_name(t.device_type)}); need a CUDA tensor",
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


def is_cuda(x: Any, name: str = "tensor", method: str = "") -> bool:
    if is_torch(x):
        return bool(x.is_cuda)
    if hasattr(x, "__cuda_array_interface__"):
        return True
    if isinstance(x, np.ndarray) or not hasattr(x, "__dlpack__"):
        return False
    return dlpack_device(x, name, method)[0] == KDL_CUDA


def address_of(x: Any, name: str = "tensor", method: str = "") -> Tuple[int, int, bool]:
    """(address, bytes, on the device) of a tensor/array."""
    if is_cuda(x, name, method):
        p, n, _ = device_pointer(x, name, method)
        return p, n, True
    if uses_dlpack(x):  # host memory through DLPack
        t = dlpack_tensor(x, name, method)
        return t.address, t.nbytes, t.device
    p, n = host_pointer(x)
    return p, n, False


TORCH_TYPE: Dict[type, bool] = {}


def torch_tensor(x: Any) -> bool:
    """is_torch with the answer kept per type (the hot path asks it several times a call)."""
    t = type(x)
    known = TORCH_TYPE.get(t)
    if known is None:
        known = TORCH_TYPE[t] = is_torch(x)
    return known


def shape_of(x: Any, name: str = "tensor") -> Tuple[int, ...]:
    shape = getattr(x, "shape", None)
    if shape is None:
        if uses_dlpack(x):
            return dlpack_tensor(x, name, "Verify").shape
        shape = x.__cuda_array_interface__["shape"]
    return tuple(shape)


# (torch.Tensor, torch.bfloat16, torch.float32) once torch has been seen: the hot path compares
# against them without importing torch (which a numpy-only scheduler may not have).
TORCH_CLASSES: Optional[Tuple[Any, Any, Any]] = None


def dtype_ok(x: Any, bf16: bool, name: str = "tensor") -> bool:
    global TORCH_CLASSES
    if torch_tensor(x):
        if TORCH_CLASSES is None:
            import torch  # noqa: PLC0415
            TORCH_CLASSES = (torch.Tensor, torch.bfloat16, torch.float32)
        return x.dtype is TORCH_CLASSES[1 if bf16 else 2]
    if isinstance(x, np.ndarray):
        return x.dtype == (np.uint16 if bf16 else np.float32)
    if uses_dlpack(x):
        dtype = dlpack_tensor(x, name, "Verify").dtype
        return dtype in ("bfloat16", "uint16") if bf16 else dtype == "float32"
    t = np.dtype(x.__cuda_array_interface__["typestr"])
    if bf16:
        return t == np.uint16 or (t.itemsize == 2 and t.kind == "V")
    return t == np.float32
