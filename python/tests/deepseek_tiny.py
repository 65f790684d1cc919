"""A small DeepSeek-V3 in plain torch (1.13 and later): the model the tree-decoding tests run in CI,
where transformers is absent.

Written the way transformers' modeling_deepseek_v3 computes (the eager path: k_nope and the values
made from the latent by kv_b_proj, never absorbed; RoPE with transformers' rotate_half and its
interleave permutation; YaRN's frequencies and mscale; the group-limited sigmoid router with the
correction bias; shared experts), independently of verifyd.mla, so that tests can hold
verifyd.mla against it. Module and parameter names are transformers' (and the DeepSeek-V3
checkpoints'), so a state dict moves between this model and DeepseekV3ForCausalLM unchanged:
tools/device/real_model_gpu.py saves this model's weights as a Hugging Face checkpoint, loads it
with transformers and checks the two agree.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import torch
from torch import nn


@dataclass
class TinyConfig:
    vocab_size: int = 512
    hidden_size: int = 96
    intermediate_size: int = 192
    moe_intermediate_size: int = 48
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    n_shared_experts: int = 1
    n_routed_experts: int = 8
    routed_scaling_factor: float = 2.5
    kv_lora_rank: int = 512
    q_lora_rank: Optional[int] = 48
    qk_rope_head_dim: int = 64
    v_head_dim: int = 32
    qk_nope_head_dim: int = 32
    n_group: int = 2
    topk_group: int = 1
    num_experts_per_tok: int = 2
    first_k_dense_replace: int = 1
    norm_topk_prob: bool = True
    hidden_act: str = "silu"
    # DeepSeek-V3's YaRN: factor 40 over 4096 original positions (max = factor x original).
    max_position_embeddings: int = 163840
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[Dict[str, Any]] = field(default_factory=lambda: {
        "type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})
    rope_interleave: bool = True
    attention_bias: bool = False
    tie_word_embeddings: bool = False

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def hf_dict(self) -> Dict[str, Any]:
        """config.json of a DeepseekV3ForCausalLM checkpoint (as the released ones are written:
        rope_scaling with "type"; no end-of-sequence token, so generate runs to max_new_tokens)."""
        d = asdict(self)
        d.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"],
                 bos_token_id=None, eos_token_id=None, pad_token_id=None, attention_dropout=0.0,
                 initializer_range=0.02, use_cache=True, torch_dtype="float32")
        return d


# -- transformers' formulation (eager) ------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * x.to(dtype)


def _mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def yarn_inv_freq(cfg: TinyConfig):
    """transformers' yarn rope init: inverse frequencies (float32) and the cos/sin factor."""
    rs = dict(cfg.rope_scaling)
    dim, base = cfg.qk_rope_head_dim, cfg.rope_theta
    factor = rs["factor"]
    original = rs.get("original_max_position_embeddings", cfg.max_position_embeddings)
    if rs.get("mscale") and rs.get("mscale_all_dim"):
        attention_factor = _mscale(factor, rs["mscale"]) / _mscale(factor, rs["mscale_all_dim"])
    else:
        attention_factor = _mscale(factor)
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def corr(rot):
        return (dim * math.log(original / (rot * 2 * math.pi))) / (2 * math.log(base))
    low, high = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extra_factor = 1 - torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low)
                                   / (high - low), 0, 1)
    return inter * (1 - extra_factor) + extra * extra_factor, attention_factor


class RotaryEmbedding(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        if cfg.rope_scaling:
            inv_freq, self.attention_scaling = yarn_inv_freq(cfg)
        else:
            dim = cfg.qk_rope_head_dim
            inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2).float() / dim))
            self.attention_scaling = 1.0
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        """cos, sin [B, T, dim] as transformers returns them (float32 angles, x's dtype)."""
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.attention_scaling).to(x.dtype),
                (emb.sin() * self.attention_scaling).to(x.dtype))


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), dim=-1)


