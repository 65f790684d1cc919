"""KV rows in DeepSeek's FP8 MLA layout, made on the engine's side exactly as the daemon makes them.

656 bytes per token and layer (verify/kv_fp8_layout.h, plans/0030-fp8-store.md): the 512 latent
values as float8 e4m3 (e4m3fn: largest 448, NaN 0x7F/0xFF) in four groups of 128, the four groups'
float32 scales (little-endian), then the 64 rope values as bf16. Per group scale =
float32(amax / 448), 1 for a group whose scale would be 0; each value is float32(v / scale) rounded
to the nearest e4m3, ties to even, saturating at +-448. `Client.append(..., fp8=True)` sends such
rows (DTYPE_FP8_MLA) to a daemon started with --kv_dtype=fp8. numpy only.
"""
from __future__ import annotations

import numpy as np

FP8_ROW_BYTES = 656
LATENT, GROUPS, GROUP, ROPE = 512, 4, 128, 64
E4M3_MAX = np.float32(448.0)
_MAX_CODE = 0x7E


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def float_to_e4m3(x: np.ndarray) -> np.ndarray:
    """float32 -> e4m3 codes (uint8): round to nearest, ties to even, saturating at +-448."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x)
    codes = np.zeros(x.shape, dtype=np.int32)
    sub = a < np.float32(2.0 ** -6)
    # Subnormals are multiples of 2^-9 (np.rint: ties to even); 8 x 2^-9 is the least normal, 0x08.
    codes[sub] = np.rint(a[sub] * np.float32(512.0)).astype(np.int32)
    normal = ~sub & (a < E4M3_MAX)
    _, e = np.frexp(a[normal])
    exponent = e.astype(np.int32) - 1                      # a in [2^exponent, 2^(exponent + 1))
    significand = np.rint(np.ldexp(a[normal], 3 - exponent)).astype(np.int32)  # [8, 16], exact
    carry = significand == 16
    significand[carry] = 8
    exponent[carry] += 1
    saturated = (exponent > 8) | ((exponent == 8) & (significand > 14))
    normal_codes = ((exponent + 7) << 3) | (significand - 8)
    normal_codes[saturated] = _MAX_CODE
    codes[normal] = normal_codes
    codes[~sub & ~normal] = _MAX_CODE                     # >= 448
    codes |= np.where(np.signbit(x), 0x80, 0)
    return codes.astype(np.uint8)


def e4m3_to_float(codes: np.ndarray) -> np.ndarray:
    """e4m3 codes -> float32 values (NaN for 0x7F and 0xFF)."""
    c = np.asarray(codes, dtype=np.uint8).astype(np.int32)
    exponent, mantissa = (c >> 3) & 15, c & 7
    magnitude = np.where(exponent == 0, np.ldexp(mantissa.astype(np.float64), -9),
                         np.ldexp((8 + mantissa).astype(np.float64), exponent - 10))
    magnitude = np.where((c & 0x7F) == 0x7F, np.nan, magnitude)
    return np.where(c & 0x80, -magnitude, magnitude).astype(np.float32)


def quantize_fp8_rows(kv) -> np.ndarray:
    """bf16 rows [..., 576] (uint16 bit patterns, or torch.bfloat16) -> uint8 [..., 656]."""
    from .tensors import as_bf16_bits
    bits, _ = as_bf16_bits(kv, "kv", "quantize_fp8_rows")
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    if bits.shape[-1] != LATENT + ROPE:
        raise ValueError(f"kv's last dimension is {bits.shape[-1]}, must be 576")
    lead = bits.shape[:-1]
    flat = bits.reshape(-1, LATENT + ROPE)
    groups = _bf16_to_f32(flat[:, :LATENT]).reshape(-1, GROUPS, GROUP)
    amax = np.max(np.abs(groups), axis=-1)
    scale = (amax / E4M3_MAX).astype(np.float32)  # IEEE float32 division, as the daemon's
    scale[scale == 0] = np.float32(1.0)
    codes = float_to_e4m3((groups / scale[:, :, None]).astype(np.float32)).reshape(-1, LATENT)
    out = np.concatenate([codes, scale.astype("<f4").view(np.uint8).reshape(-1, GROUPS * 4),
                          flat[:, LATENT:].astype("<u2").view(np.uint8).reshape(-1, ROPE * 2)],
                         axis=1)
    return out.reshape(*lead, FP8_ROW_BYTES)


def dequantize_fp8_rows(rows) -> np.ndarray:
    """uint8 [..., 656] -> float32 [..., 576]: e4m3 value x scale (latent), the rope values."""
    r = np.ascontiguousarray(rows, dtype=np.uint8)
    if r.shape[-1] != FP8_ROW_BYTES:
        raise ValueError(f"rows' last dimension is {r.shape[-1]}, must be 656")
    lead = r.shape[:-1]
    flat = r.reshape(-1, FP8_ROW_BYTES)
    scale = flat[:, LATENT:LATENT + 16].copy().view("<f4").astype(np.float32)
    latent = e4m3_to_float(flat[:, :LATENT]).reshape(-1, GROUPS, GROUP) * scale[:, :, None]
    rope = _bf16_to_f32(flat[:, LATENT + 16:].copy().view("<u2"))
    return np.concatenate([latent.reshape(-1, LATENT), rope], axis=1).reshape(*lead, LATENT + ROPE)
