"""Shared test helpers: random bf16 inputs (never zeros) and the float64 reference check."""
import numpy as np

from verifyd.reference import check_close, verify_reference
from verifyd.tensors import random_bf16

from conftest import HEADS, LAYERS


def prefill(client, sid, rng, tokens, layers=LAYERS, **kwargs):
    kv = random_bf16(rng, (layers, tokens, 576))
    r = client.append(sid, kv, **kwargs)
    return kv, r


def tree_inputs(rng, q_nodes, heads=HEADS):
    return random_bf16(rng, (q_nodes, heads, 576)), random_bf16(rng, (q_nodes, 576))


def check_sequence(out_bits, prefix_kv_layer, tree_kv, q, parents, scale, lse=None):
    o, ref_lse = verify_reference(prefix_kv_layer, tree_kv, q, parents, scale)
    return check_close(np.asarray(out_bits), o, lse=lse, ref_lse=ref_lse if lse is not None
                       else None)
