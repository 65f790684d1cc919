"""MLA helpers (SPEC §4): a DeepSeek-V3-style attention layer in the form verifyd computes.

An MLA layer (transformers' `DeepseekV3Attention`; SGLang and vLLM load the same weight names)
keeps one latent per token, c = kv_a_layernorm(c_kv) (512 values), and one rope key k_pe (64,
shared by every head). Per head h, with W_UK[h] and W_UV[h] the rows of kv_b_proj that belong to
head h:

    score(t) = scale * (q_nope[h] . (W_UK[h] c_t) + rope(q_pe[h]) . rope(k_pe_t))
    out[h]   = W_UV[h] (sum_t softmax(score)(t) c_t),      then o_proj over the heads

Moving W_UK onto the query ("absorbing" it) turns this into verifyd's problem (SPEC §1): one key
row per token, [c | rope(k_pe)] (576 values), shared by all heads; per head the query
[q_nope[h] W_UK[h] | rope(q_pe[h])] (576); the values are the rows' first 512 entries; W_UV and
o_proj come after. From one layer's weights::

    layer = MlaLayer.from_module(model.model.layers[i].self_attn)   # or from_state_dict(...)
    q    = layer.queries(x, positions)        # [T, H, 576], in x's dtype
    rows = layer.latent_rows(x, positions)    # [T, 576] bf16: what verifyd stores
    out  = ...verifyd...                      # [T, H, 512] bf16
    y    = layer.project(out)                 # [T, hidden]: W_UV per head, then o_proj
    layer.softmax_scale                       # qk_head_dim^-0.5 * mscale(factor, mscale_all_dim)^2

`x` is the attention module's input (the decoder layer's `input_layernorm` output), [T, hidden];
`positions` [T] integers: a committed token's index, a draft-tree node's n + its depth. Every step
runs in x's dtype (float64 for checks, float32 or bf16 as an engine runs), on x's device; the
RMSNorms and the RoPE angles follow transformers exactly (float32 inside), so that the same
weights give transformers' numbers.

RoPE: YaRN (`rope_scaling` / `rope_parameters` of type "yarn", as the released DeepSeek-V3 and
Kimi K2 configs have) and the plain kind. With `rope_interleave` (the default of DeepSeek-V3
checkpoints) the 64 rope values keep DeepSeek's own order, pairs (2i, 2i+1) rotated in place, as
an engine's cache (FlashMLA's) holds them; transformers permutes them to [even | odd] first, which
changes no dot product.

The latent rows' storage format is a parameter (`kv_format`): "bf16" (SPEC §1's 576 bf16 values)
is implemented; "fp8" (DeepSeek's 656-byte FlashMLA layout) is where its encoder goes
(`ROW_FORMATS`), once verifyd's fp8 store takes rows in that layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

__all__ = ["LATENT_DIM", "ROPE_DIM", "ROW_DIM", "Rope", "MlaLayer", "rope_parameters",
           "rope_from_config", "softmax_scale", "yarn_mscale", "rms_norm", "ROW_FORMATS"]

LATENT_DIM = 512   # kv_lora_rank: the value part of a row (SPEC §1)
ROPE_DIM = 64      # qk_rope_head_dim
ROW_DIM = LATENT_DIM + ROPE_DIM


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' DeepseekV3RMSNorm, step for step: the statistics in float32, the result
    cast back to x's dtype before the weight (so a float64 input meets the same roundings)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_parameters(config: Any) -> Dict[str, Any]:
    """The RoPE settings of a config as one dict with "rope_type" and "rope_theta":
    transformers 5's `rope_parameters`, or a checkpoint's `rope_scaling` + `rope_theta` (4.x and
    the released config.json files, where the type may be spelled "type")."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, Mapping) and params:
        p = dict(params)
    else:
        p = dict(getattr(config, "rope_scaling", None) or {})
    p.setdefault("rope_type", p.get("type", "default"))
    if p.get("rope_theta") is None:
        p["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    return p


def softmax_scale(config: Any) -> float:
    """DeepseekV3Attention's scaling: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2
    when the RoPE is scaled and mscale_all_dim is set (YaRN: 1.3689^2 for DeepSeek-V3's 40)."""
    qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
    scale = qk_head_dim ** -0.5
    p = rope_parameters(config)
    if p["rope_type"] != "default":
        mscale_all_dim = p.get("mscale_all_dim", 0)
        if mscale_all_dim:
            m = yarn_mscale(p["factor"], mscale_all_dim)
            scale = scale * m * m
    return scale


@dataclass(frozen=True)
class Rope:
    inv_freq: torch.Tensor     # float32 [rope_dim // 2], computed as transformers does
    attention_scaling: float   # cos and sin are multiplied by it (YaRN: mscale / mscale_all_dim)
    interleave: bool           # DeepSeek's pairs (2i, 2i+1); False: halves (NeoX)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        """[T, rope_dim / 2] each; the angles in float32 like transformers' rotary embedding (so
        positions past 2^24 / 2^10 radians lose what they lose there too)."""
        inv = self.inv_freq.to(device=positions.device, dtype=torch.float32)
        angles = positions.to(torch.float32)[:, None] * inv[None, :]
        return ((angles.cos() * self.attention_scaling).to(dtype),
                (angles.sin() * self.attention_scaling).to(dtype))

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, ..., rope_dim] rotated by position; cos / sin [T, rope_dim / 2]."""
        shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
        c, s = cos.reshape(shape), sin.reshape(shape)
        if self.interleave:
            even, odd = x[..., 0::2], x[..., 1::2]
            return torch.stack((even * c - odd * s, odd * c + even * s), dim=-1).flatten(-2)
        half = x.shape[-1] // 2
        lo, hi = x[..., :half], x[..., half:]
        return torch.cat((lo * c - hi * s, hi * c + lo * s), dim=-1)


