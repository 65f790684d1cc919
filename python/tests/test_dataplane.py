"""The co-located data plane from Python (verifyd.dataplane, libverifyd_dataplane.so) against the
CPU daemon: sealed memfd buffers registered as regions, a channel, Verify and Commit descriptors,
every output element checked against the float64 reference, and the error paths (same code and
message as the gRPC path; NaN outputs and the done flag on failure)."""
import fcntl
import os
import subprocess
import sys

import grpc
import numpy as np
import pytest

import verifyd
from verifyd import dataplane, dataplane_abi, dataplane_library
from verifyd.reference import check_close, verify_reference
from verifyd.tensors import bf16_to_float32, random_bf16

from conftest import HEADS, LAYERS, REPO
from helpers import DLPackOnly, HandmadeDLPack

H = HEADS


@pytest.fixture
def plane(client):
    if not dataplane.available():
        pytest.fail(f"the data-plane library must be built for these tests: "
                    f"{dataplane.why_unavailable()}", pytrace=False)
    return client.data_plane()


class Step:
    """One Verify's tensors and flags taken from a host buffer."""

    def __init__(self, buf, total_q, torch=False):
        self.q = buf.take((total_q, H, 576), "bfloat16", torch)
        self.tree_kv = buf.take((total_q, 576), "bfloat16", torch)
        self.out = buf.take((total_q, H, 512), "bfloat16", torch)
        self.lse = buf.take((total_q, H), "float32", torch)
        self.flags = buf.take((16,), "uint32")  # ready at [0], done at [8]: own cache lines

    @property
    def ready(self):
        return self.flags[0:1]

    @property
    def done(self):
        return self.flags[8:9]


def out_bits(x):
    if hasattr(x, "numpy"):  # torch bf16 view
        import torch
        return x.view(torch.int16).numpy().view(np.uint16)
    return np.asarray(x)


def test_channel_verify_rounds_with_riding_and_descriptor_commits(client, plane, seq_ids, rng):
    """3 sequences x 3 rounds x every layer through the channel, commits riding on each round's
    first layer, the last round committed by Commit descriptors; every output element and lse
    against float64, the done flag, the committed lengths; the first layer of round 0 is also
    sent through the gRPC Verify and must give the same bytes."""
    scale = client.stats().softmax_scale
    sids = [next(seq_ids) for _ in range(3)]
    lengths = {sid: n for sid, n in zip(sids, (21, 7, 40))}
    prefix = {}
    for sid in sids:
        kv = random_bf16(rng, (LAYERS, lengths[sid], 576))
        client.append(sid, kv)
        prefix[sid] = [kv[layer] for layer in range(LAYERS)]
    trees = {sids[0]: [-1, 0, 0, 1, 2], sids[1]: [-1], sids[2]: [-1, 0, 1, -1]}
    accepted_paths = [{sids[0]: [0, 1, 3], sids[1]: [0], sids[2]: [3]},
                      {sids[0]: [0, 2, 4], sids[1]: [], sids[2]: [0, 1]},
                      {sids[0]: [0], sids[1]: [0], sids[2]: [0, 1, 2]}]
    total_q = sum(len(p) for p in trees.values())
    buf = plane.host_buffer(8 << 20)
    step = Step(buf, total_q)
    with plane.open_channel(8) as ch:
        pending = {}
        last_tkv = {}  # the previous round's tree_kv per sequence and layer
        flag_value = 0
        for round_ in range(3):
            tree_kvs = {}
            for layer in range(LAYERS):
                seqs = [verifyd.VerifySequence(sid, trees[sid],
                                               pending.get(sid) if layer == 0 else None)
                        for sid in sids]
                q = random_bf16(rng, (total_q, H, 576))
                tkv = random_bf16(rng, (total_q, 576))
                step.q[...] = q
                step.tree_kv[...] = tkv
                step.out[...] = 0xFFFF  # NaN bits: the daemon must overwrite every element
                flag_value += 1
                i = ch.verify(layer, seqs, step.q, step.tree_kv, step.out, step.lse,
                              ready=(step.ready, flag_value), done=(step.done, flag_value))
                c = ch.result(i)
                assert c.ok and c.method == "Verify" and c.message == ""
                assert int(step.done[0]) == flag_value
                if layer == 0:
                    for sid in sids:
                        if sid in pending:
                            p = pending.pop(sid)
                            for ll in range(LAYERS):
                                prefix[sid][ll] = np.concatenate(
                                    [prefix[sid][ll], last_tkv[sid][ll][p]])
                row = 0
                for sid in sids:
                    n = len(trees[sid])
                    o, ref_lse = verify_reference(prefix[sid][layer], tkv[row:row + n],
                                                  q[row:row + n], trees[sid], scale)
                    check_close(step.out[row:row + n], o, f"round {round_} layer {layer} seq {sid}",
                                lse=step.lse[row:row + n], ref_lse=ref_lse)
                    tree_kvs.setdefault(sid, []).append(tkv[row:row + n].copy())
                    row += n
                if round_ == 0 and layer == 0:
                    g = client.verify(0, [(sid, trees[sid]) for sid in sids], q, tkv,
                                      return_lse=True)
                    assert np.array_equal(np.asarray(g.out), step.out), "channel != gRPC bytes"
                    assert np.array_equal(np.asarray(g.lse), step.lse)
            last_tkv = tree_kvs
            pending = dict(accepted_paths[round_])
        # The last round's commits as Commit descriptors; their completion is the answer.
        ids = {sid: ch.commit(sid, pending[sid]) for sid in sids}
        for sid in sids:
            c = ch.result(ids[sid])
            assert c.method == "Commit"
            expect = prefix[sid][0].shape[0] + len(pending[sid])
            assert c.committed_length == expect
    # Every round's accepted rows are in the daemon's prefix: one gRPC Verify per sequence checks.
    for sid in sids:
        p = pending[sid]
        for ll in range(LAYERS):
            prefix[sid][ll] = np.concatenate([prefix[sid][ll], last_tkv[sid][ll][p]])
        q = random_bf16(rng, (1, H, 576))
        tkv = random_bf16(rng, (1, 576))
        g = client.verify(1, [(sid, [-1])], q, tkv)
        o, _ = verify_reference(prefix[sid][1], tkv, q, [-1], scale)
        check_close(g.out, o, f"after commits seq {sid}")
        client.release(sid)
    buf.release()


