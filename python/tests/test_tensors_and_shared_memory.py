"""numpy and torch inputs/outputs; shared-memory regions and the in-place Verify layout."""
import numpy as np
import pytest

import verifyd
from verifyd.tensors import bf16_to_float32, float32_to_bf16, random_bf16

from conftest import HEADS, LAYERS
from helpers import check_sequence, prefill, tree_inputs

torch = pytest.importorskip("torch")


def as_torch(bits):
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)


def as_bits(t):
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def test_bf16_conversion_matches_torch(rng):
    x = (rng.standard_normal(10000) * 100).astype(np.float32)
    x[:4] = [np.inf, -np.inf, 0.0, -0.0]
    ours = float32_to_bf16(x)
    theirs = as_bits(torch.from_numpy(x).to(torch.bfloat16))
    assert np.array_equal(ours, theirs)
    assert np.array_equal(bf16_to_float32(ours), torch.from_numpy(x).to(torch.bfloat16).float()
                          .numpy())
    assert np.isnan(bf16_to_float32(float32_to_bf16(np.array([np.nan], np.float32))))[0]


def test_torch_in_torch_out(client, seq_ids, rng):
    sid = next(seq_ids)
    kv = random_bf16(rng, (LAYERS, 40, 576))
    assert client.append(sid, as_torch(kv)).committed_length == 40
    q, tkv = tree_inputs(rng, 5)
    parents = [-1, 0, 1, 0, 3]
    r = client.verify(1, [(sid, parents)], as_torch(q), as_torch(tkv), return_lse=True)
    assert r.out.dtype == torch.bfloat16 and tuple(r.out.shape) == (5, HEADS, 512)
    assert r.lse.dtype == torch.float32 and tuple(r.lse.shape) == (5, HEADS)
    check_sequence(as_bits(r.out), kv[1], tkv, q, parents, client.stats().softmax_scale,
                   lse=r.lse.numpy())
    # float32 torch and numpy inputs are rounded to bf16 exactly as torch does it.
    r32 = client.verify(1, [(sid, parents)], as_torch(q).float(), bf16_to_float32(tkv))
    assert torch.equal(r32.out.view(torch.int16), r.out.view(torch.int16))
    client.release(sid)


def test_numpy_bfloat16_like_and_int16_views(client, seq_ids, rng):
    sid = next(seq_ids)
    kv, _ = prefill(client, sid, rng, 12)
    q, tkv = tree_inputs(rng, 2)
    a = client.verify(0, [(sid, [-1, 0])], q, tkv).out
    b = client.verify(0, [(sid, [-1, 0])], q.view(np.int16), tkv.view(np.int16)).out
    assert np.array_equal(a, b)
    client.release(sid)


def test_shared_memory_region_life_cycle(client):
    region = client.create_shared_memory(1 << 20)
    assert region.mapped and region.size == 1 << 20 and region.path.startswith("/verifyd-")
    view = region.ndarray(64, np.uint16, (4, 8))
    view[...] = 7
    assert region.ndarray(64, np.uint16, (4, 8)).sum() == 7 * 32
    with pytest.raises(verifyd.InvalidArgument, match="multiple of 64"):
        region.ref(3, 10)
    with pytest.raises(verifyd.InvalidArgument, match="must be <= the region's"):
        region.ref(0, (1 << 20) + 1)
    region.release()
    assert not region.mapped
    region.release()  # twice is fine
    with pytest.raises(verifyd.NotFound, match="is not a live shared-memory region"):
        client.release_shared_memory(region.region)


def test_verify_shared_numpy_and_torch(client, seq_ids, rng):
    sid = next(seq_ids)
    kv, _ = prefill(client, sid, rng, 33)
    scale = client.stats().softmax_scale
    parents = [-1, 0, 0, 2]
    need = verifyd.shared_verify_bytes(4, HEADS, True)
    with client.create_shared_memory(need) as region:
        q, tkv = tree_inputs(rng, 4)
        r = client.verify_shared(0, [(sid, parents)], q, tkv, region, return_lse=True)
        assert r.out.dtype == np.uint16 and r.response.out.WhichOneof("data") == "shared_memory"
        check_sequence(r.out, kv[0], tkv, q, parents, scale, lse=r.lse)
        inline = client.verify(0, [(sid, parents)], q, tkv)
        assert np.array_equal(inline.out, r.out)  # same bytes both ways
        rt = client.verify_shared(1, [(sid, parents)], as_torch(q), as_torch(tkv), region)
        assert rt.out.dtype == torch.bfloat16
        check_sequence(as_bits(rt.out), kv[1], tkv, q, parents, scale)
        with pytest.raises(verifyd.InvalidArgument, match="needs .* bytes of shared memory"):
            big_q, big_kv = tree_inputs(rng, 40)
            client.verify_shared(0, [(sid, [-1] * 40)], big_q, big_kv, region)
    client.release(sid)


def test_verify_in_place_layout(client, seq_ids, rng):
    a, b = next(seq_ids), next(seq_ids)
    kv_a, _ = prefill(client, a, rng, 20)
    kv_b, _ = prefill(client, b, rng, 7)
    scale = client.stats().softmax_scale
    pa, pb_ = [-1, 0, 1], [-1, -1]
    layout = verifyd.shared_verify_layout(128, 5, HEADS, return_lse=True)
    assert layout.q == 128 and all(o % 64 == 0 for o in (layout.tree_kv, layout.out, layout.lse))
    with client.create_shared_memory(layout.end) as region:
        q, tkv = tree_inputs(rng, 5)
        # The producer writes straight into the region (torch views; no staging copy).
        region.tensor(layout.q, (5, HEADS, 576)).copy_(as_torch(q))
        region.tensor(layout.tree_kv, (5, 576)).copy_(as_torch(tkv))
        r = client.verify_shared_in_place(1, [(a, pa), (b, pb_)], layout, region,
                                          output="torch")
        assert r.committed_length == [20, 7]
        out = as_bits(r.out)
        check_sequence(out[:3], kv_a[1], tkv[:3], q[:3], pa, scale, lse=r.lse[:3].numpy())
        check_sequence(out[3:], kv_b[1], tkv[3:], q[3:], pb_, scale, lse=r.lse[3:].numpy())
        with pytest.raises(verifyd.InvalidArgument, match="the layout is for sum Q = 5"):
            client.verify_shared_in_place(1, [(a, pa)], layout, region)
    for s in (a, b):
        client.release(s)


def test_append_shared(client, seq_ids, rng):
    sid = next(seq_ids)
    kv = random_bf16(rng, (LAYERS, 50, 576))
    with client.create_shared_memory(kv.nbytes) as region:
        r = client.append_shared(sid, kv, region)
        assert r.committed_length == 50
        r = client.append_shared(sid, as_torch(kv[:, :10]), region, expected_fill=50)
        assert r.layer_fill == [60, 60]
    q, tkv = tree_inputs(rng, 1)
    out = client.verify(0, [(sid, [-1])], q, tkv).out
    check_sequence(out, np.concatenate([kv[0], kv[0, :10]]), tkv, q, [-1],
                   client.stats().softmax_scale)
    client.release(sid)
