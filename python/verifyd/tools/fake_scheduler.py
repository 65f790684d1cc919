"""A Python fake scheduler: real decode loops through verifyd.adapter.VerifyAttention, every
output checked against the float64 numpy reference of SPEC §1 (verifyd.reference).

Per run: prefill each sequence (random bf16 KV, chunked Append), then steps of: a random draft
tree per sequence → begin_step → per layer (q, tree_kv random bf16; a small GEMM on the
scheduler's side as a stand-in for the model's other layers) forward_verify into a preallocated
out → check → pick an accepted path (sometimes reject the whole tree) → end_step (the commit
rides on the next step's first Verify). A shadow copy of every layer's committed KV gives the
reference. At the end the committed lengths are compared and the sequences released.

    python -m verifyd.tools.fake_scheduler --target unix:///run/verifyd/verifyd-0.sock --steps 5

`--transport device` puts q, tree_kv, out and lse in a registered /dev/shm buffer and goes through
the data plane's channel (cpu backend; verifyd.dataplane).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from ..adapter import VerifyAttention
from ..client import Client
from ..reference import check_close, verify_reference
from ..tensors import ROW, V_DIM, random_bf16


def random_tree(rng: np.random.Generator, nodes: int) -> List[int]:
    """parents[i] = -1 (a root) or an index < i; node 0 is always a root."""
    parents = [-1]
    for i in range(1, nodes):
        parents.append(-1 if rng.random() < 0.1 else int(rng.integers(0, i)))
    return parents


def random_path(rng: np.random.Generator, parents: List[int]) -> List[int]:
    """A root-to-node path (root first), or [] (reject) one time in eight."""
    if rng.random() < 0.125:
        return []
    node = int(rng.integers(0, len(parents)))
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


@dataclass
class Report:
    steps: int = 0
    verifies: int = 0
    outputs_checked: int = 0
    worst_relative_error: float = 0.0
    seconds: float = 0.0
    committed: Dict[int, int] = field(default_factory=dict)


def run(client: Client, *, sequences: int = 3, steps: int = 4, layers: Optional[int] = None,
        heads: Optional[int] = None, prefill_tokens=(40, 200), tree_nodes=(2, 17),
        transport: str = "grpc", tensors: str = "torch", seed: int = 1, first_id: int = 1000,
        release: bool = True, log=None) -> Report:
    stats = client.stats()
    layers = layers or stats.layers
    heads = heads or stats.heads
    scale = stats.softmax_scale
    rng = np.random.default_rng(seed)
    use_torch = tensors == "torch"
    if use_torch:
        import torch  # noqa: PLC0415
    attn = VerifyAttention(client, transport=transport, return_lse=True)
    buf = None
    if transport == "device":
        # The engine's tensors live in registered memory: on the cpu backend a /dev/shm buffer
        # (on the cuda backend it would be a registered CUDA pool), sized for the largest step.
        max_q = sequences * (tree_nodes[1] - 1)
        buf = client.host_buffer(max_q * heads * (ROW + V_DIM) * 2 + max_q * ROW * 2
                                 + max_q * heads * 4 + 4 * 64, torch=use_torch)
    ids = [first_id + i for i in range(sequences)]
    prefix: Dict[int, List[np.ndarray]] = {}
    report = Report()
    start = time.monotonic()
    try:
        for s in ids:
            kv = random_bf16(rng, (layers, int(rng.integers(*prefill_tokens)), ROW))
            kv_in = torch.from_numpy(kv.view(np.int16)).view(torch.bfloat16) if use_torch else kv
            attn.prefill(s, kv_in)
            prefix[s] = [kv[l].copy() for l in range(layers)]
        weight = rng.standard_normal((64, 64)).astype(np.float32)
        for step in range(steps):
            batch = [(s, random_tree(rng, int(rng.integers(*tree_nodes)))) for s in ids]
            total_q = sum(len(p) for _, p in batch)
            attn.begin_step(batch)
            tree_kv_by_layer = []
            for layer in range(layers):
                q = random_bf16(rng, (total_q, heads, ROW))
                tree_kv = random_bf16(rng, (total_q, ROW))
                if use_torch:
                    tq = torch.from_numpy(q.view(np.int16)).view(torch.bfloat16)
                    tkv = torch.from_numpy(tree_kv.view(np.int16)).view(torch.bfloat16)
                    out = torch.empty((total_q, heads, V_DIM), dtype=torch.bfloat16)
                    lse = torch.empty((total_q, heads), dtype=torch.float32)
                    wt = torch.from_numpy(weight)
                    _ = wt @ wt  # the model's other layers (a GEMM) between Verify calls
                else:
                    tq, tkv = q, tree_kv
                    out = np.empty((total_q, heads, V_DIM), dtype=np.uint16)
                    lse = np.empty((total_q, heads), dtype=np.float32)
                    _ = weight @ weight
                if buf is not None:  # into the registered buffer (the engine writes there)
                    buf.reset()
                    dq, dkv = buf.take((total_q, heads, ROW)), buf.take((total_q, ROW))
                    out, lse = buf.take((total_q, heads, V_DIM)), buf.take((total_q, heads),
                                                                           "float32")
                    if use_torch:
                        dq.copy_(tq)
                        dkv.copy_(tkv)
                    else:
                        dq[...], dkv[...] = q, tree_kv
                    tq, tkv = dq, dkv
                attn.forward_verify(layer, tq, tkv, out, lse)
                report.verifies += 1
                out_bits = (out.view(torch.int16).numpy().view(np.uint16) if use_torch else out)
                lse_np = lse.numpy() if use_torch else lse
                row = 0
                for s, parents in batch:
                    n = len(parents)
                    ref_o, ref_lse = verify_reference(prefix[s][layer], tree_kv[row:row + n],
                                                      q[row:row + n], parents, scale)
                    err = check_close(out_bits[row:row + n], ref_o,
                                      f"step {step} layer {layer} sequence {s}",
                                      lse=lse_np[row:row + n], ref_lse=ref_lse)
                    report.worst_relative_error = max(report.worst_relative_error, err)
                    report.outputs_checked += out_bits[row:row + n].size
                    row += n
                tree_kv_by_layer.append(tree_kv)
            accepted = {}
            row = 0
            for s, parents in batch:
                path = random_path(rng, parents)
                accepted[s] = path
                for layer in range(layers):
                    rows = tree_kv_by_layer[layer][row:row + len(parents)][path]
                    prefix[s][layer] = np.concatenate([prefix[s][layer], rows.reshape(-1, ROW)])
                row += len(parents)
            attn.end_step(accepted)
            report.steps += 1
            if log:
                log(f"step {step}: sum Q = {total_q}, committed "
                    f"{[attn.committed_length[s] for s in ids]}, worst relative error "
                    f"{report.worst_relative_error:.2e}")
        attn.flush_commits()
        for s in ids:
            want = len(prefix[s][0])
            got = attn.committed_length[s]
            if got != want:
                raise AssertionError(f"sequence {s}: committed length {got}, shadow has {want}")
            report.committed[s] = got
    finally:
        if release:
            for s in ids:
                try:
                    attn.release(s)
                except Exception:  # noqa: BLE001 - cleanup
                    pass
        attn.close()
        if buf is not None:
            buf.release()
    report.seconds = time.monotonic() - start
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="unix:///run/verifyd/verifyd-0.sock")
    p.add_argument("--sequences", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--transport", choices=("grpc", "shared_memory", "device"), default="grpc")
    p.add_argument("--tensors", choices=("torch", "numpy"), default="torch")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-message-bytes", type=int, default=64 << 20)
    args = p.parse_args(argv)
    with Client(args.target, max_message_bytes=args.max_message_bytes) as client:
        r = run(client, sequences=args.sequences, steps=args.steps, transport=args.transport,
                tensors=args.tensors, seed=args.seed, log=print)
    print(f"OK: {r.steps} steps, {r.verifies} Verify calls, {r.outputs_checked} output values "
          f"checked, worst relative error {r.worst_relative_error:.2e}, {r.seconds:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
