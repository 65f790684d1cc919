#!/usr/bin/env python3
"""A real model on verifyd (issue 36, plans/0025): transformers' DeepSeek-V3 decoding with draft
trees through a cuda daemon, token for token against transformers' own greedy generate.

Needs transformers (5.x), safetensors and torch with CUDA (the GPU hosts have them; nothing is
downloaded: the model is made here). Each check prints PASS/FAIL; a summary table comes last;
results go to $OUT/real_model.json (and the log's lines to stdout). Run from the bundle
(tools/device/make_bundle.sh), like python_dataplane_gpu.py:

    python3 tools/device/real_model_gpu.py --verifyd bundle/bin/verifyd \\
        --daemon-ld-path bundle/lib --python bundle/python \\
        --lib bundle/pylib/libverifyd_dataplane.so          # or --installed (a wheel)
    ... --quick                                            # small settings, about a minute

Checks:
  checkpoint  a random-weight DeepseekV3 (YaRN rope scaling as the released configs have, MoE
              layers after a dense one) written as a Hugging Face checkpoint (config.json +
              model.safetensors, the released checkpoints' names), loaded with transformers'
              AutoModelForCausalLM: no weight missing, unexpected or resized; the plain-torch
              model CI decodes (python/tests/deepseek_tiny.py) gives transformers' logits
  attention   every layer, float64: deepseek_tiny's attention == transformers'
              DeepseekV3Attention (eager) to 1e-12; verifyd.mla's absorbed form == transformers'
              (sdpa, whose softmax is float64) to 1e-12 and == eager (float32 softmax) to 1e-6;
              the RoPE frequencies, YaRN's cos/sin factor and the softmax scale are transformers'
  margins     the weights' scales (o_proj small: attention's share of the logits, plans/0025)
              against verifyd's bf16 rounding, emulated on a random sequence: the noise it puts
              on the logits, against generate's top-1 margins
  decode      every prompt x tree budget: tree decoding through verifyd (device transport: the
              engine's tensors in registered CUDA memory, stream-ordered) == generate(
              do_sample=False) with transformers' eager attention, token for token; the logits
              that decided each token against generate's
  acceptance  strictly between 0 and 1 in every run; tokens per step
  speed       at the longest prompt: tokens/s of tree decoding and of generate (decode only),
              tokens per step, the drafter's share of the step
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# A DeepSeek-V3 in miniature: the real head geometry (kv_lora_rank 512, rope 64, nope 128, v 128,
# q_lora_rank), 8 heads (one tensor-parallel rank of Kimi K2), DeepSeek-V3's YaRN (factor 40 over
# 4096 original positions), one dense layer then MoE layers with group-limited routing.
MODEL = dict(vocab_size=4096, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=256,
             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8, q_lora_rank=384,
             qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=16, n_group=4, topk_group=2,
             num_experts_per_tok=4, first_k_dense_replace=1)
FULL = dict(prompts=[256, 2048, 32768], new_tokens=200, budgets=[16, 64])
QUICK = dict(prompts=[64, 700], new_tokens=32, budgets=[16])
RESULTS: dict = {"checks": {}}
DEVICE = "cuda"  # --device cpu: the same run on a CPU daemon (a dry run of this script)


def log(*a) -> None:
    print(*a, flush=True)


def setup_path(args) -> None:
    if not args.installed:
        sys.path.insert(0, args.python or os.path.join(REPO, "python"))
        if args.lib:
            os.environ["VERIFYD_DATAPLANE_LIB"] = args.lib
    sys.path.append(os.path.join(REPO, "python", "tests"))  # deepseek_tiny (plain torch)


def synchronize() -> None:
    import torch
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


# -- the model --------------------------------------------------------------------------------
def make_checkpoint(directory: str, args):
    """deepseek_tiny's weights (float32, CPU) written as a Hugging Face checkpoint; the tiny
    model returned too (same weights)."""
    from safetensors.torch import save_file
    from deepseek_tiny import TinyConfig, TinyDeepseekV3, init_weights
    cfg = TinyConfig(**MODEL)
    tiny = init_weights(TinyDeepseekV3(cfg), args.seed, attention_gain=args.attention_gain,
                        logit_gain=args.logit_gain).float()
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg.hf_dict(), f, indent=1)
    save_file({k: v.contiguous() for k, v in tiny.state_dict().items()},
              os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    return tiny


def load_transformers(directory: str, dtype, attn: str):
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(
        directory, dtype=dtype, attn_implementation=attn, experts_implementation="eager",
        output_loading_info=True)
    bad = {k: list(v) for k, v in info.items()
           if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    return model.to(device=DEVICE, dtype=dtype).eval(), bad


def check_checkpoint(ctx) -> str:
    """A load that left weights out is reported here; the later checks still run (generate and
    the tree decoding use the loaded model's own weights either way)."""
    import torch
    if ctx["load_problems"]:
        raise AssertionError(f"the checkpoint did not load cleanly: {ctx['load_problems']}")
    tiny = ctx["tiny"].to(DEVICE)
    model = ctx["model"]
    ids = torch.randint(0, MODEL["vocab_size"], (1, 300), generator=ctx["gen"]).to(DEVICE)
    with torch.no_grad():
        want = model(ids).logits[0]
        got = tiny(ids)[0]
    error = rel(got, want)
    ctx["tiny"] = tiny.cpu()
    cfg = model.config
    note = (f"{type(model).__name__}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
            f"parameters, rope {getattr(cfg, 'rope_parameters', None) or cfg.rope_scaling}; "
            f"deepseek_tiny's logits vs transformers' (float32, 300 tokens): {error:.2e}")
    RESULTS["checkpoint_logits_error"] = error
    if error > 1e-4:
        raise AssertionError(note)
    return note


def check_attention(ctx) -> str:
    """Every layer on float64 hidden states at positions past YaRN's 4096 (and at 0)."""
    import copy
    import torch
    from verifyd.mla import MlaLayer
    from verifyd.tools.drafter import absorbed_attention
    eager, sdpa = ctx["model64_eager"], ctx["model64_sdpa"]
    tiny = copy.deepcopy(ctx["tiny"]).double().to(DEVICE)
    t = 96
    worst = {"tiny_vs_eager": 0.0, "mla_vs_sdpa": 0.0, "mla_vs_eager": 0.0, "cos_sin": 0.0}
    for start in (0, 30000):
        x = torch.randn(1, t, MODEL["hidden_size"], generator=ctx["gen"],
                        dtype=torch.float64).to(DEVICE)
        pos = torch.arange(start, start + t, device=DEVICE)
        pe = tiny.model.rotary_emb(x, pos[None])
        hf_pe = eager.model.rotary_emb(x, pos[None])
        worst["cos_sin"] = max(worst["cos_sin"], float((pe[0] - hf_pe[0]).abs().max()),
                               float((pe[1] - hf_pe[1]).abs().max()))
        causal = torch.ones(t, t, dtype=torch.bool, device=DEVICE).tril()
        mask = torch.zeros(t, t, dtype=torch.float64, device=DEVICE).masked_fill(
            ~causal, float("-inf"))[None, None]
        for i in range(MODEL["num_hidden_layers"]):
            def hf(m):
                r = m.model.layers[i].self_attn(hidden_states=x, position_embeddings=pe,
                                                attention_mask=mask)
                return (r[0] if isinstance(r, tuple) else r)[0]
            want_eager, want_sdpa = hf(eager), hf(sdpa)
            mine = tiny.model.layers[i].self_attn(x, pe, mask)[0][0]
            layer = MlaLayer.from_module(sdpa.model.layers[i].self_attn, sdpa.config)
            q, rows = layer.queries(x[0], pos), layer.latent(x[0], pos)
            absorbed = layer.project(absorbed_attention(q, rows, causal, layer.softmax_scale))
            worst["tiny_vs_eager"] = max(worst["tiny_vs_eager"], rel(mine, want_eager))
            worst["mla_vs_sdpa"] = max(worst["mla_vs_sdpa"], rel(absorbed, want_sdpa))
            worst["mla_vs_eager"] = max(worst["mla_vs_eager"], rel(absorbed, want_eager))
            hf_attn = sdpa.model.layers[i].self_attn
            if abs(layer.softmax_scale - hf_attn.scaling) > 1e-12 * hf_attn.scaling:
                raise AssertionError(f"softmax scale {layer.softmax_scale} != transformers' "
                                     f"{hf_attn.scaling}")
    rotary = sdpa.model.rotary_emb
    inv_freq = float((layer.rope.inv_freq.to(DEVICE).double()
                      - rotary.inv_freq.double()).abs().max())
    scaling = abs(layer.rope.attention_scaling - rotary.attention_scaling)
    RESULTS["attention"] = dict(worst, inv_freq=inv_freq, attention_scaling=scaling,
                                softmax_scale=layer.softmax_scale)
    note = (f"{MODEL['num_hidden_layers']} layers, positions 0.. and 30000..: tiny vs eager "
            f"{worst['tiny_vs_eager']:.1e}, mla vs sdpa {worst['mla_vs_sdpa']:.1e}, mla vs eager "
            f"{worst['mla_vs_eager']:.1e}; cos/sin {worst['cos_sin']:.1e}, inv_freq "
            f"{inv_freq:.1e}, softmax scale {layer.softmax_scale:.6f} (= transformers')")
    if (worst["tiny_vs_eager"] > 1e-12 or worst["mla_vs_sdpa"] > 1e-12
            or worst["mla_vs_eager"] > 1e-6 or inv_freq > 1e-6 * float(rotary.inv_freq.max())
            or scaling > 1e-12 or worst["cos_sin"] > 1e-5):
        raise AssertionError(note)
    return note


def check_margins(ctx) -> str:
    """verifyd's bf16 rounding (q, rows, out) emulated on a random sequence: the logit noise."""
    import torch
    from verifyd.tools.drafter import absorbed_attention
    from verifyd.tools.model_layers import forward, mla_layers
    model = ctx["model"]
    mla = mla_layers(model)
    n = 512
    seq = torch.randint(0, MODEL["vocab_size"], (n,), generator=ctx["gen"]).to(DEVICE)
    pos = torch.arange(n, device=DEVICE)
    causal = torch.ones(n, n, dtype=torch.bool, device=DEVICE).tril()

    def attention(bf16):
        def run(i, layer, x, p):
            q, rows = layer.queries(x, p), layer.latent(x, p)
            if bf16:
                q, rows = q.to(torch.bfloat16).float(), rows.to(torch.bfloat16).float()
            out = absorbed_attention(q, rows, causal, layer.softmax_scale)
            return layer.project(out.to(torch.bfloat16) if bf16 else out, x.dtype)
        return run
    with torch.no_grad():
        exact = forward(model, mla, seq, pos, attention(False))
        rounded = forward(model, mla, seq, pos, attention(True))
    noise = float((rounded - exact).abs().max())
    ctx["noise"] = noise
    RESULTS["emulated_noise"] = noise
    RESULTS["logit_std"] = float(exact.std())
    return (f"attention_gain {ctx['args'].attention_gain}, logit_gain {ctx['args'].logit_gain}: "
            f"logit std {float(exact.std()):.2f}; bf16 attention moves a logit by at most "
            f"{noise:.2e} over {n} positions (the decode check reports generate's margins)")


def reference(ctx, prompt, new_tokens):
    """generate(do_sample=False): the tokens, the logits that chose them, decode-only tokens/s."""
    import torch
    try:
        return _reference(ctx, prompt, new_tokens)
    except torch.cuda.OutOfMemoryError as e:
        raise MemoryError(f"generate over {len(prompt)} tokens ran out of device memory with "
                          f"attn_implementation={ctx['args'].attn_implementation}: try "
                          "--attn-implementation sdpa") from e


def _reference(ctx, prompt, new_tokens):
    import torch
    model = ctx["model"]
    ids = torch.tensor([prompt], device=DEVICE)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, output_logits=True,
                             return_dict_in_generate=True, **kw)
        tokens = out.sequences[0, len(prompt):].tolist()
        if len(tokens) != new_tokens:
            raise AssertionError(f"generate stopped after {len(tokens)} tokens")
        logits = torch.stack([s[0] for s in out.logits]).float()
        times = {}
        for n in (1, new_tokens):
            best = float("inf")
            for _ in range(2):
                synchronize()
                t0 = time.perf_counter()
                model.generate(ids, max_new_tokens=n, **kw)
                synchronize()
                best = min(best, time.perf_counter() - t0)
            times[n] = best
    return tokens, logits, (new_tokens - 1) / (times[new_tokens] - times[1])


