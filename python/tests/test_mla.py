"""verifyd.mla against the eager (non-absorbed) DeepSeek-V3 attention of deepseek_tiny, written
the way transformers computes it: in float64 to float64 precision, and through a CPU daemon
within the bound of SPEC §1."""
import numpy as np
import pytest
import torch

from verifyd.mla import MlaLayer, ROW_FORMATS, rope_parameters, softmax_scale, yarn_mscale
from verifyd.tools.drafter import absorbed_attention

from conftest import Daemon
from deepseek_tiny import TinyConfig, tiny_model

YARN_V3 = TinyConfig().rope_scaling
VARIANTS = {
    "deepseek_v3": {},
    "q_proj_no_lora": {"q_lora_rank": None},
    "rope_halves": {"rope_interleave": False},
    "yarn_mscale_differs": {"rope_scaling": dict(YARN_V3, mscale=0.9, mscale_all_dim=0.707)},
    "yarn_factor_only": {"rope_scaling": {"type": "yarn", "factor": 8.0,
                                          "original_max_position_embeddings": 4096},
                         "max_position_embeddings": 32768},
    "no_rope_scaling": {"rope_scaling": None},
    "attention_bias": {"attention_bias": True},
}


def eager_layer(model, x, positions, mask):
    """The tiny model's layer-0 attention (float64 softmax) on x [1, T, d] at positions [T]."""
    attn = model.model.layers[0].self_attn
    attn.softmax_dtype = torch.float64
    pe = model.model.rotary_emb(x, positions[None])
    return attn(x, pe, mask[None, None])[0][0]


def additive(visible):
    return torch.zeros(visible.shape, dtype=torch.float64).masked_fill(~visible, float("-inf"))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_absorbed_equals_eager_float64(variant):
    model = tiny_model(seed=3, **VARIANTS[variant])
    cfg = model.config
    g = torch.Generator().manual_seed(11)
    t = 45
    x = torch.randn(1, t, cfg.hidden_size, generator=g, dtype=torch.float64)
    positions = torch.arange(t) + 7000  # beyond YaRN's original 4096 positions
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    want = eager_layer(model, x, positions, additive(causal))
    layer = MlaLayer.from_module(model.model.layers[0].self_attn)
    q, rows = layer.queries(x[0], positions), layer.latent(x[0], positions)
    assert q.shape == (t, cfg.num_attention_heads, 576) and rows.shape == (t, 576)
    got = layer.project(absorbed_attention(q, rows, causal, layer.softmax_scale))
    error = float((got - want).abs().max() / want.abs().max())
    assert error < 1e-12, f"{variant}: relative error {error:.3g}"
    assert layer.softmax_scale == pytest.approx(model.model.layers[0].self_attn.scaling, 1e-15)
    assert torch.equal(layer.rope.inv_freq, model.model.rotary_emb.inv_freq)
    assert layer.rope.attention_scaling == pytest.approx(
        model.model.rotary_emb.attention_scaling, 1e-15)


def test_softmax_scale_of_the_released_configs():
    """DeepSeek-V3 / R1: qk_head_dim 192, YaRN factor 40, mscale_all_dim 1; Kimi K2: factor 32."""
    class Cfg:
        qk_nope_head_dim, qk_rope_head_dim, rope_theta = 128, 64, 10000.0
    v3 = Cfg()
    v3.rope_scaling = {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                       "original_max_position_embeddings": 4096}
    assert softmax_scale(v3) == pytest.approx(192 ** -0.5 * (0.1 * np.log(40) + 1) ** 2, 1e-15)
    assert rope_parameters(v3)["rope_type"] == "yarn"  # "type" spelled the old way
    k2 = Cfg()
    k2.rope_parameters = {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 32.0,
                          "mscale_all_dim": 1.0}
    assert softmax_scale(k2) == pytest.approx(192 ** -0.5 * yarn_mscale(32.0) ** 2, 1e-15)
    plain = Cfg()
    plain.rope_scaling = None
    assert softmax_scale(plain) == pytest.approx(192 ** -0.5, 1e-15)


