"""A drafter for tree speculative decoding: a model of the target's family that proposes a draft
tree per step, with its own attention (absorbed MLA in torch) over its own latent cache.

The drafter is the target with perturbed weights (`perturbed`), optionally cut to its first k
layers (a smaller model of the same family, cheaper to run): close enough to the target that many
drafted tokens are accepted, different enough that not all are.

A tree grows level by level from the root (the token the target chose last, at the committed
length n): at each level every frontier node's `width` most likely next tokens are candidates and
the `width` candidates of highest path log-probability join the tree, until `budget` nodes. Nodes
come in breadth-first order, so parents[i] < i (verifyd's rule). A level's nodes run through the
drafter together, each seeing the committed prefix and its own ancestors (SPEC §1's tree mask).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

from ..mla import LATENT_DIM, MlaLayer
from .model_layers import forward, mla_layers

__all__ = ["absorbed_attention", "perturbed", "DraftTree", "Drafter"]


def absorbed_attention(q: torch.Tensor, keys: torch.Tensor, visible: Optional[torch.Tensor],
                       scale: float) -> torch.Tensor:
    """SPEC §1 in torch: q [T, H, 576] over key rows [S, 576] (values: their first 512), where
    visible [T, S] (bool) says which keys each query sees (None: all) -> [T, H, 512]."""
    s = torch.einsum("thc,sc->ths", q, keys) * scale
    if visible is not None:
        s = s.masked_fill(~visible[:, None, :], float("-inf"))
    return torch.einsum("ths,sc->thc", torch.softmax(s, dim=-1), keys[:, :LATENT_DIM])


@torch.no_grad()
def perturbed(model, noise: float, seed: int):
    """A copy of `model` whose every weight w becomes w + noise * std(w) * N(0, 1)."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    for p in other.parameters():
        scale = float(p.float().std()) if p.numel() > 1 else 1.0
        p.add_((torch.randn(p.shape, generator=g) * (noise * scale)).to(p.dtype).to(p.device))
    return other


@dataclass
class DraftTree:
    tokens: List[int]
    parents: List[int]
    depths: List[int]
    forwarded: List[bool]      # the drafter computed this node's rows (all but the last level)
    rows: List[torch.Tensor] = field(default_factory=list)  # per layer [nodes, 576]

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter:
    """`model`: DeepseekV3-structured (usually `perturbed(target, ...)`); `layers`: how many of its
    layers to run (None: all)."""

    def __init__(self, model, *, layers: Optional[int] = None, width: int = 4):
        self.model = model
        self.mla: List[MlaLayer] = mla_layers(model, layers)
        self.width = width
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.cache: List[torch.Tensor] = [torch.empty(0, 576, dtype=self.dtype,
                                                      device=self.device) for _ in self.mla]
        self.pending: List[int] = []  # committed tokens the drafter has not run yet

    @property
    def length(self) -> int:
        return int(self.cache[0].shape[0])

    def _chain(self, tokens: Sequence[int], start: int) -> torch.Tensor:
        """Runs a chain of committed tokens at positions start.. (causal), appends their rows to
        the cache; the last token's logits."""
        t = torch.tensor(list(tokens), device=self.device)
        pos = torch.arange(start, start + len(tokens), device=self.device)
        n = self.length
        causal = torch.ones(len(tokens), n + len(tokens), dtype=torch.bool,
                            device=self.device).tril(n)
        new_rows = []

        def attention(i, layer, x, positions):
            rows = layer.latent(x, positions)
            new_rows.append(rows)
            keys = torch.cat((self.cache[i], rows))
            return layer.project(absorbed_attention(layer.queries(x, positions), keys, causal,
                                                    layer.softmax_scale), x.dtype)
        logits = forward(self.model, self.mla, t, pos, attention)
        self.cache = [torch.cat((c, r)) for c, r in zip(self.cache, new_rows)]
        return logits[-1]

    @torch.no_grad()
    def prefill(self, prompt: Sequence[int], chunk: int = 1024) -> None:
        for start in range(0, len(prompt), chunk):
            self._chain(prompt[start:start + chunk], start)

    @torch.no_grad()
    def draft(self, root: int, position: int, budget: int) -> DraftTree:
        """The tree rooted at `root` (the committed length is `position`: the root's position)."""
        if self.length + len(self.pending) != position:
            raise ValueError(f"drafter holds {self.length} + {len(self.pending)} pending tokens, "
                             f"the root sits at {position}")
        logits = self._chain(self.pending + [root], position - len(self.pending))[None]
        self.pending = []
        tree = DraftTree([root], [-1], [0], [True],
                         [torch.zeros(budget, 576, dtype=self.dtype, device=self.device)
                          for _ in self.mla])
        ancestors = torch.zeros(budget, budget, dtype=torch.bool, device=self.device)
        ancestors[0, 0] = True
        score = [0.0]
        frontier = [0]
        while len(tree) < budget:
            top = torch.topk(torch.log_softmax(logits.float(), dim=-1), self.width, dim=-1)
            values, indices = top.values.tolist(), top.indices.tolist()  # one copy each
            candidates = sorted(
                ((score[f] + v, f, t) for k, f in enumerate(frontier)
                 for v, t in zip(values[k], indices[k])), reverse=True)
            frontier = []
            for s, parent, token in candidates[:min(self.width, budget - len(tree))]:
                i = len(tree)
                tree.tokens.append(token)
                tree.parents.append(parent)
                tree.depths.append(tree.depths[parent] + 1)
                tree.forwarded.append(False)
                ancestors[i] = ancestors[parent]
                ancestors[i, i] = True
                score.append(s)
                frontier.append(i)
            if len(tree) >= budget:
                break
            logits = self._level(tree, frontier, ancestors, position)
        return tree

    def _level(self, tree: DraftTree, nodes: List[int], ancestors: torch.Tensor,
               position: int) -> torch.Tensor:
        """Runs one level's nodes; their logits [len(nodes), vocab]. The root's row is in the
        cache already, so the tree part of the keys is nodes 1..; rows not computed yet are
        nobody's ancestors and stay masked."""
        idx = torch.tensor(nodes, device=self.device)
        t = torch.tensor([tree.tokens[i] for i in nodes], device=self.device)
        pos = torch.tensor([position + tree.depths[i] for i in nodes], device=self.device)
        n = self.length
        visible = torch.cat((torch.ones(len(nodes), n, dtype=torch.bool, device=self.device),
                             ancestors[idx, 1:len(tree)]), dim=1)

        def attention(i, layer, x, positions):
            tree.rows[i][idx] = layer.latent(x, positions)
            keys = torch.cat((self.cache[i], tree.rows[i][1:len(tree)]))
            return layer.project(absorbed_attention(layer.queries(x, positions), keys, visible,
                                                    layer.softmax_scale), x.dtype)
        logits = forward(self.model, self.mla, t, pos, attention)
        for i in nodes:
            tree.forwarded[i] = True
        return logits

    def accept(self, tree: DraftTree, path: Sequence[int]) -> None:
        """The target committed `path` (root first): the rows the drafter computed for it join
        its cache (the root's already did); the rest wait for the next draft."""
        done = [i for i in path[1:] if tree.forwarded[i]]
        if done:
            idx = torch.tensor(done, device=self.device)
            self.cache = [torch.cat((c, r[idx])) for c, r in zip(self.cache, tree.rows)]
        self.pending = [tree.tokens[i] for i in path[1:] if not tree.forwarded[i]]
        if any(tree.forwarded[i] for i in path[1 + len(done):]):
            raise AssertionError("a computed node after one that was not")