def _yarn_inv_freq(p: Mapping[str, Any], dim: int, max_position_embeddings: int
                   ) -> Tuple[torch.Tensor, float]:
    """transformers' _compute_yarn_parameters, operation for operation (float32)."""
    base = float(p["rope_theta"])
    factor = p.get("factor")
    original = p.get("original_max_position_embeddings") or max_position_embeddings
    if factor is None:
        factor = max_position_embeddings / original
    factor = float(factor)
    attention_factor = p.get("attention_factor")
    mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # the share of each frequency left unscaled
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


def rope_from_config(config: Any) -> Rope:
    p = rope_parameters(config)
    dim = config.qk_rope_head_dim
    kind = p["rope_type"]
    if kind == "default":
        base = float(p["rope_theta"])
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))
        scaling = 1.0
    elif kind == "yarn":
        inv, scaling = _yarn_inv_freq(p, dim, config.max_position_embeddings)
    else:
        raise NotImplementedError(f"rope type '{kind}': verifyd.mla implements 'yarn' (the "
                                  "DeepSeek-V3 / Kimi K2 configs) and 'default'")
    return Rope(inv, scaling, bool(getattr(config, "rope_interleave", True)))


# -- the latent rows' storage formats ------------------------------------------------------------
def _bf16_rows(rows: torch.Tensor) -> torch.Tensor:
    return rows.to(torch.bfloat16)


def _fp8_rows(rows: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError(
        "kv_format 'fp8' (DeepSeek's FlashMLA layout, 656 bytes a row: 512 e4m3 values in four "
        "groups of 128 with a float32 scale each, then the 64 rope values in bf16; SPEC §1) is "
        "not implemented yet: its encoder goes in verifyd.mla.ROW_FORMATS")


# kv_format -> encoder of [T, 576] rows (any float dtype) into what Append / Verify carry.
ROW_FORMATS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"bf16": _bf16_rows,
                                                                   "fp8": _fp8_rows}


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight.to(x.dtype),
                                      None if bias is None else bias.to(x.dtype))