def test_torch_views_and_softmax_scale(client, plane, seq_ids, rng):
    torch = pytest.importorskip("torch")
    sid = next(seq_ids)
    kv = random_bf16(rng, (LAYERS, 33, 576))
    client.append(sid, kv)
    parents = [-1, 0, 1, 0]
    buf = plane.host_buffer(1 << 20, torch=True)
    step = Step(buf, len(parents), torch=True)
    q = random_bf16(rng, (4, H, 576))
    tkv = random_bf16(rng, (4, 576))
    step.q.copy_(torch.from_numpy(q.view(np.int16)).view(torch.bfloat16))
    step.tree_kv.copy_(torch.from_numpy(tkv.view(np.int16)).view(torch.bfloat16))
    with client.open_channel() as ch:
        i = ch.verify(1, [(sid, parents)], step.q, step.tree_kv, step.out, step.lse,
                      ready=(step.ready, 5), done=(step.done, 5), softmax_scale=0.03)
        ch.result(i)
    o, ref_lse = verify_reference(kv[1], tkv, q, parents, 0.03)
    check_close(out_bits(step.out), o, lse=step.lse.numpy(), ref_lse=ref_lse)
    client.release(sid)
    buf.release()


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_dlpack_only_objects_in_a_channel_verify(client, plane, seq_ids, rng, kind):
    """q, tree_kv, out, lse and both flag words as objects offering only DLPack (views of the host
    buffer underneath): the same output bytes as the plain views, which match float64."""
    torch = pytest.importorskip("torch") if kind == "torch" else None
    sid = next(seq_ids)
    kv = random_bf16(rng, (LAYERS, 17, 576))
    client.append(sid, kv)
    scale = client.stats().softmax_scale
    parents = [-1, 0, 0, 1]
    n = len(parents)
    buf = plane.host_buffer(1 << 20, torch=torch is not None)
    step = Step(buf, n, torch=torch is not None)
    q, tkv = random_bf16(rng, (n, H, 576)), random_bf16(rng, (n, 576))
    if torch is None:
        step.q[...], step.tree_kv[...] = q, tkv
    else:
        step.q.copy_(torch.from_numpy(q.view(np.int16)).view(torch.bfloat16))
        step.tree_kv.copy_(torch.from_numpy(tkv.view(np.int16)).view(torch.bfloat16))
    results, wrapped = [], []
    with plane.open_channel() as ch:
        for value, wrap in ((1, lambda x: x), (2, DLPackOnly)):
            if torch is None:
                step.out[...], step.lse[...] = 0xFFFF, 0.0  # NaN bits: must be overwritten
            else:
                step.out.view(torch.int16).fill_(-1)
                step.lse.fill_(0.0)
            args = [wrap(x) for x in (step.q, step.tree_kv, step.out, step.lse, step.ready,
                                      step.done)]
            i = ch.verify(1, [(sid, parents)], *args[:4], ready=(args[4], value),
                          done=(args[5], value))
            assert ch.result(i).ok
            assert int(step.done[0]) == value
            lse = step.lse.numpy() if torch is not None else step.lse
            results.append((out_bits(step.out).copy(), np.array(lse)))
            wrapped = args
    assert all(w.calls > 0 and set(w.streams) == {None} for w in wrapped)  # read through DLPack
    o, ref_lse = verify_reference(kv[1], tkv, q, parents, scale)
    check_close(results[0][0], o, "plain views", lse=results[0][1], ref_lse=ref_lse)
    assert results[1][0].tobytes() == results[0][0].tobytes(), "DLPack out != plain out"
    assert results[1][1].tobytes() == results[0][1].tobytes(), "DLPack lse != plain lse"
    client.release(sid)
    buf.release()