def test_latent_rows_and_the_fp8_seam():
    model = tiny_model(seed=4)
    layer = MlaLayer.from_module(model.model.layers[0].self_attn)
    x = torch.randn(5, model.config.hidden_size, dtype=torch.float64)
    rows = layer.latent_rows(x, torch.arange(5))
    assert rows.dtype == torch.bfloat16
    assert torch.equal(rows, layer.latent(x, torch.arange(5)).to(torch.bfloat16))
    assert set(ROW_FORMATS) == {"bf16", "fp8"}
    with pytest.raises(NotImplementedError, match="656 bytes"):
        layer.latent_rows(x, torch.arange(5), "fp8")
    with pytest.raises(ValueError, match="kv_format"):
        layer.latent_rows(x, torch.arange(5), "int4")


def test_from_state_dict_names_and_geometry_checks():
    model = tiny_model(seed=5)
    sd = model.state_dict()
    layer = MlaLayer.from_state_dict(sd, model.config, "model.layers.1.self_attn.")
    assert layer.w["kv_b_proj.weight"] is not None
    with pytest.raises(KeyError, match="kv_b_proj"):
        MlaLayer.from_state_dict({k: v for k, v in sd.items() if "kv_b_proj" not in k},
                                 model.config, "model.layers.1.self_attn.")
    with pytest.raises(ValueError, match="kv_lora_rank = 256"):
        cfg = TinyConfig()
        cfg.kv_lora_rank = 256
        MlaLayer.from_state_dict(sd, cfg, "model.layers.1.self_attn.")


@pytest.fixture(scope="module")
def mla_daemon():
    d = Daemon("mla", layers=1, heads=TinyConfig().num_attention_heads)
    yield d
    d.stop()
    assert d.proc.returncode == 0, d.log()


def tree_positions(parents, n):
    depth = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return n + torch.tensor(depth)


@pytest.mark.parametrize("transport", ["grpc", "shared_memory"])
def test_layer_through_verifyd_matches_float64(mla_daemon, transport):
    """A prefix appended as bf16 rows, then a draft tree verified: W_UV + o_proj of verifyd's out
    against the eager layer in float64 over prefix + tree (each node seeing the prefix and its
    ancestors). Tree nodes placed at n + their index instead of n + depth miss the bound."""
    from verifyd.adapter import VerifyAttention  # noqa: PLC0415
    model = tiny_model(seed=6, attention_bias=True)
    cfg = model.config
    layer = MlaLayer.from_module(model.model.layers[0].self_attn)
    g = torch.Generator().manual_seed(12)
    n, parents = 150, [-1, 0, 0, 1, 1, 3, 2, 6, -1]
    q_nodes = len(parents)
    x = torch.randn(n + q_nodes, cfg.hidden_size, generator=g, dtype=torch.float64)
    positions = torch.cat((torch.arange(n), tree_positions(parents, n)))
    visible = torch.ones(n + q_nodes, n + q_nodes, dtype=torch.bool).tril()
    visible[n:, n:] = False
    for i, p in enumerate(parents):
        visible[n + i, n + i] = True
        while p >= 0:
            visible[n + i, n + p] = True
            p = parents[p]
    want = eager_layer(model, x[None], positions, additive(visible))[n:]
    errors = {}
    with mla_daemon.client() as c:
        attn = VerifyAttention(c, transport=transport, softmax_scale=layer.softmax_scale)
        for name, pos in (("depth", positions), ("index", torch.cat((torch.arange(n),
                                                                     n + torch.arange(q_nodes))))):
            sid = 7 if name == "depth" else 8
            attn.prefill(sid, layer.latent_rows(x[:n], pos[:n])[None])
            attn.begin_step([(sid, parents)])
            out = torch.empty(q_nodes, cfg.num_attention_heads, 512, dtype=torch.bfloat16)
            attn.forward_verify(0, layer.queries(x[n:], pos[n:]).to(torch.bfloat16),
                                layer.latent_rows(x[n:], pos[n:]), out)
            got = layer.project(out, torch.float64)
            errors[name] = float((got - want).norm() / want.norm())
            attn.end_step({sid: [0, 1, 3]})
            attn.flush_commits()
            assert attn.committed_length[sid] == n + 3
            attn.release(sid)
        attn.close()
    assert errors["depth"] < 1e-2, errors
    assert errors["index"] > 0.1, errors  # the same check sees a position mistake