class MlaLayer:
    """One attention layer's weights (references, not copies) and its conventions."""

    def __init__(self, weights: Mapping[str, Optional[torch.Tensor]], config: Any):
        self.heads = int(config.num_attention_heads)
        self.nope = int(config.qk_nope_head_dim)
        self.v_head_dim = int(config.v_head_dim)
        self.eps = float(getattr(config, "rms_norm_eps", 1e-6))
        if config.kv_lora_rank != LATENT_DIM or config.qk_rope_head_dim != ROPE_DIM:
            raise ValueError(f"kv_lora_rank = {config.kv_lora_rank}, qk_rope_head_dim = "
                             f"{config.qk_rope_head_dim}: verifyd's rows are {LATENT_DIM} + "
                             f"{ROPE_DIM} (SPEC §1)")
        self.w = dict(weights)
        self.rope = rope_from_config(config)
        self.softmax_scale = softmax_scale(config)
        kv_b = self.w["kv_b_proj.weight"]
        per_head = kv_b.view(self.heads, self.nope + self.v_head_dim, LATENT_DIM)
        self.w_uk = per_head[:, :self.nope, :]   # [H, nope, 512]
        self.w_uv = per_head[:, self.nope:, :]   # [H, v, 512]

    # -- construction --------------------------------------------------------------------------
    _NAMES = ("q_proj.weight", "q_a_proj.weight", "q_a_proj.bias", "q_a_layernorm.weight",
              "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_a_proj_with_mqa.bias",
              "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight", "o_proj.bias")

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, torch.Tensor], config: Any,
                        prefix: str = "") -> "MlaLayer":
        """prefix: e.g. "model.layers.3.self_attn." in a checkpoint's names."""
        weights = {n: state_dict.get(prefix + n) for n in cls._NAMES}
        has_lora = weights["q_a_proj.weight"] is not None
        needed = ["kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
                  "o_proj.weight"] + (["q_a_layernorm.weight", "q_b_proj.weight"] if has_lora
                                      else ["q_proj.weight"])
        missing = [prefix + n for n in needed if weights[n] is None]
        if missing:
            raise KeyError(f"MLA weights missing: {missing}")
        return cls({n: (None if t is None else t.detach()) for n, t in weights.items()}, config)

    @classmethod
    def from_module(cls, attention: torch.nn.Module, config: Any = None) -> "MlaLayer":
        """transformers' DeepseekV3Attention, or any module with its submodule names."""
        return cls.from_state_dict(dict(attention.named_parameters()),
                                   config if config is not None else attention.config)

    # -- the three conversions -----------------------------------------------------------------
    def queries(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The absorbed queries [T, H, 576]: q_nope W_UK | rope(q_pe), per head."""
        w = self.w
        if w["q_a_proj.weight"] is not None:
            q = _linear(x, w["q_a_proj.weight"], w["q_a_proj.bias"])
            q = _linear(rms_norm(q, w["q_a_layernorm.weight"].to(x.dtype), self.eps),
                        w["q_b_proj.weight"], None)
        else:
            q = _linear(x, w["q_proj.weight"], None)
        q = q.view(x.shape[0], self.heads, self.nope + ROPE_DIM)
        q_nope, q_pe = q[..., :self.nope], q[..., self.nope:]
        absorbed = torch.einsum("thn,hnc->thc", q_nope, self.w_uk.to(x.dtype))
        cos, sin = self.rope.cos_sin(positions, x.dtype)
        return torch.cat((absorbed, self.rope.apply(q_pe, cos, sin)), dim=-1)

    def latent(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The latent rows [T, 576] in x's dtype: kv_a_layernorm(c_kv) | rope(k_pe)."""
        w = self.w
        kv = _linear(x, w["kv_a_proj_with_mqa.weight"], w["kv_a_proj_with_mqa.bias"])
        c = rms_norm(kv[:, :LATENT_DIM], w["kv_a_layernorm.weight"].to(x.dtype), self.eps)
        cos, sin = self.rope.cos_sin(positions, x.dtype)
        return torch.cat((c, self.rope.apply(kv[:, LATENT_DIM:], cos, sin)), dim=-1)

    def latent_rows(self, x: torch.Tensor, positions: torch.Tensor,
                    kv_format: str = "bf16") -> torch.Tensor:
        """The rows verifyd stores (Append's kv, Verify's tree_kv) in `kv_format`."""
        if kv_format not in ROW_FORMATS:
            raise ValueError(f"kv_format = '{kv_format}' must be one of {sorted(ROW_FORMATS)}")
        return ROW_FORMATS[kv_format](self.latent(x, positions))

    def project(self, out: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """verifyd's out [T, H, 512] (any float dtype) -> the layer's output [T, hidden]: W_UV
        per head, then o_proj; computed in `dtype` (default: o_proj's)."""
        w = self.w
        dtype = dtype or w["o_proj.weight"].dtype
        v = torch.einsum("thc,hvc->thv", out.to(dtype), self.w_uv.to(dtype))
        return _linear(v.reshape(out.shape[0], self.heads * self.v_head_dim), w["o_proj.weight"],
                       w["o_proj.bias"])
