#!/usr/bin/env python3
"""The Python data plane on a GPU (H200): torch CUDA tensors registered with a cuda-backend daemon,
stream-ordered Verify through a channel, every output element against the float64 reference.

Needs no pytest (the GPU hosts have Python 3.12 + torch with CUDA, no pip): each check prints
PASS/FAIL and the last line is "N passed, N failed" (exit 1 on any failure). Run by
tools/device/run_device.sh from the bundle (tools/device/make_bundle.sh puts the package with its
generated stubs under bundle/python and libverifyd_dataplane.so under bundle/pylib):

    python3 tools/device/python_dataplane_gpu.py --verifyd bundle/bin/verifyd \
        --python bundle/python --lib bundle/pylib/libverifyd_dataplane.so \
        --daemon-ld-path bundle/lib

python/tests/test_dataplane_cuda.py runs the same checks under pytest where CUDA is present.
`--installed` runs them on the verifyd package this Python has installed (the wheel, as
tools/device/wheel_gpu.sh installs it) instead of a directory.

Checks:
  stream_order      3 rounds x 2 layers, 2 sequences, commits riding, a Commit descriptor; per
                    layer: inputs copied on the stream, verify() (CPU does not block), a clone of
                    out enqueued right after (ordered by the done wait); one sync per round; every
                    element of every clone and lse against float64; gRPC Verify gives the same
                    bytes for the same inputs
  errors            unknown sequence / bad parents: the gRPC path's code and message, out NaN on
                    the device, done written, the stream not stuck
  adapter_loop      VerifyAttention(transport="device") in 4 decode steps with a GEMM between
                    layers producing q (engine-like), outputs against float64
  dlpack            a CUDA buffer registered and named only through __dlpack__ (as JAX/CuPy
                    arrays are): the channel's out bit-identical to the gRPC Verify's
  cost              per-layer host cost of Channel.verify() against the bare C calls it makes
                    (enqueue + two stream operations), and the per-layer wall time (printed)
  append_registered bf16 prefill rows in a registered CUDA allocation appended by region and
                    offset (Client.append_registered): the same attention, bit for bit, as the
                    same rows inline; a bad value named word for word as inline, nothing kept
  append_registered_fp8  (a second daemon, --kv_dtype=fp8) the same with rows already in the
                    656-byte fp8 layout: the device finds the bad row, the message is the inline
                    path's
"""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
LAYERS, HEADS = 2, 8


def _setup_path(python_dir: str | None, lib: str | None, installed: bool = False) -> None:
    if installed:  # the package and its library as the wheel installed them
        return
    sys.path.insert(0, python_dir or os.path.join(HERE, "..", "..", "python"))
    if lib:
        os.environ["VERIFYD_DATAPLANE_LIB"] = lib


class CudaDaemon:
    def __init__(self, binary: str, heads: int = HEADS, layers: int = LAYERS,
                 ld_path: str | None = None, backend: str = "cuda", extra=()):
        import verifyd
        self.dir = tempfile.mkdtemp(prefix="verifyd-pygpu-")
        self.target = f"unix://{self.dir}/verifyd.sock"
        self.log = os.path.join(self.dir, "daemon.log")
        self._out = open(self.log, "w")
        self.proc = subprocess.Popen(
            [binary, f"--listen={self.target}", "--metrics=", f"--backend={backend}",
             f"--layers={layers}", f"--heads={heads}", "--max_tree_nodes=64",
             "--kv_capacity_tokens=65536", "--drain_seconds=2", *extra],
            stdout=self._out, stderr=subprocess.STDOUT,
            env=dict(os.environ, LD_LIBRARY_PATH=ld_path) if ld_path else None)
        try:
            with verifyd.Client(self.target) as c:
                c.wait_until_serving(timeout=60)
        except Exception:
            self.stop()
            raise RuntimeError("verifyd did not start: " + open(self.log).read())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()
        if self.proc.returncode == 0:
            shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


# -- helpers -------------------------------------------------------------------------------------
def _t(bits):
    import numpy as np
    import torch
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)