def decode_one(ctx, attention, prompt, budget, want, want_logits, sid):
    import torch
    from verifyd.tools.drafter import Drafter
    from verifyd.tools.tree_decode import TreeDecoder
    args = ctx["args"]
    width = 4 if budget <= 16 else 8
    drafter = Drafter(ctx["draft_model"], layers=args.draft_layers, width=width)
    r = TreeDecoder(ctx["model"], drafter, attention, budget).generate(sid, prompt, len(want),
                                                                      keep_logits=True)
    deviation = (r.logits.float() - want_logits).abs().max(-1).values
    gaps = torch.topk(want_logits, 2).values
    margin = gaps[:, 0] - gaps[:, 1]
    mismatch = next((i for i, (a, b) in enumerate(zip(r.tokens, want)) if a != b), None)
    row = dict(prompt=len(prompt), budget=budget, steps=r.steps,
               tokens_per_step=r.mean_accepted, acceptance=r.acceptance,
               tokens_per_second=r.tokens_per_second,
               draft_share=r.draft_seconds / r.decode_seconds if r.decode_seconds else 0.0,
               prefill_seconds=r.prefill_seconds, first_mismatch=mismatch,
               mismatches=sum(a != b for a, b in zip(r.tokens, want)),
               smallest_margin=float(margin.min()), largest_deviation=float(deviation.max()),
               margin_over_deviation=float((margin / (2 * deviation.clamp_min(1e-30))).min()))
    return row


