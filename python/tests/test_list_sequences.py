"""Client.list_sequences / all_sequences (issue 17: the "release what leaked" runbook)."""
import time

import pytest

import verifyd

from conftest import LAYERS
from helpers import prefill, tree_inputs


def test_fields_and_pages(client, seq_ids, rng):
    a, b, c = next(seq_ids), next(seq_ids), next(seq_ids)
    prefill(client, a, rng, 12)
    prefill(client, b, rng, 7)
    prefill(client, c, rng, 30)
    parents = [-1, 0, 0, 1, 1]
    for layer in range(LAYERS):
        client.verify(layer, [(c, parents)], *tree_inputs(rng, len(parents)))

    listed = {s.sequence_id: s for s in client.all_sequences()}
    assert {a, b, c} <= set(listed)
    assert [listed[x].committed_length for x in (a, b, c)] == [12, 7, 30]
    assert [listed[x].pending_tree_nodes for x in (a, b, c)] == [0, 0, 5]
    assert [listed[x].shared_tokens for x in (a, b, c)] == [0, 0, 0]
    lease = listed[a].idle_seconds + listed[a].lease_remaining_seconds
    for x in (a, b, c):
        assert 0 <= listed[x].idle_seconds < 60
        assert listed[x].idle_seconds + listed[x].lease_remaining_seconds == pytest.approx(
            lease, abs=1e-3)

    # Pages of two, by hand: ascending, each id once, the same set as all_sequences.
    ids, after = [], None
    while True:
        page = client.list_sequences(after, limit=2)
        assert len(page.sequences) <= 2
        ids += [s.sequence_id for s in page.sequences]
        if not page.truncated:
            break
        after = page.sequences[-1].sequence_id
    assert ids == sorted(set(ids))
    assert {a, b, c} <= set(ids)
    assert page.total_sequences >= 3

    client.release(b)
    assert b not in {s.sequence_id for s in client.all_sequences()}
    client.release(a)
    client.commit(c, [])
    client.release(c)


def test_limit_out_of_range_is_refused_here(client):
    with pytest.raises(verifyd.InvalidArgument):
        client.list_sequences(limit=-1)
    with pytest.raises(verifyd.InvalidArgument):
        client.list_sequences(limit=2**32)


def test_listing_renews_no_lease(short_lease_daemon, seq_ids, rng):
    with short_lease_daemon.client() as c:
        sid = next(seq_ids)
        prefill(c, sid, rng, 3)
        deadline = time.monotonic() + 10
        while sid in {s.sequence_id for s in c.all_sequences()}:
            assert time.monotonic() < deadline, "listing kept the lease alive"
            time.sleep(0.05)
        with pytest.raises(verifyd.NotFound):
            c.release(sid)


def test_over_tcp_every_call_carries_the_token(seq_ids, rng, tmp_path):
    """Over --tcp the daemon gates every call that changes state, and ListSequences, on the admin
    token (plans/0015): the client sends it with every call, not with compact alone."""
    import re

    from conftest import Daemon

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    d = Daemon("tcp", ["--tcp=127.0.0.1:0", f"--admin_token_file={token}"])
    try:
        match = None
        deadline = time.monotonic() + 10
        while match is None and time.monotonic() < deadline:
            match = re.search(r" tcp=(\S+)", d.log())
            time.sleep(0.05)
        assert match, f"no tcp= on the startup line: {d.log()}"
        address = match.group(1)
        sid = next(seq_ids)
        with verifyd.Client(address, admin_token="s3cret") as c:
            prefill(c, sid, rng, 4)
            assert sid in {s.sequence_id for s in c.all_sequences()}
            assert c.release(sid) > 0
        with verifyd.Client(address) as anonymous:
            assert anonymous.stats().backend == "cpu"  # reads need no token
            with pytest.raises(verifyd.PermissionDenied, match="ListSequences over TCP"):
                anonymous.list_sequences()
            with pytest.raises(verifyd.PermissionDenied, match="Append over TCP"):
                prefill(anonymous, sid, rng, 4)
    finally:
        d.stop()