class _RecordingLib:
    """The library with vd_register_cuda / vd_release_memory recorded instead of done (no GPU
    here): what register() asks of it."""

    def __init__(self, real):
        self._real = real
        self.registered = []

    def vd_register_cuda(self, handle, pointer, nbytes, region, base):
        self.registered.append((pointer, nbytes))
        region._obj.value = 900 + len(self.registered)
        base._obj.value = pointer - 4096  # the allocation starts before the tensor
        return 0

    def vd_release_memory(self, handle, region, out):
        return 0

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_register_takes_a_dlpack_cuda_object_as_a_cuda_array_interface_one(plane):
    address, shape = 0x7F0000010000, (64, 576)

    class Cai:
        __cuda_array_interface__ = {"shape": shape, "typestr": "<u2", "data": (address, False),
                                    "version": 2}
    dl = HandmadeDLPack(address, shape, device=(2, 0))
    real, plane._lib = plane._lib, _RecordingLib(plane._lib)
    try:
        m_cai = plane.register(Cai())
        m_cai.release()
        m = plane.register(dl)
        assert plane._lib.registered == [(address, 64 * 576 * 2)] * 2
        assert (m.base, m.bytes, m.device) == (m_cai.base, m_cai.bytes, True)
        assert m._keep is dl  # the object, not its capsule, keeps the memory registered
        # A tensor inside it: the same region, and a Ref into it.
        inner = HandmadeDLPack(address + 1152, (3, 2, 576), code=4, bits=16, device=(2, 0))
        assert plane.register(inner) is m and len(plane._lib.registered) == 2
        ref, at, on_device = plane.ref(inner, "q")
        assert (ref, at, on_device) == (dataplane.Ref(m.region, 4096 + 1152), address + 1152, True)
        with pytest.raises(verifyd.InvalidArgument, match="host_buffer"):
            plane.register(HandmadeDLPack(address, shape))  # kDLCPU: not device memory
        with pytest.raises(verifyd.InvalidArgument, match="tensor is on DLPack device type 10"):
            plane.register(HandmadeDLPack(address, shape, device=(10, 0)))
        with pytest.raises(verifyd.InvalidArgument, match="tensor is not C-contiguous"):
            plane.register(HandmadeDLPack(address, (4, 4), strides=(1, 4), device=(2, 0)))
        m.release()
    finally:
        plane._lib = real


def _nan(bits):
    return np.isnan(bf16_to_float32(np.asarray(bits))).all()


def _grpc_error(fn):
    with pytest.raises(verifyd.VerifydError) as e:
        fn()
    return e.value