def check_decode(ctx) -> str:
    import torch
    import verifyd
    from verifyd.tools.tree_decode import VerifydAttention
    args = ctx["args"]
    rows, refs = [], []
    with verifyd.Client(ctx["daemon"].target, timeout=120) as client:
        # One registered pool (and channel) for every run, as an engine keeps its own.
        attention = VerifydAttention(client, MODEL["num_attention_heads"], max(args.budgets),
                                     transport="device", device=torch.device(DEVICE))
        try:
            stats = client.stats()
            log(f"  daemon: backend {stats.backend}, H {stats.heads}, layers {stats.layers}, "
                f"MPS {stats.mps_active}")
            RESULTS["mps_active"] = stats.mps_active
            for k, length in enumerate(args.prompts):
                g = torch.Generator().manual_seed(zlib.crc32(f"prompt{k}".encode()))
                prompt = torch.randint(0, MODEL["vocab_size"], (length,), generator=g).tolist()
                t0 = time.perf_counter()
                want, want_logits, greedy_tps = reference(ctx, prompt, args.new_tokens)
                log(f"  prompt {length}: generate {args.new_tokens} tokens ("
                    f"{time.perf_counter() - t0:.1f} s with timing runs), {greedy_tps:.1f} "
                    "tokens/s")
                refs.append(dict(prompt=length, generate_tokens_per_second=greedy_tps))
                for budget in args.budgets:
                    row = decode_one(ctx, attention, prompt, budget, want, want_logits,
                                     sid=1000 * (k + 1) + budget)
                    row["generate_tokens_per_second"] = greedy_tps
                    rows.append(row)
                    log("  " + " ".join(f"{key}={value:.4g}" if isinstance(value, float) else
                                        f"{key}={value}" for key, value in row.items()))
        finally:
            attention.close()
    RESULTS["decode"], RESULTS["generate"] = rows, refs
    ctx["decode_rows"] = rows
    bad = [r for r in rows if r["mismatches"]]
    std = RESULTS.get("logit_std", 4.0)
    loose = [r for r in rows if r["largest_deviation"] > 5e-3 * std]
    note = (f"{len(rows)} runs ({len(args.prompts)} prompts x budgets {args.budgets}, "
            f"{args.new_tokens} tokens each): {sum(r['mismatches'] for r in rows)} mismatched "
            f"tokens; smallest margin {min(r['smallest_margin'] for r in rows):.3g}, largest "
            f"logit deviation {max(r['largest_deviation'] for r in rows):.2e} (bound "
            f"{5e-3 * std:.3g}), smallest margin / 2 x deviation "
            f"{min(r['margin_over_deviation'] for r in rows):.3g}")
    if bad or loose:
        where = [(r["prompt"], r["budget"], r["first_mismatch"]) for r in bad]
        raise AssertionError(f"{note}; mismatching runs (prompt, budget, first token) {where}, "
                             f"runs over the deviation bound: {len(loose)}")
    return note


