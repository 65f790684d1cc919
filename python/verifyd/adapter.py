"""How an engine's attention backend uses verifyd, per layer, inside its forward pass.

An engine (SGLang, vLLM) running tree speculative decoding calls, for each decode step::

    attn.begin_step([(seq_id, parents), ...])          # the step's draft trees, batch order
    for layer in range(num_layers):                    # the engine's own forward pass
        ...                                            # q / tree_kv projections (engine GPU work)
        attn.forward_verify(layer, q, tree_kv, out)    # verify attention into `out`, in place
        ...                                            # o_proj, MLP (engine GPU work)
    attn.end_step({seq_id: accepted_path, ...})        # after sampling picks the accepted paths

with torch tensors q bf16 [sum Q, H, 576], tree_kv bf16 [sum Q, 576] and the engine's
preallocated out bf16 [sum Q, H, 512] (lse fp32 [sum Q, H] optional), on the CPU or a GPU. The
KV cache of the committed prefix lives in verifyd (prefill: `attn.prefill(seq_id, kv)`); the
engine keeps none for these layers.

**The commit rides on the next step.** end_step() only records each sequence's accepted path;
the first forward_verify of the next step carries it (`VerifySequence.commit_previous`), so a
step costs exactly one call per layer. A sequence that is not in the next step's batch has its
commit sent alone at that step's begin_step (or by flush_commits(); release() drops it).

**Transports.** "grpc": q/tree_kv/out inline in the messages (CUDA tensors copied via host).
"shared_memory": one daemon-created region per adapter; q/tree_kv are copied into it (a CUDA
tensor is copied device→region directly, one copy) and out is copied from it into `out`; the
region grows when a step needs more. "device" (SPEC §3.1, verifyd.dataplane): q, tree_kv, out
(and lse) must lie in memory registered with the daemon — torch CUDA tensors the engine
registered once with `client.register(pool)` on the cuda backend, or views of
`client.host_buffer(...)` on the cpu backend; the adapter owns a channel and one flag pair, and
each forward_verify is one descriptor in the channel's ring. On CUDA it then records "write
ready = n" and "wait done >= n" on the current torch stream (or `stream=`) and returns at once:
the CPU never blocks, errors (NaN outputs, done still written) are raised by the next call that
reads completions (any later forward_verify, begin_step, `synchronize()`). On host memory the
call waits for its completion.

**CUDA-graph capture** (what the engine can capture around forward_verify, and why):

* gRPC and shared-memory transports: **not capturable**. forward_verify is a host-side call that
  blocks the CPU on a socket reply and moves bytes with the CPU; a CUDA graph records only device
  work, so a captured forward_verify would replay nothing of the call (the attention would be
  skipped silently). It also needs q on the host, i.e. a device→host sync. Engines that capture
  decode steps must split the graph at attention (piecewise capture, as vLLM does for its own
  "splitting ops" and SGLang for non-capturable backends): the per-layer GEMM/MLP pieces are
  captured, forward_verify runs eagerly between them.
* The device transport: of its three actions per layer, the two stream memory operations
  (`cuStreamWriteValue32` ready, `cuStreamWaitValue32` done; `vd_stream_write_value32` /
  `vd_stream_wait_value32`) **are capturable** — they are stream work on fixed addresses. The
  descriptor's enqueue into the channel's ring **is not**: it is a host store into shared memory
  (what varies per step — sequence ids, Q per sequence, parents, the riding commit — lives there).
  And a captured stream operation freezes its value: a replay writes and waits for the values of
  the capture, while the daemon's flags count up (done >= n, in descriptor order). So the adapter
  refuses to run inside a capture (it raises, as on the host transports) and the engine runs it
  piecewise: the per-layer engine work captured, forward_verify eager between the pieces — which
  costs one ring store and two stream operations per layer on the host, no blocking. Capturing
  the whole step is `CapturedVerify`'s (verifyd.captured, plans/0033): the step's record lives
  in a step area the graph's own kernel fills, and the per-layer flags are kernels whose values
  move with every replay.
* Either way: begin_step / end_step are host work outside any capture; forward_verify must never
  be called while torch.cuda.is_current_stream_capturing() is true — it raises instead of
  silently recording nothing.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from .captured import CapturedVerify  # the captured-graph way (plans/0033)
from .client import Client, VerifySequence
from .dataplane_tensors import is_cuda
from .errors import ResourceExhausted, VerifydError, invalid_argument, make_error
from .shared_memory import SharedMemoryRegion, shared_verify_layout
from .tensors import ROW, copy_bf16_into, is_torch

__all__ = ["CapturedVerify", "VerifyAttention"]


def on_device_memory(x: Any) -> bool:
    """CUDA memory: a torch CUDA tensor, a `__cuda_array_interface__` object or a DLPack kDLCUDA
    one (the data plane's own test, verifyd.dataplane)."""
    return is_cuda(x, "q", "Verify")


def _capturing() -> bool:
    try:
        import torch  # noqa: PLC0415
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - no torch / no CUDA: not capturing
        return False


class VerifyAttention:
    """One per scheduler thread and tensor-parallel rank (each rank's process talks to its own
    daemon with its own q heads; the commits are the same on every rank)."""

    def __init__(self, client: Client, *, transport: str = "grpc",
                 softmax_scale: Optional[float] = None, timeout: Optional[float] = None,
                 return_lse: bool = False, channel_entries: int = 64, stream: Any = None):
        if transport not in ("grpc", "shared_memory", "device"):
            raise invalid_argument(f"transport = '{transport}' must be grpc, shared_memory or "
                                   "device")
        self._channel = None
        if transport == "device":
            # DataPlaneUnavailable when libverifyd_dataplane.so is missing.
            self._channel = client.open_channel(channel_entries)
        self.stream = stream              # device transport: None = torch's current stream
        self._flags: Any = None           # device transport: the ready / done words
        self._flag_owner: Any = None
        self._counter = 0
        self._prepared: Any = None        # (the sequence list, its PreparedSequences)
        self._in_flight: Dict[int, List[Tuple[int, int]]] = {}  # id -> (seq, length if ok)
        self.client = client
        self.transport = transport
        self.softmax_scale = softmax_scale
        self.timeout = timeout
        self.return_lse = return_lse
        self.committed_length: Dict[int, int] = {}
        self._pending_commit: Dict[int, List[int]] = {}
        self._step: List[Tuple[int, List[int]]] = []
        self._step_sequences: List[VerifySequence] = []
        self._first_call_of_step = False
        self._region: Optional[SharedMemoryRegion] = None

    # -- sequence life cycle ---------------------------------------------------------------------
    def prefill(self, sequence_id: int, kv: Any, *, layer_begin: int = 0,
                expected_fill: Optional[int] = None) -> int:
        """Appends kv bf16 [layers, T, 576] (chunked; expected_fill=None creates the sequence)."""
        r = self.client.append(sequence_id, kv, layer_begin=layer_begin,
                               expected_fill=expected_fill, timeout=self.timeout)
        self.committed_length[sequence_id] = r.committed_length
        return r.committed_length

    def release(self, sequence_id: int) -> int:
        self._pending_commit.pop(sequence_id, None)
        self.committed_length.pop(sequence_id, None)
        return self.client.release(sequence_id, timeout=self.timeout)

    def close(self) -> None:
        if self._region is not None:
            self._region.release()
            self._region = None
        if self._channel is not None:
            try:
                self.synchronize()
            finally:
                self._channel.close()
                self._channel = None
                if self._flag_owner is not None:
                    self._flag_owner.release()
                    self._flag_owner = None

    # -- a decode step ---------------------------------------------------------------------------
    def begin_step(self, sequences: Iterable[Tuple[int, Sequence[int]]]) -> None:
        """The step's draft trees, in batch order (the order of q's rows)."""
        if self._channel is not None:
            self._read_completions()
        self._step = [(int(s), [int(p) for p in parents]) for s, parents in sequences]
        if not self._step:
            raise invalid_argument("a step needs at least one sequence", "Verify")
        in_step = {s for s, _ in self._step}
        for s in [s for s in self._pending_commit if s not in in_step]:
            self.committed_length[s] = self.client.commit(s, self._pending_commit.pop(s),
                                                          timeout=self.timeout)
        self._step_sequences = [VerifySequence(s, p, self._pending_commit.get(s))
                                for s, p in self._step]
        self._first_call_of_step = True

    @property
    def total_q(self) -> int:
        return sum(len(p) for _, p in self._step)

    def forward_verify(self, layer: int, q: Any, tree_kv: Any, out: Any,
                       lse: Any = None) -> None:
        """Verify attention of `layer` for the step's batch, written into `out` (and `lse`)."""
        if not self._step:
            raise make_error(grpc.StatusCode.FAILED_PRECONDITION,
                             "forward_verify before begin_step", "Verify")
        if _capturing():
            raise RuntimeError(f"forward_verify on the {self.transport} transport cannot be "
                               "captured in a CUDA graph (see verifyd.adapter's docstring)")
        want_lse = lse is not None or self.return_lse
        seqs = self._step_sequences
        if self.transport == "device":
            self._verify_device(layer, seqs, q, tree_kv, out, lse)
            r = None
        elif self.transport == "grpc":
            r = self.client.verify(layer, seqs, q, tree_kv, return_lse=want_lse,
                                   softmax_scale=self.softmax_scale, timeout=self.timeout)
            self._write(out, r.out, "out")
            if lse is not None:
                self._write_lse(lse, r.lse)
        else:
            r = self._verify_shared(layer, seqs, q, tree_kv, out, lse, want_lse)
        if self._first_call_of_step:
            # The riding commits are applied: later layers of this step must not repeat them.
            self._first_call_of_step = False
            for s in self._step_sequences:
                self._pending_commit.pop(s.sequence_id, None)
            self._step_sequences = [VerifySequence(s, p) for s, p in self._step]
        if r is not None:
            for (s, _), n in zip(self._step, r.committed_length):
                self.committed_length[s] = n

    def end_step(self, accepted: Dict[int, Sequence[int]]) -> None:
        """Records each sequence's accepted path (root first; [] rejects the tree); the commit
        rides on the next step's first forward_verify."""
        for s, path in accepted.items():
            self._pending_commit[int(s)] = [int(a) for a in path]
        self._step = []
        self._step_sequences = []

    def flush_commits(self) -> None:
        """Sends every recorded commit now (one Commit each), e.g. before an idle period."""
        for s in list(self._pending_commit):
            self.committed_length[s] = self.client.commit(s, self._pending_commit.pop(s),
                                                          timeout=self.timeout)

    def synchronize(self) -> None:
        """Device transport: waits for every descriptor in flight and raises the first failure
        (their outputs are NaN). The CPU-side twin of the stream's own done waits."""
        if self._channel is None:
            return
        error = None
        while self._in_flight:
            c = self._channel.wait(self.timeout or 30.0)
            error = error or self._complete(c)
        if error is not None:
            raise error

    # -- transports ------------------------------------------------------------------------------
    def _complete(self, c) -> Optional[VerifydError]:
        updates = self._in_flight.pop(c.id, [])
        if not c.ok:
            return c.error()
        for s, n in updates:
            self.committed_length[s] = n
        return None

    def _read_completions(self) -> None:
        error = None
        for c in self._channel.poll():
            error = error or self._complete(c)
        if error is not None:
            raise error

    def _ensure_flags(self, q: Any) -> None:
        if self._flags is not None:
            return
        plane = self.client.data_plane()
        if on_device_memory(q):
            import torch  # noqa: PLC0415 - the flag words are made with torch on every kind of q
            # ready [0], done [16]; on q's device where torch can tell, else the current one
            device = q.device if is_torch(q) else torch.device("cuda", torch.cuda.current_device())
            words = torch.zeros(32, dtype=torch.int32, device=device)
            self._flag_owner = plane.register(words)
        else:
            self._flag_owner = plane.host_buffer(4096)
            words = self._flag_owner.take((32,), "uint32")
        self._flags = (words[0:1], words[16:17])

    def _verify_device(self, layer, seqs, q, tree_kv, out, lse) -> None:
        self._read_completions()
        self._ensure_flags(q)
        self._counter += 1
        n = self._counter
        # The committed lengths once the riding commits are applied (known when it completes).
        updates = []
        for s in seqs:
            if s.commit_previous is not None:
                updates.append((s.sequence_id, self.committed_length.get(s.sequence_id, 0)
                                + len(s.commit_previous)))
        ready, done = self._flags
        # The batch in descriptor form once per list (the step's first layer carries the riding
        # commits, the later ones share one list): the layers do not rebuild it.
        if self._prepared is None or self._prepared[0] is not seqs:
            self._prepared = (seqs, self._channel.prepare(seqs))
        prepared = self._prepared[1]
        while True:
            try:
                i = self._channel.verify(layer, prepared, q, tree_kv, out, lse, ready=(ready, n),
                                         done=(done, n), stream=self.stream,
                                         softmax_scale=self.softmax_scale)
                break
            except ResourceExhausted:  # the ring is full: read one completion, then retry
                c = self._channel.wait(self.timeout or 30.0)
                error = self._complete(c)
                if error is not None:
                    raise error
        self._in_flight[i] = updates
        if not on_device_memory(q):
            error = self._complete(self._channel.wait(self.timeout or 30.0))
            if error is not None:
                raise error

    @staticmethod
    def _write(dest: Any, value: Any, name: str) -> None:
        if is_torch(dest) and is_torch(value):
            dest.copy_(value)
        elif is_torch(dest):
            copy_bf16_into(dest, np.asarray(value), name)
        else:
            np.copyto(dest, np.asarray(value))

    @staticmethod
    def _write_lse(dest: Any, value: Any) -> None:
        if is_torch(dest):
            import torch  # noqa: PLC0415
            dest.copy_(value if is_torch(value) else torch.from_numpy(np.asarray(value)))
        else:
            np.copyto(dest, np.asarray(value))

    def _ensure_region(self, nbytes: int) -> SharedMemoryRegion:
        if self._region is None or self._region.size < nbytes:
            if self._region is not None:
                self._region.release()
            self._region = self.client.create_shared_memory(max(nbytes, 1 << 20),
                                                            timeout=self.timeout)
        return self._region

    def _verify_shared(self, layer, seqs, q, tree_kv, out, lse, want_lse):
        total_q = self.total_q
        heads = q.shape[1]
        if tuple(q.shape) != (total_q, heads, ROW) or tuple(tree_kv.shape) != (total_q, ROW):
            raise invalid_argument(f"q {list(q.shape)} / tree_kv {list(tree_kv.shape)}: need "
                                   f"[{total_q}, H, {ROW}] / [{total_q}, {ROW}]", "Verify")
        layout = shared_verify_layout(0, total_q, heads, want_lse)
        region = self._ensure_region(layout.end)
        if is_torch(q):
            region.tensor(layout.q, (total_q, heads, ROW)).copy_(q)
            region.tensor(layout.tree_kv, (total_q, ROW)).copy_(tree_kv)
        else:
            from .tensors import as_bf16_bits  # noqa: PLC0415
            region.ndarray(layout.q, np.uint16, (total_q, heads, ROW))[...] = \
                as_bf16_bits(q, "q", "Verify")[0]
            region.ndarray(layout.tree_kv, np.uint16, (total_q, ROW))[...] = \
                as_bf16_bits(tree_kv, "tree_kv", "Verify")[0]
        r = self.client.verify_shared_in_place(
            layer, seqs, layout, region, softmax_scale=self.softmax_scale, timeout=self.timeout,
            output="torch" if is_torch(out) else "numpy")
        self._write(out, r.out, "out")
        if lse is not None:
            self._write_lse(lse, r.lse)
        return r
