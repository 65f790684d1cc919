"""Tree speculative decoding of a small DeepSeek-V3 (deepseek_tiny: YaRN, MoE layers) through a
CPU daemon: the tokens equal the model's own greedy decoding, on every transport and tree budget,
and every logit that decided a token is within verifyd's bf16 noise of the model's own
(teacher-forced) logits, a check that sees attention mistakes too small to move a token.

float32 (the arithmetic an engine runs; Debian's torch uses the reference BLAS, so float64 would
double the test's minute). The drafter: the target with perturbed weights."""
import pytest
import torch

from verifyd.tools.drafter import DraftTree, Drafter, perturbed
from verifyd.tools.tree_decode import TreeDecoder, VerifydAttention, accept_path

from conftest import Daemon
from deepseek_tiny import TinyConfig, tiny_model

CFG = TinyConfig()
PROMPTS = (23, 41, 64)
NEW_TOKENS = 32
BUDGETS = ((16, 4), (64, 8))  # (nodes, nodes per level)
DRAFT_NOISE = 0.1


@pytest.fixture(scope="module")
def model_daemon():
    d = Daemon("model", layers=CFG.num_hidden_layers, heads=CFG.num_attention_heads)
    yield d
    d.stop()
    assert d.proc.returncode == 0, d.log()


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=21, dtype=torch.float32, gains={"attention_gain": 0.01}).eval()


@pytest.fixture(scope="module")
def references(target):
    """Per prompt: the prompt, its greedy continuation and the float64 logits that decide it."""
    g = torch.Generator().manual_seed(22)
    out = []
    for length in PROMPTS:
        prompt = torch.randint(0, CFG.vocab_size, (length,), generator=g).tolist()
        tokens = target.greedy(prompt, NEW_TOKENS)
        with torch.no_grad():
            logits = target(torch.tensor([prompt + tokens]))[0, length - 1:-1]
        out.append((prompt, tokens, logits))
    return out


def decode(daemon, target, drafter, transport, budget, prompt, sid):
    with daemon.client() as c:
        attention = VerifydAttention(c, CFG.num_attention_heads, budget, transport=transport,
                                     device=torch.device("cpu"))
        try:
            return TreeDecoder(target, drafter, attention, budget).generate(
                sid, prompt, NEW_TOKENS, keep_logits=True)
        finally:
            attention.close()


@pytest.fixture(scope="module")
def draft_model(target):
    return perturbed(target, DRAFT_NOISE, seed=23)


# Every transport; the gRPC one over every prompt (the others repeat one, to stay quick).
@pytest.mark.parametrize("transport,prompts", [("grpc", (0, 1, 2)), ("shared_memory", (1,)),
                                               ("device", (2,))])
def test_tree_decoding_equals_greedy(model_daemon, target, draft_model, references, transport,
                                     prompts):
    sid = 1000 * (1 + ["grpc", "shared_memory", "device"].index(transport))
    report = []
    for budget, width in BUDGETS:
        for k in prompts:
            prompt, want, logits = references[k]
            r = decode(model_daemon, target, Drafter(draft_model, width=width), transport,
                       budget, prompt, sid + 10 * budget + k)
            assert r.tokens == want, f"budget {budget} prompt {k}: first difference at " \
                f"{next(i for i, (a, b) in enumerate(zip(r.tokens, want)) if a != b)}"
            deviation = float((r.logits - logits).abs().max())
            gap = torch.topk(logits, 2).values
            noise = 2 * (r.logits - logits).abs().max(-1).values
            room = float(((gap[:, 0] - gap[:, 1]) / noise).min())
            assert deviation < 2.5e-3 * float(logits.std()), (budget, k, deviation)
            assert 0 < r.acceptance < 1, r.accepted
            assert sum(r.accepted) >= NEW_TOKENS - 1 and r.steps < NEW_TOKENS
            report.append(f"budget {budget} prompt {len(prompt)}: {r.steps} steps, "
                          f"{r.mean_accepted:.2f} tokens/step, acceptance {r.acceptance:.2f}, "
                          f"smallest margin {min(r.margins):.3g}, logit deviation "
                          f"{deviation:.2g}, smallest margin / (2 x deviation) {room:.3g}")
    print("\n".join(report))


def test_a_perfect_drafter_is_always_accepted(model_daemon, target, references):
    """The target itself drafting a chain (its own attention in torch): every step accepts the
    whole chain, so the drafter's cache and pending tokens stay in step with the target's."""
    prompt, want, _ = references[0]
    r = decode(model_daemon, target, Drafter(target, width=1), "grpc", 6, prompt, 5000)
    assert r.tokens == want
    assert r.acceptance == 1.0 and all(a == d + 1 for a, d in zip(r.accepted, r.depths))


def test_drafter_trees_and_its_prefill(target, references):
    prompt, want, logits = references[1]
    drafter = Drafter(target, width=3)
    drafter.prefill(prompt[:-1])
    tree = drafter.draft(prompt[-1], len(prompt) - 1, 13)
    assert len(tree) == 13 and tree.parents[0] == -1
    assert all(0 <= p < i for i, p in enumerate(tree.parents) if i)
    assert all(tree.depths[i] == tree.depths[p] + 1 for i, p in enumerate(tree.parents) if i)
    # Siblings differ (a tree, not a multiset), and the root's best child is the greedy token.
    for p in range(len(tree)):
        kids = [tree.tokens[i] for i, q in enumerate(tree.parents) if q == p]
        assert len(kids) == len(set(kids))
    assert tree.tokens[1] == want[0]
    assert drafter.length == len(prompt)


def test_accept_path():
    tree = DraftTree(tokens=[5, 7, 8, 9, 7, 3], parents=[-1, 0, 0, 1, 2, 3],
                     depths=[0, 1, 1, 2, 2, 3], forwarded=[True] * 6)
    greedy = [8, 9, 7, 3, 0, 1]
    assert accept_path(tree, greedy) == [0, 2, 4]
    assert accept_path(tree, [7, 9, 0, 3, 0, 0]) == [0, 1, 3, 5]
    assert accept_path(tree, [1, 0, 0, 0, 0, 0]) == [0]
