"""verifyd.adapter.CapturedVerify on the cpu backend (plans/0033): the captured step's protocol
with its host versions (the same step area, record, ready / done values and faults the CUDA
kernels use), >= 50 steps with trees that change every step and riding commits, every output
element against the float64 reference; refusals at init naming the field and bound; a replay
after the capture ended raises instead of returning stale outputs."""
import numpy as np
import pytest

import verifyd
from verifyd.adapter import CapturedVerify

from conftest import HEADS, LAYERS, MAX_TREE_NODES
from helpers import check_sequence, tree_inputs
from verifyd.tensors import random_bf16

MAX_BATCH, MAX_Q = 3, 6


def bucket(c, rows=MAX_BATCH * MAX_Q):
    buf = c.host_buffer(8 << 20)
    return buf, dict(q=buf.take((rows, HEADS, 576)), tree_kv=buf.take((rows, 576)),
                     out=buf.take((rows, HEADS, 512)))


def random_tree(rng, nodes, shape):
    if shape == 0:
        return [i - 1 for i in range(nodes)]                          # chain
    if shape == 1:
        return [-1] + [0] * (nodes - 1)                               # star
    if shape == 2:
        return [-1 if i % 2 == 0 else i - 1 for i in range(nodes)]    # forest
    return [-1] + [int(rng.integers(0, i)) for i in range(1, nodes)]  # bush


def random_path(rng, parents):
    node = int(rng.integers(0, len(parents) + 1)) - 1   # -1: reject the whole tree
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def test_steps_match_the_reference_with_changing_trees_and_riding_commits(daemon, seq_ids, rng):
    with daemon.client() as c:
        scale = c.stats().softmax_scale
        seqs = [next(seq_ids) for _ in range(MAX_BATCH)]
        prefix = {}
        for s in seqs:
            kv = random_bf16(rng, (LAYERS, 5 + int(rng.integers(0, 20)), 576))
            c.append(s, kv)
            prefix[s] = [kv[layer] for layer in range(LAYERS)]
        buf, b = bucket(c)
        cv = CapturedVerify(c)
        try:
            cv.init(max_batch=MAX_BATCH, max_q=MAX_Q, **b)
            assert cv.num_layers == LAYERS
            for step in range(52):
                trees = [(s, random_tree(rng, 1 + int(rng.integers(0, MAX_Q)), (step + k) % 4))
                         for k, s in enumerate(seqs)]
                n = sum(len(p) for _, p in trees)
                cv.set_step(trees)
                cv.step_publish()
                tree_rows = []
                for layer in range(LAYERS):
                    q, tkv = tree_inputs(rng, n)
                    b["q"][:n] = q
                    b["tree_kv"][:n] = tkv
                    b["out"][:] = 0x1111  # stale bytes, never a result
                    cv.forward_verify(layer)
                    at = 0
                    for s, parents in trees:
                        k = len(parents)
                        check_sequence(b["out"][at:at + k], prefix[s][layer], tkv[at:at + k],
                                       q[at:at + k], parents, scale)
                        at += k
                    tree_rows.append(tkv)
                cv.check_replay()
                accepted, at = {}, 0
                for s, parents in trees:
                    path = random_path(rng, parents)
                    accepted[s] = path
                    for layer in range(LAYERS):
                        rows = tree_rows[layer][at:at + len(parents)][path]
                        prefix[s][layer] = np.concatenate([prefix[s][layer], rows])
                    at += len(parents)
                cv.end_step(accepted)
            # One more step carries the last commits; the daemon's lengths are the reference's.
            cv.set_step([(s, [-1]) for s in seqs])
            cv.step_publish()
            for layer in range(LAYERS):
                cv.forward_verify(layer)
            cv.check_replay()
            for s in seqs:
                assert c.commit(s, []) == len(prefix[s][0])
        finally:
            cv.close()
            buf.release()


def test_init_refuses_what_the_daemon_cannot_serve(daemon):
    with daemon.client() as c:
        buf, b = bucket(c)
        big_buf, big = bucket(c, MAX_TREE_NODES + 1)
        cv = CapturedVerify(c)
        try:
            with pytest.raises(verifyd.InvalidArgument) as e:   # the daemon's bound
                cv.init(max_batch=1, max_q=MAX_TREE_NODES + 1, **big)
            assert f"max_q = {MAX_TREE_NODES + 1}" in str(e.value)
            assert f"--max-tree-nodes = {MAX_TREE_NODES}" in str(e.value)
            with pytest.raises(verifyd.InvalidArgument) as e:   # out too small for the bucket
                cv.init(max_batch=MAX_BATCH, max_q=MAX_Q, q=b["q"], tree_kv=b["tree_kv"],
                        out=b["out"][:MAX_Q])
            assert "out has 6 rows" in str(e.value) and "needs 18" in str(e.value)
            unregistered = np.zeros((MAX_BATCH * MAX_Q, HEADS, 576), np.uint16)
            with pytest.raises(verifyd.InvalidArgument) as e:
                cv.init(max_batch=MAX_BATCH, max_q=MAX_Q, q=unregistered,
                        tree_kv=b["tree_kv"], out=b["out"])
            assert "not inside a buffer registered" in str(e.value)
            cv.init(max_batch=MAX_BATCH, max_q=MAX_Q, **b)   # nothing was held: it prepares
        finally:
            cv.close()
            buf.release()
            big_buf.release()


def test_a_replay_after_the_capture_ended_raises(daemon, seq_ids, rng):
    with daemon.client() as c:
        s = next(seq_ids)
        c.append(s, random_bf16(rng, (LAYERS, 8, 576)))
        buf, b = bucket(c)
        cv = CapturedVerify(c)
        try:
            cv.init(max_batch=MAX_BATCH, max_q=MAX_Q, **b)
            cv._channel.close()   # the daemon ends the capture (as at its restart)
            cv._channel = None
            cv.set_step([(s, [-1, 0])])
            cv.step_publish()
            b["out"][:] = 0x1111
            for layer in range(LAYERS):
                cv.forward_verify(layer)
            assert np.all((b["out"] & 0x7FC0) == 0x7FC0)   # NaN, not the stale bytes
            with pytest.raises(verifyd.FailedPrecondition) as e:
                cv.check_replay()
            assert "prepare the capture again" in str(e.value)
        finally:
            cv.close()
            buf.release()
