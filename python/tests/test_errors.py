"""Every error path raises the VerifydError subclass of its gRPC code with the daemon's message;
the daemon keeps serving and no other sequence is touched."""
import grpc
import numpy as np
import pytest

import verifyd
from verifyd._proto import pb
from verifyd.tensors import random_bf16

from conftest import HEADS, LAYERS, MAX_TREE_NODES
from helpers import check_sequence, prefill, tree_inputs


@pytest.fixture
def live(client, seq_ids, rng):
    """A live sequence of 30 tokens and a bystander whose output must not change."""
    sid, other = next(seq_ids), next(seq_ids)
    prefill(client, sid, rng, 30)
    kv_other, _ = prefill(client, other, rng, 25)
    q, tkv = tree_inputs(rng, 3)
    before = client.verify(0, [(other, [-1, 0, 1])], q, tkv).out.copy()
    yield sid
    after = client.verify(0, [(other, [-1, 0, 1])], q, tkv)
    assert np.array_equal(before, after.out), "an error touched another sequence"
    assert after.committed_length == [25]
    check_sequence(after.out, kv_other[0], tkv, q, [-1, 0, 1], client.stats().softmax_scale)
    assert client.health() == "SERVING"
    for s in (sid, other):
        try:
            client.release(s)
        except verifyd.NotFound:
            pass


def expect(cls, code, text, fn):
    with pytest.raises(cls) as info:
        fn()
    e = info.value
    assert isinstance(e, verifyd.VerifydError)
    assert e.code == code, e
    assert text in e.message, e.message
    assert text in str(e) and code.name in str(e)
    return e


INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
PRECONDITION, EXHAUSTED = grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED


def test_daemon_rejects_bad_append_shapes(client, live):
    raw = pb.AppendRequest(sequence_id=live, expected_fill=30,
                           kv=pb.Tensor(dtype=pb.DTYPE_BF16, shape=[1, 2, 500],
                                        inline_data=b"\1" * 2000))
    e = expect(verifyd.InvalidArgument, INVALID, "kv.shape[2] = 500 must equal the KV row width",
               lambda: client.append_request(raw))
    assert e.method == "Append"
    raw.kv.shape[:] = [1, 2, 576]
    expect(verifyd.InvalidArgument, INVALID, "kv.inline_data has 2000 bytes, must be 2304",
           lambda: client.append_request(raw))


def test_append_layer_range(client, live, rng):
    expect(verifyd.InvalidArgument, INVALID, "kv.shape[0] = 2 must be in [1, --layers - "
           "layer_begin = 1]", lambda: client.append(live, random_bf16(rng, (2, 3, 576)),
                                                     layer_begin=1, expected_fill=30))


def test_append_past_capacity(client, daemon, live, seq_ids, rng):
    sid = next(seq_ids)
    used = client.stats().used_tokens
    # Chunked: the chunks before the one that does not fit stay appended, and the message says so.
    with daemon.client(max_message_bytes=1 << 20) as chunked:  # 454 tokens of 2 layers a chunk
        e = expect(verifyd.ResourceExhausted, EXHAUSTED, "free KV slots",
                   lambda: chunked.append(sid, random_bf16(rng, (LAYERS, 16384, 576))))
        assert "stay appended)" in e.message and "(chunk " in e.message
        kept = int(e.message.split("; the first ")[1].split(" tokens")[0])
        assert kept > 0 and kept % 454 == 0
    # The failing chunk itself left nothing (atomic per message).
    assert client.stats().used_tokens == used + kept
    assert client.release(sid) == kept
    assert client.stats().used_tokens == used


def test_append_with_pending_tree(client, live, rng):
    client.verify(0, [(live, [-1])], *tree_inputs(rng, 1))
    expect(verifyd.FailedPrecondition, PRECONDITION, "pending tree of 1 nodes",
           lambda: client.append(live, random_bf16(rng, (LAYERS, 2, 576)), expected_fill=30))
    client.commit(live, [])


def test_verify_errors(client, live, rng):
    q, tkv = tree_inputs(rng, 3)
    expect(verifyd.NotFound, NOT_FOUND, "sequences[0].sequence_id = 987654321 is not a live "
           "sequence", lambda: client.verify(0, [(987654321, [-1, 0, 0])], q, tkv))
    expect(verifyd.InvalidArgument, INVALID, "sequences[0].parents[1] = 1 must be < 1",
           lambda: client.verify(0, [(live, [-1, 1, 0])], q, tkv))
    expect(verifyd.InvalidArgument, INVALID, "sequences[0].parents[2] = 5 must be < 2",
           lambda: client.verify(0, [(live, [-1, 0, 5])], q, tkv))
    expect(verifyd.InvalidArgument, INVALID, f"q.shape[1] = 3 must equal --heads = {HEADS}",
           lambda: client.verify(0, [(live, [-1, 0, 0])], random_bf16(rng, (3, 3, 576)), tkv))
    expect(verifyd.InvalidArgument, INVALID, f"layer = 5 must be < --layers = {LAYERS}",
           lambda: client.verify(5, [(live, [-1, 0, 0])], q, tkv))
    n = MAX_TREE_NODES + 1
    expect(verifyd.InvalidArgument, INVALID, f"parents has {n} nodes, must be in [1, "
           f"--max-tree-nodes = {MAX_TREE_NODES}]",
           lambda: client.verify(0, [(live, [-1] * n)], *tree_inputs(rng, n)))
    expect(verifyd.InvalidArgument, INVALID, "parents has 0 nodes",
           lambda: client.verify(0, [(live, [])], q[:0], tkv[:0]))


