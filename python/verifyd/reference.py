"""The computation of SPEC §1 in float64 numpy: the reference tests compare the daemon against.

Inputs are bf16 bits (uint16) as the daemon receives them; everything is widened to float64.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from .tensors import V_DIM, bf16_to_float32

__all__ = ["ancestor_mask", "verify_reference", "relative_error", "check_close"]


def ancestor_mask(parents: Sequence[int]) -> np.ndarray:
    """visible[i, j]: node j is i itself or an ancestor of i. Raises on an invalid tree."""
    q = len(parents)
    visible = np.zeros((q, q), dtype=bool)
    for i, p in enumerate(parents):
        if not (p == -1 or 0 <= p < i):
            raise ValueError(f"parents[{i}] = {p} must be -1 or in [0, {i})")
        visible[i, i] = True
        if p >= 0:
            visible[i] |= visible[p]
    return visible


def verify_reference(prefix_kv: np.ndarray, tree_kv: np.ndarray, q: np.ndarray,
                     parents: Sequence[int], scale: float) -> Tuple[np.ndarray, np.ndarray]:
    """One sequence, one layer. prefix_kv bf16 [n, 576] (committed), tree_kv bf16 [Q, 576],
    q bf16 [Q, H, 576] -> (o float64 [Q, H, 512], lse float64 [Q, H])."""
    c = bf16_to_float32(prefix_kv).astype(np.float64).reshape(-1, 576)
    t = bf16_to_float32(tree_kv).astype(np.float64).reshape(-1, 576)
    qq = bf16_to_float32(q).astype(np.float64)
    nq, heads, _ = qq.shape
    s_prefix = scale * np.einsum("qhd,td->qht", qq, c)          # [Q, H, n]
    s_tree = scale * np.einsum("qhd,jd->qhj", qq, t)            # [Q, H, Q]
    visible = ancestor_mask(parents)[:, None, :]                 # [Q, 1, Q]
    s_tree = np.where(visible, s_tree, -np.inf)
    s = np.concatenate([s_prefix, s_tree], axis=2)
    m = s.max(axis=2, keepdims=True)
    p = np.exp(s - m)
    z = p.sum(axis=2, keepdims=True)
    values = np.concatenate([c[:, :V_DIM], t[:, :V_DIM]], axis=0)  # [n + Q, 512]
    o = np.einsum("qht,tv->qhv", p / z, values)
    lse = (m + np.log(z))[..., 0]
    return o, lse


def relative_error(out_bits: np.ndarray, ref: np.ndarray) -> float:
    """‖o − ref‖ / ‖ref‖ with o given as bf16 bits (SPEC §1's measure)."""
    o = bf16_to_float32(out_bits).astype(np.float64).reshape(ref.shape)
    return float(np.linalg.norm(o - ref) / np.linalg.norm(ref))


def check_close(out_bits: np.ndarray, ref: np.ndarray, what: str = "out",
                tolerance: float = 1e-2, lse: Optional[np.ndarray] = None,
                ref_lse: Optional[np.ndarray] = None) -> float:
    """Every element checked: all finite; SPEC §1's relative error ≤ tolerance for the whole
    tensor and for every (node, head) row; each element within tolerance of its row's largest
    value. Raises AssertionError naming the first bad element; returns the relative error."""
    o = bf16_to_float32(out_bits).astype(np.float64).reshape(ref.shape)
    if not np.isfinite(o).all():
        bad = np.argwhere(~np.isfinite(o))[0]
        raise AssertionError(f"{what}: non-finite at {tuple(bad)}")
    err = float(np.linalg.norm(o - ref) / np.linalg.norm(ref))
    if err > tolerance:
        raise AssertionError(f"{what}: relative error {err:.3g} > {tolerance}")
    rows_o = o.reshape(-1, ref.shape[-1])
    rows_r = ref.reshape(-1, ref.shape[-1])
    row_err = np.linalg.norm(rows_o - rows_r, axis=1) / np.linalg.norm(rows_r, axis=1)
    if (row_err > tolerance).any():
        r = int(np.argmax(row_err))
        raise AssertionError(f"{what}: row {r} relative error {row_err[r]:.3g} > {tolerance}")
    bound = tolerance * np.abs(rows_r).max(axis=1, keepdims=True) + 1e-12
    bad = np.abs(rows_o - rows_r) > bound
    if bad.any():
        r, k = np.argwhere(bad)[0]
        raise AssertionError(f"{what}: row {r} element {k}: {rows_o[r, k]} vs {rows_r[r, k]}")
    if lse is not None and ref_lse is not None:
        diff = np.abs(np.asarray(lse, dtype=np.float64).reshape(ref_lse.shape) - ref_lse)
        if not (diff <= 1e-2 * np.maximum(1.0, np.abs(ref_lse))).all():
            i = np.unravel_index(int(np.argmax(diff)), diff.shape)
            raise AssertionError(f"lse at {i}: diff {diff[i]:.3g}")
    return err