def _bits(x):
    import numpy as np
    import torch
    return x.detach().cpu().view(torch.int16).numpy().view(np.uint16)


_KEEP = []  # every pool's memory stays allocated until the end: torch's caching allocator must
           # not hand a released pool's segment to the next one (the daemon would open the same IPC
           # handle while its previous mapping may still be closing)


class Pool:
    """One registered device allocation carved into 256-byte-aligned tensors."""

    def __init__(self, client, nbytes: int):
        import torch
        self.raw = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        _KEEP.append(self.raw)
        self.memory = client.register(self.raw)
        self.cursor = 0

    def take(self, shape, dtype):
        import numpy as np
        import torch
        size = int(np.prod(shape)) * torch.tensor([], dtype=dtype).element_size()
        off = -(-self.cursor // 256) * 256
        if off + size > self.raw.numel():
            raise RuntimeError("pool too small")
        self.cursor = off + size
        return self.raw[off:off + size].view(dtype).view(*shape)


def _one_layer(pool, rng, total: int):
    """q, tree_kv (random bf16, on the device), out and the flag words of one call of `total`
    nodes, carved from `pool`."""
    import torch
    from verifyd.tensors import random_bf16
    q = pool.take((total, HEADS, 576), torch.bfloat16)
    tkv = pool.take((total, 576), torch.bfloat16)
    out = pool.take((total, HEADS, 512), torch.bfloat16)
    flags = pool.take((128,), torch.int32)
    q.copy_(_t(random_bf16(rng, (total, HEADS, 576))).cuda())
    tkv.copy_(_t(random_bf16(rng, (total, 576))).cuda())
    return q, tkv, out, flags


# -- checks --------------------------------------------------------------------------------------
def check_stream_order(target: str, rng) -> str:
    import numpy as np
    import torch
    import verifyd
    from verifyd.reference import check_close, verify_reference
    from verifyd.tensors import random_bf16

    with verifyd.Client(target) as c:
        scale = c.stats().softmax_scale
        a, b = 7001, 7002
        prefix = {}
        for s, n in ((a, 300), (b, 77)):
            kv = random_bf16(rng, (LAYERS, n, 576))
            c.append(s, kv)
            prefix[s] = [kv[l] for l in range(LAYERS)]
        parents = {a: [-1, 0, 0, 1, 2, -1], b: [-1, 0, 1]}
        paths = [{a: [0, 1, 3], b: [0]}, {a: [5], b: [0, 1, 2]}, {a: [0, 2, 4], b: []}]
        total = sum(len(p) for p in parents.values())
        pool = Pool(c, 32 << 20)
        q = pool.take((total, HEADS, 576), torch.bfloat16)
        tkv = pool.take((total, 576), torch.bfloat16)
        out = pool.take((total, HEADS, 512), torch.bfloat16)
        lse = pool.take((total, HEADS), torch.float32)
        flags = pool.take((128,), torch.int32)
        ready, done = flags[0:1], flags[64:65]
        worst = 0.0
        host_us = []
        with c.open_channel() as ch:
            pending, n = {}, 0
            last = None
            for rnd in range(3):
                inputs, snaps = [], []
                for layer in range(LAYERS):
                    qb = random_bf16(rng, (total, HEADS, 576))
                    kb = random_bf16(rng, (total, 576))
                    q.copy_(_t(qb).cuda(non_blocking=False))
                    tkv.copy_(_t(kb).cuda())
                    out.fill_(float("nan"))
                    seqs = [verifyd.VerifySequence(s, parents[s],
                                                   pending.get(s) if layer == 0 else None)
                            for s in (a, b)]
                    n += 1
                    t0 = time.perf_counter()
                    ch.verify(layer, seqs, q, tkv, out, lse, ready=(ready, n), done=(done, n))
                    host_us.append((time.perf_counter() - t0) * 1e6)
                    snaps.append((out.clone(), lse.clone()))  # ordered after "wait done"
                    inputs.append((qb, kb))
                torch.cuda.current_stream().synchronize()
                for comp in ch.poll():
                    comp.raise_for_status()
                if pending:
                    for s in (a, b):
                        for l in range(LAYERS):
                            rows = slice(0, 6) if s == a else slice(6, 9)
                            prefix[s][l] = np.concatenate([prefix[s][l],
                                                           last[l][1][rows][pending[s]]])
                for layer, ((qb, kb), (o_dev, l_dev)) in enumerate(zip(inputs, snaps)):
                    o_bits, l_host = _bits(o_dev), l_dev.cpu().numpy()
                    for s, rows in ((a, slice(0, 6)), (b, slice(6, 9))):
                        ref, ref_lse = verify_reference(prefix[s][layer], kb[rows], qb[rows],
                                                        parents[s], scale)
                        worst = max(worst, check_close(o_bits[rows], ref,
                                                       f"round {rnd} layer {layer} seq {s}",
                                                       lse=l_host[rows], ref_lse=ref_lse))
                if rnd == 0:  # the same inputs through gRPC: checked too, bytes compared
                    qb, kb = inputs[-1]
                    g = c.verify(LAYERS - 1, [(a, parents[a]), (b, parents[b])], qb, kb,
                                 return_lse=True)
                    g_bits = np.asarray(g.out)
                    for s, rows in ((a, slice(0, 6)), (b, slice(6, 9))):
                        ref, _ = verify_reference(prefix[s][LAYERS - 1], kb[rows], qb[rows],
                                                  parents[s], scale)
                        check_close(g_bits[rows], ref, f"gRPC seq {s}")
                    same = int((g_bits == _bits(snaps[-1][0])).sum())
                last = inputs
                pending = dict(paths[rnd])
            ids = {s: ch.commit(s, pending[s]) for s in (a, b)}
            for s in (a, b):
                r = ch.result(ids[s])
                want = prefix[s][0].shape[0] + len(pending[s])
                if r.committed_length != want:
                    raise AssertionError(f"commit of {s}: {r.committed_length} != {want}")
            if int(done.cpu()[0]) != n:
                raise AssertionError(f"done = {int(done.cpu()[0])}, want {n}")
        for s in (a, b):
            c.release(s)
        pool.memory.release()
        host_us.sort()
        return (f"worst relative error {worst:.2e}; verify() host time p50 "
                f"{host_us[len(host_us) // 2]:.1f} us; channel vs gRPC: {same} of "
                f"{g_bits.size} out elements bit-identical")


def check_errors(target: str, rng) -> str:
    import torch
    import verifyd
    from verifyd.tensors import random_bf16

    with verifyd.Client(target) as c:
        c.append(7101, random_bf16(rng, (LAYERS, 40, 576)))
        pool = Pool(c, 8 << 20)
        q, tkv, out, flags = _one_layer(pool, rng, 2)
        with c.open_channel() as ch:
            for n, seqs in enumerate(([(999999, [-1, 0])], [(7101, [-1, 7])]), start=1):
                out.fill_(1.0)
                ch.verify(0, seqs, q, tkv, out, ready=(flags[0:1], n), done=(flags[64:65], n))
                after = out.clone()  # after the done wait: NaN
                torch.cuda.current_stream().synchronize()
                comp = ch.wait(10)
                try:
                    c.verify(0, seqs, q.cpu(), tkv.cpu())
                    raise AssertionError("gRPC Verify accepted a bad call")
                except verifyd.VerifydError as e:
                    if (comp.code, comp.message) != (e.code, e.message):
                        raise AssertionError(f"channel {comp.code} {comp.message!r} != gRPC "
                                             f"{e.code} {e.message!r}")
                if not torch.isnan(after.float()).all():
                    raise AssertionError("outputs of a refused call are not NaN")
                if int(flags[64].cpu()) != n:
                    raise AssertionError("done not written for a refused call")
        c.release(7101)
        pool.memory.release()
    return "codes and messages equal the gRPC path's; NaN; done written"


def _appended_alike(c, a, b, rng, nodes: int = 5) -> int:
    """Verifies one tree over sequences a and b on every layer through gRPC: out and lse must be
    bit-identical (the same rows stored); the trees are then rejected. Returns the elements
    compared."""
    import numpy as np
    from verifyd.tensors import random_bf16
    parents = [-1, 0, 1, 1, -1][:nodes]
    q = random_bf16(rng, (nodes, HEADS, 576), 0.3)
    tkv = random_bf16(rng, (nodes, 576), 2.0)
    compared = 0
    for layer in range(LAYERS):
        va = c.verify(layer, [(a, parents)], q, tkv, return_lse=True)
        vb = c.verify(layer, [(b, parents)], q, tkv, return_lse=True)
        if not (np.array_equal(va.out, vb.out) and np.array_equal(va.lse, vb.lse)):
            raise AssertionError(f"layer {layer}: registered rows attend unlike the inline ones")
        compared += va.out.size + va.lse.size
    c.commit(a, [])
    c.commit(b, [])
    return compared


def _append_registered_rows(c, rng, rows, bad_rows, bad_message_pattern: str) -> str:
    """rows / bad_rows: numpy [LAYERS, T, row] (uint16 bf16 bits or uint8 fp8 rows)."""
    import re

    import torch
    import verifyd
    pool = Pool(c, 32 << 20)
    dtype = torch.uint8 if rows.dtype.itemsize == 1 else torch.int16
    placed = pool.take(rows.shape, dtype)
    placed.copy_(torch.from_numpy(rows.view(dtype=rows.dtype if dtype == torch.uint8 else
                                            "int16")).cuda())
    if dtype == torch.int16:
        placed = placed.view(torch.bfloat16)
    a, b = 7201 + rows.shape[1], 7301 + rows.shape[1]
    c.append(a, rows)
    r = c.append_registered(b, placed)
    if (r.committed_length, r.chunks) != (rows.shape[1], 1):
        raise AssertionError(f"append_registered answered {r}")
    compared = _appended_alike(c, a, b, rng)
    used = c.stats().used_tokens
    bad = pool.take(bad_rows.shape, dtype)
    bad.copy_(torch.from_numpy(bad_rows.view(dtype=bad_rows.dtype if dtype == torch.uint8 else
                                             "int16")).cuda())
    if dtype == torch.int16:
        bad = bad.view(torch.bfloat16)
    messages = []
    for send in (lambda: c.append(7401, bad_rows), lambda: c.append_registered(7401, bad)):
        try:
            send()
            raise AssertionError("a bad row was accepted")
        except verifyd.InvalidArgument as e:
            messages.append(e.message)
    if messages[0] != messages[1]:
        raise AssertionError(f"the device path said {messages[1]!r}, inline {messages[0]!r}")
    if not re.search(bad_message_pattern, messages[1]):
        raise AssertionError(f"the device path's message {messages[1]!r} does not match "
                             f"{bad_message_pattern!r}")
    if c.stats().used_tokens != used:
        raise AssertionError("a refused Append kept tokens")
    c.release(a)
    c.release(b)
    pool.memory.release()
    return (f"{compared} out/lse elements bit-identical to inline rows; a bad value named as "
            f"inline: {messages[1][:90]!r}")


def check_append_registered(target: str, rng) -> str:
    import verifyd
    from verifyd.tensors import random_bf16
    with verifyd.Client(target) as c:
        rows = random_bf16(rng, (LAYERS, 300, 576), 2.0)
        bad = random_bf16(rng, (LAYERS, 7, 576), 2.0)
        bad[1, 5, 100] = 0x7FC0  # NaN
        return _append_registered_rows(c, rng, rows, bad, r"^kv\[1, 5, 100\] = nan")


def check_append_registered_fp8(target: str, rng) -> str:
    import verifyd
    from verifyd.fp8 import quantize_fp8_rows
    from verifyd.tensors import random_bf16
    with verifyd.Client(target) as c:
        rows = quantize_fp8_rows(random_bf16(rng, (LAYERS, 300, 576), 3.0))
        bad = quantize_fp8_rows(random_bf16(rng, (LAYERS, 7, 576), 3.0))
        bad[1, 5, 40] = 0x7F
        return _append_registered_rows(c, rng, rows, bad,
                                       r"^kv\[1, 5\] byte 40 .* NaN encoding")


def check_adapter_loop(target: str, rng) -> str:
    import numpy as np
    import torch
    import verifyd
    from verifyd.adapter import VerifyAttention
    from verifyd.reference import check_close, verify_reference
    from verifyd.tensors import random_bf16

    with verifyd.Client(target) as c:
        scale = c.stats().softmax_scale
        attn = VerifyAttention(c, transport="device")
        s = 7201
        kv = random_bf16(rng, (LAYERS, 500, 576))
        attn.prefill(s, _t(kv))
        prefix = [kv[l] for l in range(LAYERS)]
        pool = Pool(c, 16 << 20)
        nodes = 5
        parents = [-1, 0, 0, 1, 3]
        q = pool.take((nodes, HEADS, 576), torch.bfloat16)
        tkv = pool.take((nodes, 576), torch.bfloat16)
        outs = [pool.take((nodes, HEADS, 512), torch.bfloat16) for _ in range(LAYERS)]
        g = torch.Generator(device="cuda").manual_seed(5)
        w_q = (torch.randn(512 * HEADS, HEADS * 576, device="cuda", generator=g) * 0.02
               ).to(torch.bfloat16)
        worst = 0.0
        for step in range(4):
            attn.begin_step([(s, parents)])
            x = _t(random_bf16(rng, (nodes, 512 * HEADS))).cuda()
            taken = []
            for layer in range(LAYERS):
                torch.matmul(x, w_q, out=q.view(nodes, HEADS * 576))  # the engine's GEMM
                tkv.copy_(_t(random_bf16(rng, (nodes, 576))).cuda())
                q_host, k_host = q.clone(), tkv.clone()  # stream-ordered snapshots
                attn.forward_verify(layer, q, tkv, outs[layer])
                x = outs[layer].reshape(nodes, HEADS * 512)  # next layer reads out on the stream
                taken.append((q_host, k_host, outs[layer].clone()))
            attn.synchronize()
            for layer, (qd, kd, od) in enumerate(taken):
                ref, _ = verify_reference(prefix[layer], _bits(kd), _bits(qd), parents, scale)
                worst = max(worst, check_close(_bits(od), ref, f"step {step} layer {layer}"))
            path = [0, 1, 3] if step % 2 == 0 else [0]
            attn.end_step({s: path})
            for layer, (_, kd, _) in enumerate(taken):
                prefix[layer] = np.concatenate([prefix[layer], _bits(kd)[path]])
        attn.flush_commits()
        want = 500 + 2 * 3 + 2 * 1
        if attn.committed_length[s] != want:
            raise AssertionError(f"committed {attn.committed_length[s]} != {want}")
        attn.release(s)
        attn.close()
        pool.memory.release()
    return f"4 steps x {LAYERS} layers with a GEMM producing q; worst relative error {worst:.2e}"


def check_cost(target: str, rng, bursts: int = 20, per_burst: int = 32) -> str:
    """Host time of each call, timed one by one: what a scheduler's CPU pays per layer when it
    enqueues a step ahead of the device. Calls go in bursts (a step's worth) and the stream is
    synchronized between bursts, untimed, so no call waits for the device (a full ring or a
    blocked stream would show as host time otherwise)."""
    import torch
    import verifyd
    from verifyd import dataplane_abi as abi
    from verifyd.tensors import random_bf16

    def p50(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] / 1e3

    with verifyd.Client(target) as c:
        s = 7301
        c.append(s, random_bf16(rng, (LAYERS, 64, 576)))
        pool = Pool(c, 8 << 20)
        q, tkv, out, flags = _one_layer(pool, rng, 1)
        plane = c.data_plane()
        lib = plane._lib
        stream = torch.cuda.current_stream().cuda_stream
        ready_addr, done_addr = flags[0:1].data_ptr(), flags[64:65].data_ptr()
        ready_view, done_view = flags[0:1], flags[64:65]
        n = 0
        py_ns, c_ns = [], []
        with c.open_channel(512) as ch:
            def settle():
                torch.cuda.current_stream().synchronize()
                for comp in ch.poll():
                    if not comp.ok and comp.id < 100000:
                        comp.raise_for_status()
            # Python's verify() as the adapter calls it (the batch prepared once per step):
            # tensors to refs, checks, descriptor, two stream operations.
            batch = ch.prepare([(s, [-1])])
            # The bare C calls the same work needs (what a C++ scheduler pays).
            refs = {k: plane.ref(v, k)[0] for k, v in (("q", q), ("tree_kv", tkv), ("out", out))}
            rr, dr = plane.ref(ready_view, "r")[0], plane.ref(done_view, "d")[0]
            par = (ctypes.c_int32 * 1)(-1)
            seq = abi.SequenceDesc(s, ctypes.cast(par, ctypes.POINTER(ctypes.c_int32)), 1, 0,
                                   None, 0, 0)
            d = abi.VerifyDesc()
            d.layer, d.num_sequences = 0, 1
            d.sequences = ctypes.pointer(seq)
            d.q = abi.TensorRef(refs["q"].region, refs["q"].offset)
            d.tree_kv = abi.TensorRef(refs["tree_kv"].region, refs["tree_kv"].offset)
            d.out = abi.TensorRef(refs["out"].region, refs["out"].offset)
            settle()
            wall = {"py": 0.0, "c": 0.0}
            for burst in range(bursts):
                # Alternating the two ways burst by burst: both meet the same host and device.
                t_burst = time.perf_counter()
                for _ in range(per_burst):
                    n += 1
                    t0 = time.perf_counter_ns()
                    ch.verify(0, batch, q, tkv, out, ready=(ready_view, n), done=(done_view, n))
                    py_ns.append(time.perf_counter_ns() - t0)
                settle()
                wall["py"] += time.perf_counter() - t_burst
                t_burst = time.perf_counter()
                for _ in range(per_burst):
                    n += 1
                    t0 = time.perf_counter_ns()
                    d.id = 100000 + n
                    d.ready = abi.FlagRef(rr.region, rr.offset, n, 0)
                    d.done = abi.FlagRef(dr.region, dr.offset, n, 0)
                    if lib.vd_enqueue_verify(ch._handle, ctypes.byref(d)) != 0:
                        raise AssertionError(lib.vd_last_error())
                    lib.vd_stream_write_value32(stream, ready_addr, n)
                    lib.vd_stream_wait_value32(stream, done_addr, n)
                    c_ns.append(time.perf_counter_ns() - t0)
                settle()
                wall["c"] += time.perf_counter() - t_burst
        c.release(s)
        pool.memory.release()
    calls = bursts * per_burst
    return (f"per layer (Q=1, H={HEADS}, L=64, {calls} calls each, bursts of {per_burst}): "
            f"host p50 Channel.verify {p50(py_ns):.1f} us, bare C calls {p50(c_ns):.1f} us, "
            f"Python over C {p50(py_ns) - p50(c_ns):.1f} us; host mean {sum(py_ns) / calls / 1e3:.1f}"
            f" / {sum(c_ns) / calls / 1e3:.1f} us; wall per call (device-paced) "
            f"{wall['py'] / calls * 1e6:.1f} / {wall['c'] / calls * 1e6:.1f} us")


class _DLPackOnly:
    """A CUDA tensor seen only through DLPack (as a JAX or CuPy array would be)."""

    def __init__(self, tensor):
        self._t = tensor

    def __dlpack__(self, stream=None):
        return self._t.__dlpack__()

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def check_dlpack(target: str, rng) -> str:
    """Device memory registered and named through DLPack alone: the channel's outputs are the
    same bytes as the gRPC Verify's for the same inputs."""
    import numpy as np
    import torch
    import verifyd
    from verifyd.tensors import random_bf16

    with verifyd.Client(target) as c:
        s = 7401
        c.append(s, random_bf16(rng, (LAYERS, 90, 576)))
        raw = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
        _KEEP.append(raw)
        memory = c.register(_DLPackOnly(raw))
        parents = [-1, 0, 0, 1]

        def take(off, shape, dtype):
            size = int(np.prod(shape)) * torch.tensor([], dtype=dtype).element_size()
            return raw[off:off + size].view(dtype).view(*shape)
        q = take(0, (4, HEADS, 576), torch.bfloat16)
        tkv = take(1 << 20, (4, 576), torch.bfloat16)
        out = take(2 << 20, (4, HEADS, 512), torch.bfloat16)
        flags = take(3 << 20, (128,), torch.int32)
        qb, kb = random_bf16(rng, (4, HEADS, 576)), random_bf16(rng, (4, 576))
        q.copy_(_t(qb).cuda())
        tkv.copy_(_t(kb).cuda())
        flags.zero_()
        with c.open_channel() as ch:
            ch.verify(0, [(s, parents)], _DLPackOnly(q), _DLPackOnly(tkv), _DLPackOnly(out),
                      ready=(_DLPackOnly(flags[0:1]), 1), done=(_DLPackOnly(flags[64:65]), 1))
            torch.cuda.current_stream().synchronize()
            for comp in ch.poll():
                comp.raise_for_status()
        got = _bits(out)
        want = np.asarray(c.verify(0, [(s, parents)], qb, kb).out)
        c.release(s)
        memory.release()
    same = int(np.sum(got.reshape(-1) == want.reshape(-1)))
    if same != want.size:
        raise AssertionError(f"{want.size - same} of {want.size} out elements differ from gRPC")
    return f"registered and verified through DLPack alone: {same} of {want.size} out elements " \
           "bit-identical to the gRPC Verify"


CHECKS = {"stream_order": check_stream_order, "errors": check_errors,
          "adapter_loop": check_adapter_loop, "cost": check_cost,
          "dlpack": check_dlpack, "append_registered": check_append_registered}
# Checks against a daemon with an fp8 pool (--kv_dtype=fp8).
FP8_CHECKS = {"append_registered_fp8": check_append_registered_fp8}


def run(binary: str, names=None, ld_path: str | None = None) -> tuple[int, int]:
    import numpy as np
    passed = failed = 0
    for checks, extra in ((CHECKS, ()), (FP8_CHECKS, ("--kv_dtype=fp8",))):
        chosen = {n: f for n, f in checks.items() if not names or n in names}
        if not chosen:
            continue
        daemon = CudaDaemon(binary, ld_path=ld_path, extra=extra)
        try:
            for name, fn in chosen.items():
                rng = np.random.default_rng(zlib.crc32(name.encode()))  # the same every run
                try:
                    note = fn(daemon.target, rng)
                    print(f"PASS {name}: {note}", flush=True)
                    passed += 1
                except Exception:  # noqa: BLE001 - report and go on
                    print(f"FAIL {name}:\n{traceback.format_exc()}", flush=True)
                    failed += 1
        finally:
            rc = daemon.stop()
            if rc != 0:
                print(f"FAIL daemon exit {rc}: {open(daemon.log).read()[-3000:]}")
                failed += 1
    return passed, failed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--verifyd", required=True, help="the verifyd binary (cuda backend)")
    p.add_argument("--python", help="directory holding the verifyd package (with stubs)")
    p.add_argument("--lib", help="libverifyd_dataplane.so to load")
    p.add_argument("--installed", action="store_true",
                   help="use this Python's installed verifyd (a wheel): no --python / --lib")
    p.add_argument("--daemon-ld-path", help="LD_LIBRARY_PATH for the daemon only (the bundle's "
                   "lib/), so that this Python keeps its own libraries")
    p.add_argument("checks", nargs="*", help=f"subset of {list(CHECKS) + list(FP8_CHECKS)}")
    args = p.parse_args()
    _setup_path(args.python, args.lib, args.installed)
    import torch
    import verifyd
    from verifyd import dataplane
    print(f"verifyd from {os.path.dirname(verifyd.__file__)}")
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda "
          f"{torch.cuda.is_available()}, data plane: "
          f"{dataplane.why_unavailable() or 'loaded, cuda=%s' % dataplane.has_cuda()}")
    if not torch.cuda.is_available() or not dataplane.has_cuda():
        print("0 passed, 1 failed (no CUDA device or the library has no CUDA)")
        return 1
    passed, failed = run(args.verifyd, args.checks, args.daemon_ld_path)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
