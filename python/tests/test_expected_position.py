"""SPEC §2's expected-position rule: the client fills AppendRequest.expected_position for every
chunk; a chunk never re-creates a sequence released or expired meanwhile.

The daemon enforces it (FAILED_PRECONDITION naming both numbers), so these are plain tests."""
import time

import pytest

import verifyd
from verifyd.tensors import random_bf16

from conftest import LAYERS


class RecordingStub:
    """Wraps a Client's Append stub: records every request, runs a hook after each chunk."""

    def __init__(self, client, after_chunk=None):
        self.inner = client._stub.Append
        self.requests = []
        self.after_chunk = after_chunk
        client._stub.Append = self

    def __call__(self, request, **kwargs):
        self.requests.append(request)
        response = self.inner(request, **kwargs)
        if self.after_chunk:
            self.after_chunk(len(self.requests))
        return response


def small_client(daemon):
    return daemon.client(max_message_bytes=16 << 10)  # 6 tokens of 2 layers per chunk


def test_every_chunk_states_its_position(daemon, seq_ids, rng):
    with small_client(daemon) as c:
        sid = next(seq_ids)
        rec = RecordingStub(c)
        c.append(sid, random_bf16(rng, (LAYERS, 20, 576)))
        assert [r.WhichOneof("expected_position") for r in rec.requests] == \
            ["create", "expected_fill", "expected_fill", "expected_fill"]
        assert rec.requests[0].create
        assert [r.expected_fill for r in rec.requests[1:]] == [6, 12, 18]
        rec.requests.clear()
        c.append(sid, random_bf16(rng, (LAYERS, 8, 576)), expected_fill=20)
        assert [r.expected_fill for r in rec.requests] == [20, 26]
        assert all(r.WhichOneof("expected_position") == "expected_fill" for r in rec.requests)
        c.release(sid)


def test_chunked_append_across_a_release(daemon, seq_ids, rng):
    with small_client(daemon) as c, daemon.client() as other:
        sid = next(seq_ids)
        rec = RecordingStub(c, after_chunk=lambda n: other.release(sid) if n == 2 else None)
        with pytest.raises(verifyd.FailedPrecondition) as info:
            c.append(sid, random_bf16(rng, (LAYERS, 30, 576)))
        assert "chunk 3 of 5; the first 12 tokens stay appended" in info.value.message
        assert "12" in info.value.message
        assert len(rec.requests) == 3
        with pytest.raises(verifyd.NotFound):  # not silently re-created
            other.release(sid)


def test_chunked_append_across_a_lease_expiry(short_lease_daemon, seq_ids, rng):
    with small_client(short_lease_daemon) as c:
        sid = next(seq_ids)
        RecordingStub(c, after_chunk=lambda n: time.sleep(1.5) if n == 1 else None)
        with pytest.raises(verifyd.FailedPrecondition) as info:
            c.append(sid, random_bf16(rng, (LAYERS, 12, 576)))
        assert "chunk 2 of 2" in info.value.message
        with pytest.raises(verifyd.NotFound):
            c.release(sid)


def test_create_of_a_live_sequence(client, seq_ids, rng):
    sid = next(seq_ids)
    client.append(sid, random_bf16(rng, (LAYERS, 4, 576)))
    try:
        with pytest.raises(verifyd.FailedPrecondition):
            client.append(sid, random_bf16(rng, (LAYERS, 4, 576)))
        assert client.stats() is not None
    finally:
        client.release(sid)


def test_wrong_expected_fill_names_both_numbers(client, seq_ids, rng):
    sid = next(seq_ids)
    client.append(sid, random_bf16(rng, (LAYERS, 4, 576)))
    try:
        with pytest.raises(verifyd.FailedPrecondition) as info:
            client.append(sid, random_bf16(rng, (LAYERS, 4, 576)), expected_fill=9)
        assert "9" in info.value.message and "4" in info.value.message
    finally:
        client.release(sid)


def test_expected_fill_of_an_unknown_sequence(client, seq_ids, rng):
    sid = next(seq_ids)
    with pytest.raises((verifyd.FailedPrecondition, verifyd.NotFound)):
        client.append(sid, random_bf16(rng, (LAYERS, 4, 576)), expected_fill=0)
    with pytest.raises(verifyd.NotFound):
        client.release(sid)