def test_verify_client_side_shape_checks(client, live, rng):
    q, tkv = tree_inputs(rng, 3)
    expect(verifyd.InvalidArgument, INVALID, "q has shape [2, 2, 576]; need [3, *, 576]",
           lambda: client.verify(0, [(live, [-1, 0, 0])], q[:2], tkv))
    expect(verifyd.InvalidArgument, INVALID, "tree_kv has shape [3, 512]",
           lambda: client.verify(0, [(live, [-1, 0, 0])], q, tkv[:, :512]))
    expect(verifyd.InvalidArgument, INVALID, "q has dtype int32",
           lambda: client.verify(0, [(live, [-1, 0, 0])], q.astype(np.int32), tkv))
    expect(verifyd.InvalidArgument, INVALID, "sequences must not be empty",
           lambda: client.verify(0, [], q, tkv))
    expect(verifyd.InvalidArgument, INVALID, "kv has shape [3, 2, 500]",
           lambda: client.append(live, random_bf16(rng, (3, 2, 500)), expected_fill=30))


def test_non_finite_inputs_rejected(client, live, rng):
    q, tkv = tree_inputs(rng, 3)
    tkv[1, 7] = 0x7FC0  # bf16 NaN
    expect(verifyd.InvalidArgument, INVALID, "tree_kv",
           lambda: client.verify(0, [(live, [-1, 0, 0])], q, tkv))


def test_commit_errors(client, live, rng):
    expect(verifyd.NotFound, NOT_FOUND, "sequence_id = 987654321 is not a live sequence",
           lambda: client.commit(987654321, [0]))
    client.verify(0, [(live, [-1, 0, 0])], *tree_inputs(rng, 3))
    expect(verifyd.FailedPrecondition, PRECONDITION, "layer 1 of sequence",
           lambda: client.commit(live, [0]))
    client.verify(1, [(live, [-1, 0, 0])], *tree_inputs(rng, 3))
    expect(verifyd.InvalidArgument, INVALID, "accepted_path[0] = 1 must be a root",
           lambda: client.commit(live, [1]))
    expect(verifyd.InvalidArgument, INVALID, "accepted_path[2] = 2 must be a child of "
           "accepted_path[1] = 1", lambda: client.commit(live, [0, 1, 2]))
    assert client.commit(live, [0, 2]) == 32  # the failed commits changed nothing


def test_release_and_compaction_errors(client, live):
    expect(verifyd.NotFound, NOT_FOUND, "sequence_id = 987654321 is not a live sequence",
           lambda: client.release(987654321))
    expect(verifyd.NotFound, NOT_FOUND, "operation_id = 'nope' is unknown",
           lambda: client.get_compaction("nope"))


def test_shared_memory_errors(client, live):
    expect(verifyd.InvalidArgument, INVALID, "bytes = 0 must be >= 1",
           lambda: client.create_shared_memory(0))
    expect(verifyd.ResourceExhausted, EXHAUSTED, "--shm-max-region-bytes = 8388608",
           lambda: client.create_shared_memory(1 << 30))
    expect(verifyd.NotFound, NOT_FOUND, "region = 'abc' is not a live shared-memory region",
           lambda: client.release_shared_memory("abc"))


def test_deadlines(daemon, seq_ids, rng):
    # A Verify that takes the CPU backend tens of milliseconds, with a 1 ms deadline.
    with daemon.client(max_message_bytes=1 << 20) as c:
        sid = next(seq_ids)
        prefill(c, sid, rng, 6000)
        q, tkv = tree_inputs(rng, MAX_TREE_NODES)
        parents = [-1] + list(range(MAX_TREE_NODES - 1))
        expect(verifyd.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline",
               lambda: c.verify(0, [(sid, parents)], q, tkv, timeout=1e-3))
        c.release(sid)
        assert c.health() == "SERVING"


def test_unavailable_daemon(tmp_path):
    with verifyd.Client(f"unix://{tmp_path}/none.sock", retries=1, retry_backoff=0.01) as c:
        expect(verifyd.Unavailable, grpc.StatusCode.UNAVAILABLE, "",
               lambda: c.stats(timeout=2))


def test_bad_client_options():
    for kwargs, text in [({"max_message_bytes": 10}, "max_message_bytes = 10"),
                         ({"timeout": 0}, "timeout = 0"), ({"retries": -1}, "retries = -1")]:
        expect(verifyd.InvalidArgument, INVALID, text, lambda: verifyd.Client("unix:///x",
                                                                            **kwargs))
    expect(verifyd.InvalidArgument, INVALID, "target must not be empty",
           lambda: verifyd.Client(""))