def apply_rope(q, k, cos, sin, interleave):
    """q [B, H, T, d], k [B, 1, T, d]; cos / sin [B, T, d]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if interleave:
        b, h, s, d = q.shape
        q = q.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
        b, h, s, d = k.shape
        k = k.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Attention(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.config = cfg
        h = cfg.num_attention_heads
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(cfg.hidden_size, h * cfg.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, bias=cfg.attention_bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, h * cfg.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size,
                                            cfg.kv_lora_rank + cfg.qk_rope_head_dim,
                                            bias=cfg.attention_bias)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, h * (cfg.qk_nope_head_dim + cfg.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(h * cfg.v_head_dim, cfg.hidden_size, bias=cfg.attention_bias)
        self.scaling = cfg.qk_head_dim ** -0.5
        self.softmax_dtype = torch.float32  # transformers' eager attention (tests may widen it)
        rs = cfg.rope_scaling
        if rs and rs.get("mscale_all_dim"):
            m = _mscale(rs["factor"], rs["mscale_all_dim"])
            self.scaling = self.scaling * m * m

    def forward(self, hidden_states, position_embeddings, attention_mask):
        """hidden_states [B, T, d]; attention_mask additive [B, 1, T, S] over the keys so far."""
        cfg = self.config
        b, t = hidden_states.shape[:2]
        if cfg.q_lora_rank is None:
            q = self.q_proj(hidden_states)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        q = q.view(b, t, -1, cfg.qk_head_dim).transpose(1, 2)
        q_pass, q_rot = torch.split(q, [cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        kv = self.kv_a_proj_with_mqa(hidden_states)
        k_pass, k_rot = torch.split(kv, [cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        k_pass = self.kv_b_proj(self.kv_a_layernorm(k_pass)).view(
            b, t, -1, cfg.qk_nope_head_dim + cfg.v_head_dim).transpose(1, 2)
        k_pass, value = torch.split(k_pass, [cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
        k_rot = k_rot.view(b, 1, t, cfg.qk_rope_head_dim)
        cos, sin = position_embeddings
        q_rot, k_rot = apply_rope(q_rot, k_rot, cos, sin, cfg.rope_interleave)
        k_rot = k_rot.expand(*k_pass.shape[:-1], -1)
        query = torch.cat((q_pass, q_rot), dim=-1)
        key = torch.cat((k_pass, k_rot), dim=-1)
        w = torch.matmul(query, key.transpose(2, 3)) * self.scaling + attention_mask
        w = nn.functional.softmax(w, dim=-1, dtype=self.softmax_dtype).to(query.dtype)
        out = torch.matmul(w, value).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out), w


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class TopkRouter(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts))

    def forward(self, x):
        cfg = self.cfg
        x = x.view(-1, cfg.hidden_size)
        scores = nn.functional.linear(x.float(), self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias.unsqueeze(0)
        per_group = cfg.n_routed_experts // cfg.n_group
        group_scores = choice.view(-1, cfg.n_group, per_group).topk(2, dim=-1)[0].sum(-1)
        group_idx = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, cfg.n_group, per_group).reshape(
            -1, cfg.n_routed_experts)
        choice = choice.masked_fill(~score_mask.bool(), 0.0)
        idx = torch.topk(choice, k=cfg.num_experts_per_tok, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return idx, weights * cfg.routed_scaling_factor


class MoE(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.experts = nn.ModuleList([MLP(cfg.hidden_size, cfg.moe_intermediate_size)
                                      for _ in range(cfg.n_routed_experts)])
        self.gate = TopkRouter(cfg)
        self.shared_experts = MLP(cfg.hidden_size,
                                  cfg.moe_intermediate_size * cfg.n_shared_experts)

    def forward(self, x):
        shape = x.shape
        idx, weights = self.gate(x)
        flat = x.view(-1, shape[-1])
        weights = weights.to(x.dtype)  # transformers keeps them float32 (its float32 runs agree)
        routed = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(idx == e)
            if token.numel():
                routed.index_add_(0, token, expert(flat[token]) * weights[token, slot, None])
        return routed.view(shape) + self.shared_experts(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TinyConfig, index: int):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = (MoE(cfg) if index >= cfg.first_k_dense_replace
                    else MLP(cfg.hidden_size, cfg.intermediate_size))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, position_embeddings, attention_mask):
        a, _ = self.self_attn(self.input_layernorm(h), position_embeddings, attention_mask)
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h))


class Model(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg)


class TinyDeepseekV3(nn.Module):
    """DeepseekV3ForCausalLM's structure: .model (embed_tokens, layers, norm), .lm_head, .config."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.config = cfg
        self.model = Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids):
        """Causal forward over input_ids [B, T] from position 0 -> logits [B, T, vocab]."""
        t = input_ids.shape[1]
        h = self.model.embed_tokens(input_ids)
        positions = torch.arange(t, device=input_ids.device)[None].expand(input_ids.shape[0], -1)
        pe = self.model.rotary_emb(h, positions)
        mask = torch.full((t, t), float("-inf"), dtype=h.dtype, device=h.device).triu(1)
        for layer in self.model.layers:
            h = layer(h, pe, mask[None, None])
        return self.lm_head(self.model.norm(h))

    @torch.no_grad()
    def greedy(self, prompt: List[int], new_tokens: int) -> List[int]:
        """Plain greedy decoding with this model's own attention (the whole sequence again each
        token: the arithmetic of a KV-cached decode, without a cache to get wrong)."""
        ids = list(prompt)
        device = self.lm_head.weight.device
        for _ in range(new_tokens):
            logits = self(torch.tensor([ids], device=device))[0, -1]
            ids.append(int(logits.argmax()))
        return ids[len(prompt):]


def init_weights(model: TinyDeepseekV3, seed: int, *, attention_gain: float = 0.02,
                 mlp_gain: float = 1.0, logit_gain: float = 4.0) -> TinyDeepseekV3:
    """Random weights with the scales the token-for-token tests need (plans/0025): every linear
    layer fan-in-normalized, embeddings of unit scale; o_proj times `attention_gain` keeps the
    attention's share of the logits small enough that verifyd's bf16 rounding (~1e-3 of the
    attention output) moves no top-1 token, while still deciding some tokens; lm_head times
    `logit_gain` spreads the logits (margins and noise scale together, so it sets how peaked the
    distribution is, not their ratio)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        with torch.no_grad():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                fan_in = p.shape[1]
                w = torch.randn(p.shape, generator=g) / math.sqrt(fan_in)
                if "embed_tokens" in name:
                    w = torch.randn(p.shape, generator=g)
                elif name.endswith("o_proj.weight"):
                    w = w * attention_gain
                elif name.endswith("down_proj.weight"):
                    w = w * mlp_gain
                elif name == "lm_head.weight":
                    w = w * logit_gain
                p.copy_(w)
    for layer in model.model.layers:
        if isinstance(layer.mlp, MoE):
            bias = layer.mlp.gate.e_score_correction_bias
            bias.copy_(0.05 * torch.randn(bias.shape, generator=g))
    return model


def tiny_model(seed: int = 0, dtype=torch.float64, gains: Optional[Dict[str, float]] = None,
               **config) -> TinyDeepseekV3:
    """A TinyConfig(**config) model with init_weights(seed, **gains), in dtype."""
    return init_weights(TinyDeepseekV3(TinyConfig(**config)), seed, **(gains or {})).to(dtype)
