"""Every call of verifyd.Client against the CPU daemon, outputs checked against float64."""
import numpy as np
import pytest

import verifyd
from verifyd.tensors import random_bf16

from conftest import HEADS, LAYERS, MAX_TREE_NODES
from helpers import check_sequence, prefill, tree_inputs


def test_health_and_stats(client):
    assert client.health() == "SERVING"
    s = client.stats()
    assert (s.backend, s.layers, s.heads, s.max_tree_nodes) == ("cpu", LAYERS, HEADS,
                                                                 MAX_TREE_NODES)
    assert s.capacity_tokens == 16384
    assert s.used_tokens + s.free_tokens + s.pending_tokens == s.capacity_tokens
    assert s.softmax_scale == pytest.approx(1 / np.sqrt(192), rel=1e-6)


def test_append_verify_commit_release(client, seq_ids, rng):
    sid = next(seq_ids)
    kv, r = prefill(client, sid, rng, 37)
    assert (r.committed_length, r.layer_fill, r.chunks) == (37, [37, 37], 1)
    scale = client.stats().softmax_scale
    parents = [-1, 0, 0, 1, -1, 4]
    trees = [tree_inputs(rng, len(parents)) for _ in range(LAYERS)]
    for layer, (q, tkv) in enumerate(trees):
        v = client.verify(layer, [(sid, parents)], q, tkv, return_lse=True)
        assert v.out.dtype == np.uint16 and v.out.shape == (6, HEADS, 512)
        assert v.lse.dtype == np.float32 and v.lse.shape == (6, HEADS)
        assert v.committed_length == [37]
        check_sequence(v.out, kv[layer], tkv, q, parents, scale, lse=v.lse)
    assert client.stats().pending_tokens >= 6
    assert client.commit(sid, [0, 1, 3]) == 40
    # The committed prefix now holds the accepted rows of each layer's tree_kv.
    q, tkv = tree_inputs(rng, 2)
    v = client.verify(0, [(sid, [-1, 0])], q, tkv)
    prefix0 = np.concatenate([kv[0], trees[0][1][[0, 1, 3]]])
    check_sequence(v.out, prefix0, tkv, q, [-1, 0], scale)
    assert client.commit(sid, []) == 40  # k = 0 rejects the tree (even half verified)
    assert client.release(sid) > 0
    with pytest.raises(verifyd.NotFound):
        client.release(sid)


def test_reject_whole_tree(client, seq_ids, rng):
    sid = next(seq_ids)
    prefill(client, sid, rng, 10)
    for layer in range(LAYERS):
        client.verify(layer, [(sid, [-1, 0])], *tree_inputs(rng, 2))
    assert client.commit(sid, []) == 10
    client.release(sid)


def test_batch_verify_with_riding_commit(client, seq_ids, rng):
    a, b = next(seq_ids), next(seq_ids)
    kv_a, _ = prefill(client, a, rng, 50)
    kv_b, _ = prefill(client, b, rng, 9)
    scale = client.stats().softmax_scale
    pa, pb_ = [-1, 0, 1, 1], [-1, -1, 0, 1, 2, 2, 0]
    trees = []
    for layer in range(LAYERS):
        q, tkv = tree_inputs(rng, len(pa) + len(pb_))
        v = client.verify(layer, [(a, pa), verifyd.VerifySequence(b, pb_)], q, tkv)
        assert v.committed_length == [50, 9]
        check_sequence(v.out[:4], kv_a[layer], tkv[:4], q[:4], pa, scale)
        check_sequence(v.out[4:], kv_b[layer], tkv[4:], q[4:], pb_, scale)
        trees.append(tkv)
    # Next step: the commits ride on the first Verify (a accepts 0→1→3, b rejects its tree).
    q, tkv = tree_inputs(rng, 3)
    v = client.verify(0, [verifyd.VerifySequence(a, [-1, 0], commit_previous=[0, 1, 3]),
                          verifyd.VerifySequence(b, [-1], commit_previous=[])], q, tkv)
    assert v.committed_length == [53, 9]
    check_sequence(v.out[:2], np.concatenate([kv_a[0], trees[0][[0, 1, 3]]]), tkv[:2], q[:2],
                   [-1, 0], scale)
    check_sequence(v.out[2:], kv_b[0], tkv[2:], q[2:], [-1], scale)
    for s in (a, b):
        client.release(s)


def test_softmax_scale_override(client, seq_ids, rng):
    sid = next(seq_ids)
    kv, _ = prefill(client, sid, rng, 20)
    q, tkv = tree_inputs(rng, 3)
    v = client.verify(1, [(sid, [-1, 0, 0])], q, tkv, softmax_scale=0.02)
    check_sequence(v.out, kv[1], tkv, q, [-1, 0, 0], 0.02)
    client.release(sid)


def test_chunked_append(daemon, seq_ids, rng):
    # 64 KiB messages: one token of 2 layers is 2304 bytes, so 28 tokens per chunk.
    with daemon.client(max_message_bytes=64 << 10) as c:
        sid = next(seq_ids)
        kv = random_bf16(rng, (LAYERS, 300, 576))
        r = c.append(sid, kv)
        assert r.chunks == 11 and r.committed_length == 300 and r.layer_fill == [300, 300]
        more = random_bf16(rng, (LAYERS, 40, 576))
        r = c.append(sid, more, expected_fill=300)
        assert r.chunks == 2 and r.committed_length == 340
        q, tkv = tree_inputs(rng, 4)
        with daemon.client() as big:  # Verify is not chunked: the default 64 MiB limit
            v = big.verify(1, [(sid, [-1, 0, 1, 0])], q, tkv)
            check_sequence(v.out, np.concatenate([kv[1], more[1]]), tkv, q, [-1, 0, 1, 0],
                           big.stats().softmax_scale)
        c.release(sid)


def test_append_per_layer_range(client, seq_ids, rng):
    sid = next(seq_ids)
    kv0 = random_bf16(rng, (1, 12, 576))
    r = client.append(sid, kv0, layer_begin=0)
    assert r.layer_fill == [12, 0] and r.committed_length == 0
    r = client.append(sid, random_bf16(rng, (12, 576)), layer_begin=1, expected_fill=0)
    assert r.layer_fill == [12, 12] and r.committed_length == 12
    client.release(sid)


def test_compaction_with_progress(client, seq_ids, rng):
    ids = [next(seq_ids) for _ in range(3)]
    for s in ids:
        prefill(client, s, rng, 30)
    # Fragment: a tree's accepted nodes land in slots after the other sequences.
    for layer in range(LAYERS):
        client.verify(layer, [(ids[0], [-1, 0, 1])], *tree_inputs(rng, 3))
    client.commit(ids[0], [0, 1, 2])
    client.release(ids[1])
    op = client.compact(0)
    assert op
    seen = []
    status = client.wait_compaction(op, poll_interval=0.01, on_progress=seen.append)
    assert status.state == status.DONE and seen and seen[-1].state == status.DONE
    assert status.after.fragmented_ratio <= status.before.fragmented_ratio
    again = client.get_compaction(op)
    assert again.operation_id == op and again.state == again.DONE
    for s in (ids[0], ids[2]):
        client.release(s)


def test_context_manager_and_options(daemon):
    with verifyd.Client(daemon.target, timeout=5, retries=0, retry_backoff=0.01) as c:
        assert c.health() == "SERVING"
        assert c.health("verifyd.v1.Verifyd") in ("SERVING", "SERVICE_UNKNOWN")