def test_errors_match_the_grpc_path_nan_and_done(client, plane, seq_ids, rng):
    """Unknown sequence, bad parents, a commit without a tree: the channel's completion has the
    gRPC Verify's code and message; out and lse are NaN; done is written; nothing changed."""
    sid = next(seq_ids)
    client.append(sid, random_bf16(rng, (LAYERS, 12, 576)))
    buf = plane.host_buffer(1 << 20)
    cases = [
        ("unknown sequence", [(sid + 999999, [-1, 0])]),
        ("bad parents", [(sid, [-1, 5])]),
        ("parent not before child", [(sid, [1, -1])]),
        ("commit without a pending tree", [(sid, [-1, 0], [0])]),
        ("layer out of range", None),
    ]
    with plane.open_channel(4) as ch:
        for n, (what, seqs) in enumerate(cases, start=1):
            layer = 0
            if seqs is None:
                layer, seqs = LAYERS, [(sid, [-1, 0])]
            step = Step(buf, 2)
            buf.reset()
            q, tkv = random_bf16(rng, (2, H, 576)), random_bf16(rng, (2, 576))
            step.q[...] = q
            step.tree_kv[...] = tkv
            step.out[...] = 0x3F80  # 1.0: must become NaN
            step.lse[...] = 1.0
            before = client.stats()
            i = ch.verify(layer, seqs, step.q, step.tree_kv, step.out, step.lse,
                          ready=(step.ready, n), done=(step.done, n))
            c = ch.wait()
            assert c.id == i and not c.ok, what
            want = _grpc_error(lambda: client.verify(layer, seqs, q, tkv, return_lse=True))
            assert (c.code, c.message) == (want.code, want.message), what
            with pytest.raises(verifyd.VerifydError) as raised:
                c.raise_for_status()
            assert raised.value.code == want.code and type(raised.value) is type(want)
            assert int(step.done[0]) == n, what
            assert _nan(step.out) and np.isnan(step.lse).all(), what
            after = client.stats()
            assert after.pending_tokens == before.pending_tokens, what
    client.release(sid)
    buf.release()


def test_bad_references_are_named(client, plane, daemon, seq_ids, rng):
    """What only the channel can get wrong: a region of another client (PERMISSION_DENIED), a
    misaligned offset, an unregistered region, a flag's alignment: each named with its bound."""
    sid = next(seq_ids)
    client.append(sid, random_bf16(rng, (LAYERS, 9, 576)))
    buf = plane.host_buffer(1 << 20)
    other = daemon.client(client_id="another-scheduler")
    theirs = other.host_buffer(1 << 16)
    step = Step(buf, 3)
    step.q[...] = random_bf16(rng, (3, H, 576))
    step.tree_kv[...] = random_bf16(rng, (3, 576))

    def refs():
        r = {name: plane.ref(getattr(step, name), name)[0]
             for name in ("q", "tree_kv", "out", "lse")}
        r["ready"] = plane.ref(step.ready, "ready")[0]
        r["done"] = plane.ref(step.done, "done")[0]
        return r

    R = dataplane.Ref
    cases = [
        ("tree_kv", lambda r: R(theirs.region, 0), grpc.StatusCode.PERMISSION_DENIED,
         f"tree_kv.region = {theirs.region} belongs to another client", True),
        ("q", lambda r: R(r["q"].region, r["q"].offset + 32), grpc.StatusCode.INVALID_ARGUMENT,
         f"q.offset = {refs()['q'].offset + 32} must be a multiple of 64", True),
        ("q", lambda r: R(12345, 0), grpc.StatusCode.NOT_FOUND,
         "q.region = 12345 is not a registered external region", True),
        ("ready", lambda r: R(r["ready"].region, r["ready"].offset + 2),
         grpc.StatusCode.INVALID_ARGUMENT,
         f"ready.offset = {refs()['ready'].offset + 2} must be a multiple of 4", True),
        ("out", lambda r: R(r["out"].region, (1 << 20) - 64), grpc.StatusCode.INVALID_ARGUMENT,
         f"out.offset = {(1 << 20) - 64} + {3 * H * 512 * 2} bytes must be <= the {1 << 20} "
         f"bytes of region {buf.region}", False),
    ]
    with plane.open_channel(4) as ch:
        for n, (field, mutate, code, message, nan) in enumerate(cases, start=1):
            r = refs()
            r[field] = mutate(r)
            step.out[...] = 0x3F80
            step.lse[...] = 1.0
            step.done[0] = 0
            step.ready[0] = n  # the host is the stream: q is written
            i = ch.enqueue_verify(0, [(sid, [-1, 0, 1])], q=r["q"], tree_kv=r["tree_kv"],
                                  out=r["out"], lse=r["lse"], ready=(r["ready"], n),
                                  done=(r["done"], n))
            c = ch.wait()
            assert c.id == i
            assert c.code == code, (field, c)
            assert message in c.message, (field, c.message)
            assert int(step.done[0]) == n, field
            if nan:
                assert _nan(step.out) and np.isnan(step.lse).all(), field
    # Client-side checks before anything is sent: name the field and the bound.
    with plane.open_channel(2) as ch:
        outside = np.zeros((3, H, 576), np.uint16)
        with pytest.raises(verifyd.InvalidArgument, match="q .* is not inside a buffer"):
            ch.verify(0, [(sid, [-1, 0, 1])], outside, step.tree_kv, step.out,
                      ready=(step.ready, 1), done=(step.done, 1))
        with pytest.raises(verifyd.InvalidArgument, match=r"tree_kv has shape \[3, 576\]; "
                                                          r"need \[2, 576\]"):
            ch.verify(0, [(sid, [-1, 0])], buf.view(0, (2, H, 576)), step.tree_kv, step.out,
                      ready=(step.ready, 1), done=(step.done, 1))
    theirs.release()
    other.close()
    client.release(sid)
    buf.release()


