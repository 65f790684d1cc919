"""verifyd.adapter.CapturedVerify: verify attention inside an engine's CUDA graph (SPEC §3.1
"Inside the engine's CUDA graph", plans/0033).

An engine that captures its whole decode step in one CUDA graph (SGLang's target-verify graph
runner, vLLM's full-graph mode) uses it where its attention backend has its graph hooks::

    cv = CapturedVerify(client)
    cv.init(max_batch=B, max_q=Q, q=q_buf, tree_kv=kv_buf, out=out_buf)  # init_cuda_graph_state:
                                                   # PrepareCapture, refused here if unservable
    cv.set_step([(seq_id, parents), ...])          # before capture and before every replay
    with torch.cuda.graph(g):                      # capture once
        cv.step_publish()                          #   first node: the record into the step area
        for layer in range(L):
            ...                                    #   the engine's q / tree_kv into q_buf, kv_buf
            cv.forward_verify(layer)               #   SignalReady, WaitDone: out_buf holds out
            ...
    for each step:
        cv.set_step(trees)                         # init_forward_metadata_replay_cuda_graph
        g.replay()
        cv.check_replay()                          # after the replay: raises, never stale results
        cv.end_step({seq_id: accepted_path})       # the commit rides on the next step's record

q_buf / kv_buf / out_buf (/ lse_buf) are the bucket's static buffers, in memory registered with
the daemon (`client.register(pool)` on CUDA, `client.host_buffer(...)` views on the cpu
backend), [B x Q rows, ...]; a step uses the first sum-of-Q rows. forward_verify(layer, q, ...)
also takes the engine's own tensors and copies them in and out (captured copies).

Run the engine and the daemon under MPS (a private or the host's control daemon): the graph's
WaitDone kernels spin on the device while the daemon's kernels run beside them, which MPS allows
and time-slicing does not (the headline step: 1.02-1.04x in-process with MPS, 26x without it,
plans/0033).

On the cpu backend there is no graph: the same calls run the protocol's host versions (the
daemon polls the same step area), which is how the tests check it without a GPU.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .dataplane_capture import Capture
from .dataplane_tensors import is_cuda
from .errors import invalid_argument
from .tensors import is_torch

__all__ = ["CapturedVerify"]


def _address(x: Any) -> int:
    if is_torch(x):
        return int(x.data_ptr())
    if isinstance(x, np.ndarray):
        return int(x.ctypes.data)
    return int(x.__cuda_array_interface__["data"][0])


def _copy(dest: Any, src: Any) -> None:
    """A copy a graph captures (torch) or a host copy (numpy)."""
    if is_torch(dest):
        dest.copy_(src)
    else:
        np.copyto(dest, src)


class CapturedVerify:
    """One per captured bucket (its own channel: the daemon serves one capture per channel)."""

    def __init__(self, client: Any, *, return_lse: bool = False,
                 softmax_scale: Optional[float] = None, timeout: float = 30.0,
                 done_timeout: float = 10.0, channel_entries: int = 8):
        self.client = client
        self.return_lse = return_lse
        self.softmax_scale = softmax_scale
        self.timeout = timeout
        self.done_timeout = done_timeout
        self._plane = client.data_plane()
        self._channel = client.open_channel(channel_entries)
        self._capture: Optional[Capture] = None
        self._flag_owner: Any = None
        self._buffers: Dict[str, Any] = {}
        self._device = False
        self._host: Dict[str, np.ndarray] = {}
        self._dev: Dict[str, Any] = {}
        self._pending_commit: Dict[int, List[int]] = {}
        self._expected_step = 0
        self.layer_begin = 0

    # -- init_cuda_graph_state -------------------------------------------------------------------
    def init(self, *, max_batch: int, max_q: int, q: Any, tree_kv: Any, out: Any,
             lse: Any = None, layer_begin: int = 0, num_layers: int = 0) -> None:
        """PrepareCapture for the bucket: the daemon refuses (INVALID_ARGUMENT / NOT_FOUND /
        FAILED_PRECONDITION naming the field and its bound) what it cannot serve, before
        anything is captured."""
        if self.return_lse and lse is None:
            raise invalid_argument("return_lse needs an lse buffer", "PrepareCapture")
        # The daemon checks that each ref lies in registered memory, but only this process knows
        # the buffers' own extents: each must hold the bucket's rows.
        rows = int(max_batch) * int(max_q)
        for name, x in (("q", q), ("tree_kv", tree_kv), ("out", out), ("lse", lse)):
            if x is not None and int(x.shape[0]) < rows:
                raise invalid_argument(
                    f"{name} has {int(x.shape[0])} rows; the bucket (max_batch = {max_batch} x "
                    f"max_q = {max_q}) needs {rows}", "PrepareCapture")
        self._device = is_cuda(q, "q", "PrepareCapture")
        if self._device:
            import torch  # noqa: PLC0415
            words = torch.zeros(32, dtype=torch.int32, device=q.device)
            self._flag_owner = self._plane.register(words)
            ready, done = words[0:1], words[16:17]
        else:
            self._flag_owner = self._plane.host_buffer(4096)
            flags = self._flag_owner.take((32,), "uint32")
            ready, done = flags[0:1], flags[16:17]
        named = {"q": q, "tree_kv": tree_kv, "out": out, "lse": lse, "ready": ready,
                 "done": done}
        refs = {k: (None if v is None else self._plane.ref(v, k, "PrepareCapture")[0])
                for k, v in named.items()}
        addresses = {k: (0 if v is None else _address(v)) for k, v in named.items()}
        self._buffers = named
        self._capture = Capture(self._channel, max_batch=max_batch, max_q=max_q, refs=refs,
                                addresses=addresses, layer_begin=layer_begin,
                                num_layers=num_layers, return_lse=lse is not None,
                                softmax_scale=self.softmax_scale)
        self.layer_begin = layer_begin
        mb, mq = self._capture.max_batch, self._capture.max_q
        self._host = {"num_seqs": np.zeros(1, np.int32), "sequence_ids": np.zeros(mb, np.uint64),
                      "q_lens": np.zeros(mb, np.int32), "parents": np.zeros((mb, mq), np.int32),
                      "commit_lens": np.full(mb, -1, np.int32),
                      "paths": np.zeros((mb, mq), np.int32)}
        if self._device:
            import torch  # noqa: PLC0415
            self._capture.enable_device(self.done_timeout)
            self._dev = {k: torch.from_numpy(v.view(np.int64) if v.dtype == np.uint64 else v)
                         .to(q.device) for k, v in self._host.items()}

    @property
    def num_layers(self) -> int:
        return self._capture.num_layers

    @property
    def step_tensors(self) -> Dict[str, Any]:
        """The record's source tensors StepPublish copies (device tensors on CUDA): an engine
        that keeps its trees on the device may write them itself instead of set_step."""
        return self._dev if self._device else self._host

    # -- init_forward_metadata_replay_cuda_graph -------------------------------------------------
    def set_step(self, sequences: Iterable[Tuple[int, Sequence[int]]]) -> None:
        """The step's trees in batch order; the riding commits are end_step's."""
        step = [(int(s), [int(p) for p in parents]) for s, parents in sequences]
        h = self._host
        mq = self._capture.max_q
        h["num_seqs"][0] = len(step)
        for b, (s, parents) in enumerate(step[:self._capture.max_batch]):
            h["sequence_ids"][b] = s
            h["q_lens"][b] = len(parents)
            h["parents"][b, :min(len(parents), mq)] = parents[:mq]
            path = self._pending_commit.pop(s, None)
            h["commit_lens"][b] = -1 if path is None else len(path)
            if path is not None:
                h["paths"][b, :min(len(path), mq)] = path[:mq]
        if self._device:
            for k, v in self._host.items():
                self._dev[k].copy_(self._dev[k].new_tensor(
                    v.view(np.int64) if v.dtype == np.uint64 else v), non_blocking=False)
        self._expected_step += 1

    def end_step(self, accepted: Dict[int, Sequence[int]]) -> None:
        """Each sequence's accepted path (root first; [] rejects the tree): rides on its next
        step's record."""
        for s, path in accepted.items():
            self._pending_commit[int(s)] = [int(a) for a in path]

    # -- the captured forward --------------------------------------------------------------------
    def step_publish(self, stream: Any = None) -> None:
        """The graph's first node: the step's record into the step area."""
        if self._device:
            self._capture.step_publish({k: v.data_ptr() for k, v in self._dev.items()}, stream)
            return
        h = self._host
        n = int(h["num_seqs"][0])
        rows = min(n, self._capture.max_batch)
        self._capture.publish_host(
            h["sequence_ids"][:rows].copy(), h["q_lens"][:rows].copy(),
            np.ascontiguousarray(h["parents"][:rows]), h["commit_lens"][:rows].copy(),
            np.ascontiguousarray(h["paths"][:rows]))

    def forward_verify(self, layer: int, q: Any = None, tree_kv: Any = None, out: Any = None,
                       lse: Any = None, stream: Any = None) -> None:
        """Layer `layer`'s verify attention: q / tree_kv (when given) are copied into the bucket's
        buffers, out / lse (when given) from them."""
        i = int(layer) - self.layer_begin
        if not 0 <= i < self.num_layers:
            raise invalid_argument(f"layer = {layer} is not a captured layer "
                                   f"[{self.layer_begin}, {self.layer_begin + self.num_layers})",
                                   "Verify")
        b = self._buffers
        for given, name in ((q, "q"), (tree_kv, "tree_kv")):
            if given is not None and _address(given) != _address(b[name]):
                _copy(b[name][:given.shape[0]], given)
        if self._device:
            self._capture.signal_ready(i, stream)
            self._capture.wait_done(i, stream)
        else:
            self._capture.signal_ready_host(i)
            self._capture.wait_done_host(i, self.done_timeout)
        for given, name in ((out, "out"), (lse, "lse")):
            if given is not None and _address(given) != _address(b[name]):
                _copy(given, b[name][:given.shape[0]])

    def check_replay(self, stream: Any = None) -> None:
        """After a replay (or a host step): raises when its outputs are not results — a fault
        (the capture ended, the daemon died: NaN outputs) or the daemon's refusal of the step."""
        fault = self._capture.fault(stream)
        if fault is not None:
            raise fault
        self._capture.wait_step(self._expected_step, self.timeout)

    def close(self) -> None:
        if self._capture is not None:
            self._capture.close()
            self._capture = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._flag_owner is not None:
            self._flag_owner.release()
            self._flag_owner = None

    def __enter__(self) -> "CapturedVerify":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

