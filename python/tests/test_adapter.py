"""verifyd.adapter.VerifyAttention: per-layer forward_verify into the engine's out, commits riding
on the next step's first Verify, a commit sent alone for a sequence that skips a step."""
import numpy as np
import pytest

import verifyd
from verifyd.adapter import VerifyAttention

from conftest import HEADS, LAYERS
from helpers import check_sequence, tree_inputs
from verifyd.tensors import random_bf16

torch = pytest.importorskip("torch")


def t(bits):
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)


class CountingStub:
    def __init__(self, client, name):
        self.inner = getattr(client._stub, name)
        self.requests = []
        setattr(client._stub, name, self)

    def __call__(self, request, **kwargs):
        self.requests.append(request)
        return self.inner(request, **kwargs)


@pytest.mark.parametrize("transport", ["grpc", "shared_memory"])
def test_commit_rides_on_next_step(daemon, seq_ids, rng, transport):
    with daemon.client() as c:
        verifies, commits = CountingStub(c, "Verify"), CountingStub(c, "Commit")
        attn = VerifyAttention(c, transport=transport)
        a, b = next(seq_ids), next(seq_ids)
        kv = {s: random_bf16(rng, (LAYERS, 16, 576)) for s in (a, b)}
        for s in (a, b):
            assert attn.prefill(s, t(kv[s])) == 16
        scale = c.stats().softmax_scale
        parents = {a: [-1, 0, 0], b: [-1, 0]}
        attn.begin_step([(a, parents[a]), (b, parents[b])])
        trees = []
        for layer in range(LAYERS):
            q, tkv = tree_inputs(rng, 5)
            out = torch.empty((5, HEADS, 512), dtype=torch.bfloat16)
            attn.forward_verify(layer, t(q), t(tkv), out)
            bits = out.view(torch.int16).numpy().view(np.uint16)
            check_sequence(bits[:3], kv[a][layer], tkv[:3], q[:3], parents[a], scale)
            check_sequence(bits[3:], kv[b][layer], tkv[3:], q[3:], parents[b], scale)
            trees.append(tkv)
        attn.end_step({a: [0, 2], b: [0, 1]})
        assert not commits.requests
        # Next step: only a. Its commit rides on layer 0's Verify; b's is sent alone now.
        attn.begin_step([(a, [-1])])
        assert len(commits.requests) == 1 and commits.requests[0].sequence_id == b
        assert attn.committed_length[b] == 18
        for layer in range(LAYERS):
            q, tkv = tree_inputs(rng, 1)
            out = np.empty((1, HEADS, 512), np.uint16)  # numpy out works too
            attn.forward_verify(layer, q, tkv, out)
            prefix = np.concatenate([kv[a][layer], trees[layer][[0, 2]]])
            check_sequence(out, prefix, tkv, q, [-1], scale)
        first, second = verifies.requests[-2:]
        assert first.sequences[0].HasField("commit_previous")
        assert list(first.sequences[0].commit_previous.accepted_path) == [0, 2]
        assert not second.sequences[0].HasField("commit_previous")
        assert attn.committed_length[a] == 18
        attn.end_step({a: []})
        attn.flush_commits()
        assert attn.committed_length[a] == 18
        for s in (a, b):
            attn.release(s)
        attn.close()


def test_forward_verify_needs_a_step(client):
    attn = VerifyAttention(client)
    with pytest.raises(verifyd.FailedPrecondition, match="before begin_step"):
        attn.forward_verify(0, None, None, None)
    with pytest.raises(verifyd.InvalidArgument, match="transport"):
        VerifyAttention(client, transport="carrier-pigeon")


def test_device_transport_on_host_buffers(daemon, seq_ids, rng):
    """transport="device" on the cpu backend: the engine's tensors are views of a registered
    host buffer (a sealed memfd); commits ride on the next step's first descriptor; errors raise with the
    gRPC path's code and message and leave NaN in out."""
    with daemon.client() as c:
        commits = CountingStub(c, "Commit")
        attn = VerifyAttention(c, transport="device")
        buf = c.host_buffer(4 << 20, torch=True)
        a, b = next(seq_ids), next(seq_ids)
        kv = {s: random_bf16(rng, (LAYERS, 16, 576)) for s in (a, b)}
        for s in (a, b):
            assert attn.prefill(s, t(kv[s])) == 16
        scale = c.stats().softmax_scale
        parents = {a: [-1, 0, 0], b: [-1, 0]}
        q_buf, kv_buf = buf.take((5, HEADS, 576)), buf.take((5, 576))
        out = buf.take((5, HEADS, 512))
        attn.begin_step([(a, parents[a]), (b, parents[b])])
        trees = []
        for layer in range(LAYERS):
            q, tkv = tree_inputs(rng, 5)
            q_buf.copy_(t(q))
            kv_buf.copy_(t(tkv))
            attn.forward_verify(layer, q_buf, kv_buf, out)
            bits = out.view(torch.int16).numpy().view(np.uint16)
            check_sequence(bits[:3], kv[a][layer], tkv[:3], q[:3], parents[a], scale)
            check_sequence(bits[3:], kv[b][layer], tkv[3:], q[3:], parents[b], scale)
            trees.append(tkv)
        attn.end_step({a: [0, 2], b: [0, 1]})
        attn.begin_step([(a, [-1]), (b, [-1])])
        for layer in range(LAYERS):
            q, tkv = tree_inputs(rng, 2)
            q_buf[:2].copy_(t(q))
            kv_buf[:2].copy_(t(tkv))
            o2 = out[:2]
            attn.forward_verify(layer, q_buf[:2], kv_buf[:2], o2)
            bits = o2.view(torch.int16).numpy().view(np.uint16)
            for k, (s, path) in enumerate(((a, [0, 2]), (b, [0, 1]))):
                prefix = np.concatenate([kv[s][layer], trees[layer][[0, 2] if s == a else
                                                                   [3, 4]]])
                check_sequence(bits[k:k + 1], prefix, tkv[k:k + 1], q[k:k + 1], [-1], scale)
        assert not commits.requests  # both commits rode on the channel
        assert attn.committed_length == {a: 18, b: 18}
        # A sequence the daemon does not know: NotFound as over gRPC, out NaN.
        attn.end_step({})
        attn.begin_step([(a + 10**9, [-1])])
        with pytest.raises(verifyd.NotFound) as e:
            attn.forward_verify(0, q_buf[:1], kv_buf[:1], out[:1])
        with pytest.raises(verifyd.NotFound) as g:
            c.verify(0, [(a + 10**9, [-1])], q_buf[:1], kv_buf[:1])
        assert e.value.message == g.value.message
        assert torch.isnan(out[:1].float()).all()
        # Tensors outside registered memory are named before anything is sent.
        attn.begin_step([(a, [-1])])
        with pytest.raises(verifyd.InvalidArgument, match="q .*not inside a buffer"):
            attn.forward_verify(0, t(tree_inputs(rng, 1)[0]), kv_buf[:1], out[:1])
        attn.end_step({})
        for s in (a, b):
            attn.release(s)
        attn.close()
        buf.release()