def test_registration_errors_and_ownership(client, plane, daemon):
    with pytest.raises(verifyd.NotFound, match="cannot open"):
        plane.register_file(f"/proc/{os.getpid()}/fd/99999", 4096)
    buf = plane.host_buffer(1 << 16)
    assert not os.path.exists(buf.path)  # the descriptor was closed once the daemon mapped it
    # The daemon maps a sealed memfd of this process and nothing else (issue 33 N3, N5).
    path = f"/dev/shm/verifyd-py-test-{os.getpid()}"
    with open(path, "wb") as f:
        f.truncate(1 << 16)
    try:
        with pytest.raises(verifyd.InvalidArgument, match="must be /proc/"):
            plane.register_file(path, 4096)
        fd = os.open(path, os.O_RDWR)
        try:
            with pytest.raises(verifyd.InvalidArgument, match="not a memfd sealed"):
                plane.register_file(f"/proc/{os.getpid()}/fd/{fd}", 4096)
        finally:
            os.close(fd)
    finally:
        os.unlink(path)
    fd = os.memfd_create("t", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 1 << 16)
        os.posix_fallocate(fd, 0, 1 << 16)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        with pytest.raises(verifyd.InvalidArgument, match="bytes"):
            plane.register_file(f"/proc/{os.getpid()}/fd/{fd}", 1 << 20)  # longer than the memfd
        with pytest.raises(verifyd.InvalidArgument, match="device"):
            plane.register_file(f"/proc/{os.getpid()}/fd/{fd}", 4096, device=7)
    finally:
        os.close(fd)
    with pytest.raises(verifyd.InvalidArgument, match="host_buffer"):
        plane.register(np.zeros(16, np.uint16))
    other = daemon.client(client_id="third-scheduler")
    with pytest.raises(verifyd.PermissionDenied):
        dataplane_library.check(other.data_plane()._lib.vd_release_memory(
            other.data_plane()._handle, buf.region, None), "ReleaseExternalMemory")
    other.close()
    stats = client.stats()
    assert stats.external_regions >= 1
    region = buf.region
    buf.release()
    with pytest.raises(verifyd.NotFound):
        dataplane_library.check(plane._lib.vd_release_memory(plane._handle, region, None),
                         "ReleaseExternalMemory")
    if not dataplane.has_cuda():
        with pytest.raises(verifyd.FailedPrecondition, match="without CUDA"):
            dataplane_library.check(plane._lib.vd_register_cuda(plane._handle, 1 << 20, 64,
                                                         dataplane_abi.U64(), dataplane_abi.U64()),
                             "RegisterExternalMemory")
    else:  # built with CUDA; no GPU here (CI) or not device memory: a refusal, not a crash
        r, b = dataplane_abi.U64(), dataplane_abi.U64()
        rc = plane._lib.vd_register_cuda(plane._handle, 4096, 64, r, b)
        assert rc < 0 and plane._lib.vd_last_error()


def test_channel_lifecycle_back_pressure_and_close(client, plane, seq_ids, rng):
    sid = next(seq_ids)
    client.append(sid, random_bf16(rng, (LAYERS, 5, 576)))
    buf = plane.host_buffer(1 << 20)
    step = Step(buf, 1)
    step.q[...] = random_bf16(rng, (1, H, 576))
    step.tree_kv[...] = random_bf16(rng, (1, 576))
    ch = plane.open_channel(2)
    assert ch.entries == 2 and ch.id != 0
    # Two Verifies whose ready flag is not written yet: the ring is full.
    step.ready[0] = 0
    r = {name: plane.ref(getattr(step, name), name)[0] for name in ("q", "tree_kv", "out")}
    rdy, dn = plane.ref(step.ready, "ready")[0], plane.ref(step.done, "done")[0]
    for k in range(2):
        ch.enqueue_verify(0, [(sid, [-1])], **r, ready=(rdy, 1), done=(dn, 1))
    with pytest.raises(verifyd.ResourceExhausted):
        ch.enqueue_verify(0, [(sid, [-1])], **r, ready=(rdy, 1), done=(dn, 1))
    with pytest.raises(verifyd.DeadlineExceeded):
        ch.wait(timeout=0.05)
    step.ready[0] = 1  # both may run now
    assert [c.ok for c in (ch.wait(), ch.wait())] == [True, True]
    assert ch.poll() == []
    with pytest.raises(verifyd.FailedPrecondition, match="nothing is in flight"):
        ch.wait(timeout=0.01)
    ch.close()
    ch.close()  # idempotent
    with pytest.raises(verifyd.InvalidArgument, match="power of two"):
        plane.open_channel(3)
    client.release(sid)
    buf.release()


