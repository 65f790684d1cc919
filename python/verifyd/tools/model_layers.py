"""Running a DeepSeek-V3-structured model's layers with the attention supplied from outside.

The model is anything shaped like transformers' DeepseekV3ForCausalLM (`.model.embed_tokens`,
`.model.layers[i].{input_layernorm, self_attn, post_attention_layernorm, mlp}`, `.model.norm`,
`.lm_head`, `.config`): transformers' own, or the plain-torch one of the package's tests. Every
part but attention runs through the model's own modules, so what differs from the model's own
forward is the attention alone.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import torch

from ..mla import MlaLayer

__all__ = ["mla_layers", "forward", "attention_inputs"]

# attention(layer index, MlaLayer, x [T, hidden], positions [T]) -> the layer's output [T, hidden]
Attention = Callable[[int, MlaLayer, torch.Tensor, torch.Tensor], torch.Tensor]


def mla_layers(model, count: Optional[int] = None) -> List[MlaLayer]:
    layers = model.model.layers[:count] if count is not None else model.model.layers
    return [MlaLayer.from_module(layer.self_attn, model.config) for layer in layers]


def forward(model, mla: Sequence[MlaLayer], tokens: torch.Tensor, positions: torch.Tensor,
            attention: Attention) -> torch.Tensor:
    """Logits [T, vocab] of tokens [T] at positions [T] through the first len(mla) layers
    (DeepseekV3DecoderLayer's residual order), each layer's attention from `attention`."""
    h = model.model.embed_tokens(tokens[None])
    for i, layer in enumerate(model.model.layers[:len(mla)]):
        x = layer.input_layernorm(h)[0]
        h = h + attention(i, mla[i], x, positions)[None]
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(model.model.norm(h))[0]


def attention_inputs(model, input_ids: torch.Tensor, count: Optional[int] = None
                     ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """The model's own forward over input_ids [1, T] (its own attention: a prefill as the engine
    runs it) -> (the last position's logits [vocab], each layer's attention input [T, hidden]),
    the latter caught at each input_layernorm's output."""
    caught: List[torch.Tensor] = []
    hooks = [layer.input_layernorm.register_forward_hook(
        lambda _m, _i, out: caught.append(out[0].detach()))
        for layer in (model.model.layers[:count] if count is not None else model.model.layers)]
    try:
        out = model(input_ids)
    finally:
        for h in hooks:
            h.remove()
    logits = out.logits if hasattr(out, "logits") else out
    return logits[0, -1], caught
