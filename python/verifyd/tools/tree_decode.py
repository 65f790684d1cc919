"""Tree speculative decoding of a DeepSeek-V3-style model with its attention on verifyd.

Per sequence: the prompt runs through the target's own forward (its own attention, as an engine's
prefill), each layer's latent rows go to verifyd (one Append per layer) and the last position's
greedy token becomes the first tree's root. Then, per step: the drafter proposes a tree rooted at
the last chosen token; the target runs every layer on the tree's nodes (RoPE at n + depth) with
attention on verifyd (verifyd.adapter.VerifyAttention: one Verify per layer; the previous step's
commit rides on the first); the longest path whose tokens equal the target's greedy choices is
accepted, plus the target's choice after it; the path is committed on the next step's Verify.
Greedy tree decoding is lossless: the tokens are the target's plain greedy decoding.

    python -m verifyd.tools.tree_decode --target unix:///tmp/verifyd.sock --model CHECKPOINT_DIR

(the checkpoint through transformers; the daemon started with --layers / --heads of the model).
tools/device/real_model_gpu.py and python/tests/test_tree_decode.py drive the same loop.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

from ..adapter import VerifyAttention
from ..client import Client
from ..mla import LATENT_DIM, ROW_DIM, MlaLayer
from .drafter import Drafter, DraftTree, perturbed
from .model_layers import attention_inputs, forward, mla_layers

__all__ = ["VerifydAttention", "accept_path", "DecodeResult", "TreeDecoder", "main"]


class VerifydAttention:
    """The target's attention on verifyd: per layer the absorbed q and the latent rows into the
    engine's buffers, forward_verify with the layer's own softmax scale, W_UV + o_proj. Buffers:
    plain tensors (grpc, shared_memory), or registered memory for transport "device" (a CUDA pool
    on the cuda backend, a /dev/shm buffer on the cpu backend). One serves every sequence, as an
    engine registers its pool once: a pool freed and allocated again can land in the allocation
    the daemon still has mapped."""

    def __init__(self, client: Client, heads: int, max_nodes: int, *, transport: str,
                 device: torch.device, kv_format: str = "bf16"):
        self.attn = VerifyAttention(client, transport=transport)
        self.kv_format = kv_format
        shapes = ((max_nodes, heads, ROW_DIM), (max_nodes, ROW_DIM), (max_nodes, heads,
                                                                     LATENT_DIM))
        self._memory = None
        self._pool = None
        if transport != "device":
            self.q, self.kv, self.out = (torch.empty(s, dtype=torch.bfloat16, device=device)
                                         for s in shapes)
        elif device.type == "cuda":
            self._pool = torch.empty(sum(_aligned(s) for s in shapes), dtype=torch.uint8,
                                     device=device)
            self._memory = client.register(self._pool)
            self.q, self.kv, self.out = _carve(self._pool, shapes)
        else:
            self._memory = client.host_buffer(sum(_aligned(s) for s in shapes), torch=True)
            self.q, self.kv, self.out = (self._memory.take(s) for s in shapes)

    def __call__(self, layer: int, mla: MlaLayer, x: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q, kv, out = self.q[:t], self.kv[:t], self.out[:t]
        q.copy_(mla.queries(x, positions))
        kv.copy_(mla.latent_rows(x, positions, self.kv_format))
        self.attn.softmax_scale = mla.softmax_scale
        self.attn.forward_verify(layer, q, kv, out)
        return mla.project(out, x.dtype)

    def close(self) -> None:
        self.attn.close()
        if self._memory is not None:
            self._memory.release()
            self._memory = None


def _aligned(shape) -> int:
    n = 2
    for d in shape:
        n *= d
    return -(-n // 256) * 256


def _carve(pool: torch.Tensor, shapes):
    views, offset = [], 0
    for s in shapes:
        size = _aligned(s)
        count = 1
        for d in s:
            count *= d
        views.append(pool[offset:offset + 2 * count].view(torch.bfloat16).view(*s))
        offset += size
    return views


def accept_path(tree: DraftTree, greedy: Sequence[int]) -> List[int]:
    """The longest root-first path whose every next node's token is the target's greedy choice
    at its parent (the root is the target's own choice from before)."""
    children: List[List[int]] = [[] for _ in tree.tokens]
    for i, p in enumerate(tree.parents):
        if p >= 0:
            children[p].append(i)
    path = [0]
    while True:
        nxt = [c for c in children[path[-1]] if tree.tokens[c] == greedy[path[-1]]]
        if not nxt:
            return path
        path.append(nxt[0])


@dataclass
class DecodeResult:
    tokens: List[int]                      # the new tokens, max_new of them
    accepted: List[int] = field(default_factory=list)   # tokens committed per step (root incl.)
    depths: List[int] = field(default_factory=list)     # each step's tree depth
    margins: List[float] = field(default_factory=list)  # top-1 minus top-2 logit per token
    logits: Optional[torch.Tensor] = None  # [max_new, vocab]: what decided each token
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0            # every step: drafting + the target + the commits
    draft_seconds: float = 0.0             # the drafter's share of it

    @property
    def steps(self) -> int:
        return len(self.accepted)

    @property
    def mean_accepted(self) -> float:
        return sum(self.accepted) / max(len(self.accepted), 1)

    @property
    def acceptance(self) -> float:
        """Accepted draft tokens over the deepest path offered, averaged over steps, in [0, 1]."""
        rates = [(a - 1) / d for a, d in zip(self.accepted, self.depths) if d > 0]
        return sum(rates) / max(len(rates), 1)

    @property
    def tokens_per_second(self) -> float:
        """Tokens the steps produced (the first came from the prefill) per decode second."""
        return (len(self.tokens) - 1) / self.decode_seconds if self.decode_seconds else 0.0


def _margins(logits: torch.Tensor) -> List[float]:
    """Top-1 minus top-2 logit of each row of [T, vocab]."""
    top = torch.topk(logits.float(), 2, dim=-1).values
    return (top[..., 0] - top[..., 1]).reshape(-1).tolist()


class TreeDecoder:
    """One sequence at a time (the loop, not a scheduler): `target` and `drafter.model` are
    DeepseekV3-structured; `attention` a VerifydAttention on a daemon started with the target's
    --layers and --heads."""

    def __init__(self, target, drafter: Drafter, attention: VerifydAttention, budget: int):
        self.target = target
        self.mla = mla_layers(target)
        self.drafter = drafter
        self.attention = attention
        self.budget = budget
        self.device = next(target.parameters()).device

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def generate(self, sequence_id: int, prompt: Sequence[int], max_new: int,
                 keep_logits: bool = False) -> DecodeResult:
        attn = self.attention.attn
        t0 = time.perf_counter()
        ids = torch.tensor([list(prompt)], device=self.device)
        last, xs = attention_inputs(self.target, ids)
        positions = torch.arange(len(prompt), device=self.device)
        for layer, (mla, x) in enumerate(zip(self.mla, xs)):
            attn.prefill(sequence_id, mla.latent_rows(x, positions, self.attention.kv_format),
                         layer_begin=layer, expected_fill=None if layer == 0 else 0)
        self.drafter.prefill(prompt)
        self._sync()
        result = DecodeResult([int(last.argmax())], margins=_margins(last[None]))
        decided = [last] if keep_logits else []
        result.prefill_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        n = len(prompt)
        while len(result.tokens) < max_new:
            root = result.tokens[-1]
            t_draft = time.perf_counter()
            tree = self.drafter.draft(root, n, self.budget)  # ends reading logits: synchronized
            result.draft_seconds += time.perf_counter() - t_draft
            attn.begin_step([(sequence_id, tree.parents)])
            tokens = torch.tensor(tree.tokens, device=self.device)
            depth = torch.tensor(tree.depths, device=self.device)
            logits = forward(self.target, self.mla, tokens, n + depth, self.attention)
            greedy = logits.argmax(-1).tolist()
            path = accept_path(tree, greedy)
            attn.end_step({sequence_id: path})
            self.drafter.accept(tree, path)
            result.tokens += [tree.tokens[i] for i in path[1:]] + [greedy[path[-1]]]
            result.margins += _margins(logits[path])
            if keep_logits:
                decided += [logits[i] for i in path]
            result.accepted.append(len(path))
            result.depths.append(max(tree.depths))
            n += len(path)
        attn.synchronize()
        attn.flush_commits()
        self._sync()
        result.decode_seconds = time.perf_counter() - t0
        attn.release(sequence_id)
        result.tokens = result.tokens[:max_new]
        result.margins = result.margins[:max_new]
        if keep_logits:
            result.logits = torch.stack(decided[:max_new])
        return result


def _load_transformers(path: str, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 - the CLI's dependency only
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device=device, dtype=dtype).eval()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="the daemon (unix:///... or host:port)")
    p.add_argument("--model", required=True, help="a DeepseekV3 checkpoint directory")
    p.add_argument("--transport", default="grpc", choices=["grpc", "shared_memory", "device"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    p.add_argument("--prompt", default="1,2,3,4,5,6,7,8", help="token ids, comma-separated")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--budget", type=int, default=16, help="draft-tree nodes per step")
    p.add_argument("--width", type=int, default=4, help="nodes added per tree level")
    p.add_argument("--draft-noise", type=float, default=0.1)
    p.add_argument("--draft-layers", type=int, default=None)
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    target = _load_transformers(args.model, dtype, args.device)
    drafter = Drafter(perturbed(target, args.draft_noise, seed=1), layers=args.draft_layers,
                      width=args.width)
    with Client(args.target) as client:
        attention = VerifydAttention(client, target.config.num_attention_heads, args.budget,
                                     transport=args.transport, device=torch.device(args.device))
        try:
            r = TreeDecoder(target, drafter, attention, args.budget).generate(
                1, [int(t) for t in args.prompt.split(",")], args.new_tokens)
        finally:
            attention.close()
    print(" ".join(map(str, r.tokens)))
    print(f"{r.steps} steps, {r.mean_accepted:.2f} tokens per step, acceptance "
          f"{r.acceptance:.2f}, {r.tokens_per_second:.1f} tokens/s, smallest margin "
          f"{min(r.margins):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