def test_missing_library_is_a_clear_data_plane_unavailable(daemon, tmp_path):
    """Run in a fresh interpreter: the loader caches its answer per process."""
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "import verifyd\n"
        "from verifyd import dataplane\n"
        "assert not dataplane.available()\n"
        "c = verifyd.Client(%r)\n"
        "try:\n"
        "    c.data_plane()\n"
        "except dataplane.DataPlaneUnavailable as e:\n"
        "    assert isinstance(e, NotImplementedError)\n"
        "    print('UNAVAILABLE:', e)\n"
        "c.close()\n" % (str(REPO / "python"), daemon.target))
    env = dict(os.environ, VERIFYD_DATAPLANE_LIB=str(tmp_path / "nothing" / "libx.so"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "UNAVAILABLE:" in r.stdout
    assert "libx.so" in r.stdout and "VERIFYD_DATAPLANE_LIB" in r.stdout


def test_fork(client, seq_ids, rng):
    """Fork over the Python gRPC client: the new sequence shares the source's first tokens."""
    src, new = next(seq_ids), next(seq_ids)
    kv = random_bf16(rng, (LAYERS, 30, 576))
    client.append(src, kv)
    r = client.fork(src, new, 20)
    assert r.committed_length == 20 and r.shared_tokens >= 20
    scale = client.stats().softmax_scale
    q, tkv = random_bf16(rng, (2, H, 576)), random_bf16(rng, (2, 576))
    v = client.verify(1, [(new, [-1, 0])], q, tkv)
    o, _ = verify_reference(kv[1][:20], tkv, q, [-1, 0], scale)
    check_close(v.out, o, "forked")
    with pytest.raises(verifyd.VerifydError) as e:
        client.fork(src, new, 5)
    assert e.value.code == grpc.StatusCode.ALREADY_EXISTS and str(new) in e.value.message
    with pytest.raises(verifyd.NotFound):
        client.fork(src + 10**9, next(seq_ids), 5)
    with pytest.raises(verifyd.VerifydError) as e:
        client.fork(src, next(seq_ids), 31)
    assert e.value.code == grpc.StatusCode.OUT_OF_RANGE
    assert e.value.message == (f"length = 31 must be <= the committed length 30 of "
                               f"source_sequence_id = {src}")
    client.release(new)
    client.release(src)


def test_prepared_sequences_are_a_copy(client, plane, seq_ids, rng):
    """A prepared batch (what the adapter reuses across a step's layers) gives the reference
    result, and a later change to the source lists does not reach it."""
    sid = next(seq_ids)
    kv = random_bf16(rng, (LAYERS, 10, 576))
    client.append(sid, kv)
    scale = client.stats().softmax_scale
    parents = [-1, 0, 1]
    seqs = [verifyd.VerifySequence(sid, parents)]
    buf = plane.host_buffer(1 << 20)
    step = Step(buf, 3)
    with plane.open_channel() as ch:
        prepared = ch.prepare(seqs)
        assert prepared.total_q == 3 and len(prepared) == 1
        parents[2] = 0  # too late for `prepared`
        for layer in range(LAYERS):
            q, tkv = random_bf16(rng, (3, H, 576)), random_bf16(rng, (3, 576))
            step.q[...], step.tree_kv[...] = q, tkv
            ch.result(ch.verify(layer, prepared, step.q, step.tree_kv, step.out,
                                ready=(step.ready, layer + 1), done=(step.done, layer + 1)))
            o, _ = verify_reference(kv[layer], tkv, q, [-1, 0, 1], scale)
            check_close(step.out, o, f"prepared layer {layer}")
    client.release(sid)
    buf.release()