def check_acceptance(ctx) -> str:
    rows = ctx.get("decode_rows", [])
    if not rows:
        raise AssertionError("no decode runs to report (the decode check failed early)")
    note = (f"draft noise {ctx['args'].draft_noise}, draft layers "
            f"{ctx['args'].draft_layers or 'all'}: acceptance "
            f"{min(r['acceptance'] for r in rows):.2f}..{max(r['acceptance'] for r in rows):.2f}, "
            f"tokens per step {min(r['tokens_per_step'] for r in rows):.2f}.."
            f"{max(r['tokens_per_step'] for r in rows):.2f}")
    if any(not 0 < r["acceptance"] < 1 for r in rows):
        raise AssertionError(note + ": a run outside (0, 1) (--draft-noise moves it)")
    return note


def check_speed(ctx) -> str:
    rows = [r for r in ctx.get("decode_rows", []) if r["prompt"] == max(ctx["args"].prompts)]
    if not rows:
        raise AssertionError("no decode runs to report (the decode check failed early)")
    parts = []
    for r in rows:
        target_only = r["tokens_per_second"] / max(1e-9, 1 - r["draft_share"])
        ratio = r["tokens_per_second"] / r["generate_tokens_per_second"]
        parts.append(f"budget {r['budget']}: {r['tokens_per_second']:.1f} tokens/s vs generate "
                     f"{r['generate_tokens_per_second']:.1f} ({ratio:.2f}x), "
                     f"{r['tokens_per_step']:.2f} tokens/step, drafter "
                     f"{100 * r['draft_share']:.0f}% of the step (with a free drafter "
                     f"{target_only:.1f} tokens/s)")
    RESULTS["speed"] = parts
    return f"prompt {rows[0]['prompt']}: " + "; ".join(parts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--verifyd", required=True, help="the verifyd binary (cuda backend)")
    p.add_argument("--daemon-ld-path", help="LD_LIBRARY_PATH for the daemon only (bundle/lib)")
    p.add_argument("--python", help="directory holding the verifyd package (with stubs)")
    p.add_argument("--lib", help="libverifyd_dataplane.so to load")
    p.add_argument("--installed", action="store_true", help="this Python's installed verifyd")
    p.add_argument("--quick", action="store_true", help=f"small settings: {QUICK}")
    p.add_argument("--prompts", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--new-tokens", type=int)
    p.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--attention-gain", type=float, default=0.01)
    p.add_argument("--logit-gain", type=float, default=4.0)
    p.add_argument("--draft-noise", type=float, default=0.03)
    p.add_argument("--draft-layers", type=int, default=None, help="default: all")
    p.add_argument("--attn-implementation", default="eager", choices=["eager", "sdpa"],
                   help="transformers' attention for generate and the prefill (eager at 32k "
                   "tokens peaks near 75 GB: [8, T, T] float32 scores twice; sdpa if short)")
    p.add_argument("--seed", type=int, default=36)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a dry run of this script on a cpu daemon and host buffers")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/verifyd-real-model"))
    args = p.parse_args()
    global DEVICE
    DEVICE = args.device
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    setup_path(args)
    os.makedirs(args.out, exist_ok=True)

    import torch
    import transformers
    import verifyd
    from verifyd import dataplane
    from verifyd.tools.drafter import perturbed
    from python_dataplane_gpu import CudaDaemon
    torch.set_float32_matmul_precision("highest")  # no TF32: float32 means float32 here
    log(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, verifyd from {os.path.dirname(verifyd.__file__)}, data "
        f"plane {dataplane.why_unavailable() or 'cuda=%s' % dataplane.has_cuda()}, "
        f"{torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'}")
    log(f"settings: prompts {args.prompts}, {args.new_tokens} new tokens, budgets {args.budgets}")
    RESULTS["settings"] = {k: v for k, v in vars(args).items()}
    RESULTS["model"] = MODEL
    if DEVICE == "cuda" and (not torch.cuda.is_available() or not dataplane.has_cuda()):
        log("FAIL setup: no CUDA device, or the data-plane library has no CUDA")
        return 1

    ctx = {"args": args, "gen": torch.Generator().manual_seed(args.seed)}
    summary = []
    checks = [("checkpoint", check_checkpoint), ("attention", check_attention),
              ("margins", check_margins), ("decode", check_decode),
              ("acceptance", check_acceptance), ("speed", check_speed)]
    with tempfile.TemporaryDirectory(prefix="verifyd-dsv3-") as directory:
        try:
            ctx["tiny"] = make_checkpoint(directory, args)
            ctx["model"], ctx["load_problems"] = load_transformers(directory, torch.float32,
                                                                   args.attn_implementation)
            ctx["model64_eager"], _ = load_transformers(directory, torch.float64, "eager")
            ctx["model64_sdpa"], _ = load_transformers(directory, torch.float64, "sdpa")
            ctx["draft_model"] = perturbed(ctx["model"], args.draft_noise, seed=args.seed + 1)
            ctx["daemon"] = CudaDaemon(args.verifyd, heads=MODEL["num_attention_heads"],
                                       layers=MODEL["num_hidden_layers"],
                                       ld_path=args.daemon_ld_path, backend=DEVICE)
        except Exception:  # noqa: BLE001 - report, then nothing else can run
            log(f"FAIL setup:\n{traceback.format_exc()}")
            return 1
        try:
            for name, fn in checks:
                t0 = time.perf_counter()
                try:
                    note = fn(ctx)
                    ok = True
                except Exception:  # noqa: BLE001 - report and go on
                    note = traceback.format_exc()
                    ok = False
                RESULTS["checks"][name] = {"ok": ok, "note": note,
                                           "seconds": time.perf_counter() - t0}
                log(f"{'PASS' if ok else 'FAIL'} {name}: {note}")
                summary.append((name, ok, note.strip().splitlines()[-1] if not ok else note))
        finally:
            rc = ctx["daemon"].stop()
            if rc != 0:
                with open(ctx["daemon"].log) as f:
                    summary.append(("daemon", False, f"exit {rc}: {f.read()[-2000:]}"))
    with open(os.path.join(args.out, "real_model.json"), "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    log("\n== real model on verifyd: summary")
    for row in ctx.get("decode_rows", []):
        log(f"  prompt {row['prompt']:>6} budget {row['budget']:>3}: mismatches "
            f"{row['mismatches']}, {row['steps']} steps, {row['tokens_per_step']:.2f} tokens/step, "
            f"acceptance {row['acceptance']:.2f}, {row['tokens_per_second']:.1f} tokens/s "
            f"(generate {row['generate_tokens_per_second']:.1f}), smallest margin "
            f"{row['smallest_margin']:.3g}, largest logit deviation {row['largest_deviation']:.2e}")
    for name, ok, note in summary:
        log(f"  {'PASS' if ok else 'FAIL'} {name:<10} {note[:300]}")
    failed = sum(not ok for _, ok, _ in summary)
    log(f"{len(summary) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
