"""Tensors in and out: numpy arrays and torch tensors as bf16.

bf16 on the numpy side is carried as **uint16 arrays holding the bf16 bit patterns** (the upper 16
bits of the float32). `ml_dtypes` (numpy's bfloat16 dtype) is not packaged in Debian 12, so the
package does not depend on it; an array whose dtype is ml_dtypes.bfloat16 is accepted (viewed as
uint16) when a caller has it. float32/float64 arrays are accepted as a convenience and rounded to
bf16 (round to nearest even), exactly as torch's `.to(torch.bfloat16)` does.

torch tensors: `torch.bfloat16` is sent as its bits; other float dtypes are converted with
`.to(torch.bfloat16)`. CUDA tensors are copied through host memory on the gRPC path (the device
data plane, verifyd.dataplane, is what avoids that). Outputs come back in the kind of the input:
numpy uint16 (bf16 bits) / float32 (lse), or torch bfloat16 / float32 on the input's device.
numpy outputs of the gRPC path are read-only views of the response's bytes (no copy; `.copy()`
to modify); torch outputs own their memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from .errors import invalid_argument

ROW = 576          # latent KV row / absorbed query width (SPEC §1)
V_DIM = 512        # value width (the first 512 of a row)

__all__ = ["ROW", "V_DIM", "TensorKind", "float32_to_bf16", "bf16_to_float32", "as_bf16_bits",
           "as_fp32", "to_output_bf16", "to_output_fp32", "is_torch", "random_bf16"]


def is_torch(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


@dataclass(frozen=True)
class TensorKind:
    """Where outputs go: 'numpy', or 'torch' with the input's device."""
    kind: str = "numpy"
    device: Any = None


NUMPY = TensorKind("numpy")


def float32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32/float64 -> bf16 bits (uint16), round to nearest even; NaN stays NaN."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded = np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32 (exact)."""
    b = np.ascontiguousarray(bits)
    if b.dtype.name == "bfloat16":
        b = b.view(np.uint16)
    if b.dtype == np.int16:
        b = b.view(np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def random_bf16(rng: np.random.Generator, shape: Sequence[int], scale: float = 1.0) -> np.ndarray:
    """Normal random values rounded to bf16 bits; never an exact zero (zeros hide indexing bugs)."""
    v = rng.standard_normal(size=tuple(shape)).astype(np.float32) * scale
    v = np.where(np.abs(v) < 1e-3 * scale, np.copysign(1e-3 * scale, v), v)
    return float32_to_bf16(v)


def _torch():
    import torch  # noqa: PLC0415 - optional dependency
    return torch


def as_bf16_bits(x: Any, name: str, method: str = "") -> Tuple[np.ndarray, TensorKind]:
    """Any accepted bf16 input -> (C-contiguous uint16 array of bf16 bits, kind of the input)."""
    if is_torch(x):
        torch = _torch()
        kind = TensorKind("torch", x.device)
        t = x.detach()
        if t.dtype != torch.bfloat16:
            if not t.is_floating_point():
                raise invalid_argument(f"{name} has dtype {t.dtype}; need torch.bfloat16 "
                                       "(or a float dtype to convert)", method)
            t = t.to(torch.bfloat16)
        t = t.cpu().contiguous()
        return t.view(torch.int16).numpy().view(np.uint16), kind
    if isinstance(x, np.ndarray):
        if x.dtype == np.uint16:
            return np.ascontiguousarray(x), NUMPY
        if x.dtype.name == "bfloat16" or x.dtype == np.int16:
            return np.ascontiguousarray(x).view(np.uint16), NUMPY
        if x.dtype in (np.float32, np.float64):
            return float32_to_bf16(x), NUMPY
        raise invalid_argument(f"{name} has dtype {x.dtype}; need uint16 (bf16 bits), "
                               "ml_dtypes.bfloat16, float32 or float64", method)
    raise invalid_argument(f"{name} must be a numpy array or a torch tensor, not "
                           f"{type(x).__name__}", method)


def check_shape(bits: np.ndarray, shape: Sequence[Optional[int]], name: str, what: str,
                method: str = "") -> Tuple[int, ...]:
    """Checks rank and the fixed dims (None = any); returns the actual shape."""
    if bits.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, bits.shape)):
        want = ", ".join("*" if s is None else str(s) for s in shape)
        raise invalid_argument(f"{name} has shape {list(bits.shape)}; need [{want}] ({what})",
                               method)
    return tuple(bits.shape)


def as_fp32(x: Any) -> np.ndarray:
    if is_torch(x):
        return x.detach().float().cpu().contiguous().numpy()
    return np.ascontiguousarray(x, dtype=np.float32)


def to_output_bf16(bits: np.ndarray, kind: TensorKind):
    """uint16 bf16 bits -> numpy uint16 (as is) or a torch.bfloat16 tensor on kind.device."""
    if kind.kind != "torch":
        return bits
    torch = _torch()
    if not bits.flags.writeable:  # a view of the response's bytes: torch wants writable memory
        bits = bits.copy()
    t = torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)
    if kind.device is not None and str(kind.device) != "cpu":
        t = t.to(kind.device, non_blocking=False)
    return t


def to_output_fp32(values: np.ndarray, kind: TensorKind):
    if kind.kind != "torch":
        return values
    torch = _torch()
    values = np.ascontiguousarray(values, dtype=np.float32)
    t = torch.from_numpy(values if values.flags.writeable else values.copy())
    if kind.device is not None and str(kind.device) != "cpu":
        t = t.to(kind.device)
    return t


def copy_bf16_into(dest: Any, bits: np.ndarray, name: str = "out") -> None:
    """Writes bf16 bits into a caller's tensor (torch bf16 on any device, or numpy uint16)."""
    if is_torch(dest):
        torch = _torch()
        src = torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)
        if tuple(dest.shape) != tuple(src.shape) or dest.dtype != torch.bfloat16:
            raise invalid_argument(f"{name} is {dest.dtype} {list(dest.shape)}; need "
                                   f"torch.bfloat16 {list(src.shape)}")
        dest.copy_(src.reshape(dest.shape))
        return
    if not isinstance(dest, np.ndarray) or dest.dtype != np.uint16 or dest.shape != bits.shape:
        raise invalid_argument(f"{name} must be a numpy uint16 array of shape {list(bits.shape)}")
    np.copyto(dest, bits)
