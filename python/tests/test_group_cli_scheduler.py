"""GroupClient over two daemons, `python -m verifyd`, and the multi-step fake scheduler."""
import json
import os
import subprocess
import sys

import pytest

import verifyd
from verifyd.tools import fake_scheduler

from conftest import HEADS, LAYERS
from helpers import check_sequence, tree_inputs
from verifyd.tensors import random_bf16

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_group_client(daemon, daemon_rank1, seq_ids, rng):
    with verifyd.GroupClient([daemon.target, daemon_rank1.target]) as group:
        assert group.size == 2
        assert group.health() == ["SERVING", "SERVING"]
        sid = next(seq_ids)
        kv = random_bf16(rng, (LAYERS, 21, 576))
        assert [r.committed_length for r in group.append(sid, kv)] == [21, 21]
        scale = group.stats()[0].softmax_scale
        parents = [-1, 0, 0]
        for layer in range(LAYERS):
            qs = [tree_inputs(rng, 3)[0] for _ in range(2)]  # each rank: its own heads
            _, tkv = tree_inputs(rng, 3)
            results = group.verify(layer, [(sid, parents)], qs, tkv)
            for r in range(2):
                check_sequence(results[r].out, kv[layer], tkv, qs[r], parents, scale)
        assert group.commit(sid, [0, 2]) == [23, 23]
        with pytest.raises(verifyd.GroupError) as info:
            group.verify(0, [(sid, [-1])], [tree_inputs(rng, 1)[0]] * 2,
                         [tree_inputs(rng, 1)[1], tree_inputs(rng, 2)[1]])
        e = info.value
        assert e.rank == 1 and e.code == verifyd.InvalidArgument(e.code, "").code
        assert e.message.startswith("rank 1: ")
        assert isinstance(e.results[0], verifyd.VerifyResult)
        assert isinstance(e.results[1], verifyd.InvalidArgument)
        group.rank(0).commit(sid, [])
        assert sum(group.release(sid)) > 0
        with pytest.raises(verifyd.GroupError, match="rank 0: .*not a live sequence") as info:
            group.release(sid)
        assert set(info.value.errors()) == {0, 1}
        assert group.for_each_rank(lambda r, c: r * 10) == [0, 10]
        with pytest.raises(verifyd.InvalidArgument, match="equal the group size 2"):
            group.verify(0, [(sid, [-1])], [tree_inputs(rng, 1)[0]], tree_inputs(rng, 1)[1])


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    return subprocess.run([sys.executable, "-m", "verifyd", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def test_cli_health_and_stats(daemon):
    r = run_cli("--target", daemon.target, "health")
    assert r.returncode == 0 and r.stdout.strip() == "SERVING", r.stderr
    r = run_cli("--target", daemon.target, "-o", "json", "health")
    assert json.loads(r.stdout) == {"status": "SERVING"}
    r = run_cli("--target", daemon.target, "stats")
    assert r.returncode == 0 and "backend            cpu" in r.stdout
    assert f"heads              {HEADS}" in r.stdout and "fragmented ratio" in r.stdout
    r = run_cli("--target", daemon.target, "-o", "json", "stats")
    s = json.loads(r.stdout)
    assert s["backend"] == "cpu" and s["layers"] == LAYERS and "fragmentation" in s
    r = run_cli("--target", daemon.target, "-o", "json", "compact")
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "DONE"


def _table_keys(text):
    return [line.split("  ")[0] for line in text.splitlines() if line.strip()]


def test_cli_has_verifyctls_commands_and_views(daemon, seq_ids, rng):
    t = daemon.target
    sid, fork = next(seq_ids), next(seq_ids)
    with daemon.client() as c:
        c.append(sid, random_bf16(rng, (LAYERS, 9, 576)))
    # The options after the command, as after it in verifyctl.
    r = run_cli("stats", "--target", t, "-o", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["layers"] == LAYERS, r.stderr
    r = run_cli("sequences", "--target", t)
    assert r.returncode == 0 and r.stdout.startswith("SEQUENCE  ") and f"\n{sid} " in r.stdout
    r = run_cli("--target", t, "-o", "json", "sequences")
    assert sid in [int(s["sequence_id"]) for s in json.loads(r.stdout)["sequences"]]
    r = run_cli("fork", "--sequence", str(sid), "--new-sequence", str(fork), "--length", "4",
                "--target", t)
    assert r.returncode == 0 and f"forked sequence {fork} from {sid}: 4 tokens shared" in r.stdout
    r = run_cli("release", "--sequence", str(fork), "--target", t, "-o", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["freed_slots"] == 0, r.stderr
    r = run_cli("--target", t, "release", "--sequence", str(sid))
    assert r.returncode == 0 and f"released sequence {sid}: 9 slots freed" in r.stdout
    r = run_cli("--target", t, "release", "--sequence", str(sid))
    assert r.returncode == 1 and "not a live sequence" in r.stderr
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"verifyd-py {verifyd.__version__}"
    r = run_cli("--target", t, "compact")
    assert r.returncode == 0 and "note  " in r.stdout, r.stdout
    # The same views as verifyctl's: the same rows, in the same order.
    verifyctl = os.environ.get("VERIFYCTL_BINARY")
    if verifyctl is None:
        pytest.skip("VERIFYCTL_BINARY not set (ctest sets it): views not compared")
    for command in (["stats"], ["compact"]):
        ours = run_cli("--target", t, *command)
        theirs = subprocess.run([verifyctl, f"--target={t}", *command], capture_output=True,
                                text=True, timeout=60)
        assert theirs.returncode == 0, theirs.stderr
        keys = [k for k in _table_keys(theirs.stdout) if not k.startswith(("[", "compaction "))]
        assert [k for k in _table_keys(ours.stdout)
                if not k.startswith(("[", "compaction "))] == keys, (ours.stdout, theirs.stdout)


def test_cli_errors(tmp_path):
    r = run_cli("--target", f"unix://{tmp_path}/none.sock", "--timeout", "1", "health")
    assert r.returncode == 1 and ("UNAVAILABLE" in r.stderr or "DEADLINE" in r.stderr), r.stderr
    r = run_cli("bogus")
    assert r.returncode == 2


@pytest.mark.parametrize("transport,tensors", [("grpc", "torch"), ("shared_memory", "torch"),
                                               ("grpc", "numpy"), ("shared_memory", "numpy"),
                                               ("device", "torch"), ("device", "numpy")])
def test_fake_scheduler(daemon, transport, tensors):
    if tensors == "torch":
        pytest.importorskip("torch")
    # 1 MiB messages: the longer prefills go in several chunks.
    with daemon.client(max_message_bytes=1 << 20) as c:
        before = c.stats()
        report = fake_scheduler.run(c, sequences=3, steps=5, transport=transport,
                                    tensors=tensors, seed=len(transport) * 10 + len(tensors),
                                    first_id=7_000_000 + 100 * len(transport) + len(tensors),
                                    prefill_tokens=(300, 900))
        assert report.steps == 5 and report.verifies == 5 * LAYERS
        assert report.worst_relative_error < 1e-2
        assert report.outputs_checked > 0
        after = c.stats()
        assert after.fragmentation.sequences == before.fragmentation.sequences
        assert after.used_tokens == before.used_tokens


def test_fake_scheduler_command_line(daemon):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    r = subprocess.run([sys.executable, "-m", "verifyd.tools.fake_scheduler", "--target",
                        daemon.target, "--steps", "2", "--sequences", "2", "--seed", "5"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("OK: 2 steps")
