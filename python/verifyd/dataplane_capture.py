"""A captured decode step's handle in libverifyd_dataplane (SPEC §3.1 "Inside the engine's CUDA
graph", plans/0033): PrepareCapture on a channel, the graph's three kernels (CUDA) or their host
versions (the cpu backend), the fault word and the daemon's word on each step."""
from __future__ import annotations

import ctypes
from typing import Any, Optional

import grpc

from .dataplane_abi import CaptureDesc, P, StepTensors, TensorRef
from .dataplane_channel import Channel, _stream_handle
from .dataplane_library import check
from .errors import VerifydError, make_error

# The engine's fault word (channel/step_area.h's CaptureError).
CAPTURE_OK, CAPTURE_EPOCH_CHANGED, CAPTURE_DONE_TIMEOUT = 0, 1, 2


class Capture:
    """One prepared bucket on `channel`. `refs`: the daemon's names (Ref) of q, tree_kv, out,
    lse (or None), ready and done; `addresses`: where this process sees ready, done, out and lse
    (device or host addresses)."""

    def __init__(self, channel: Channel, *, max_batch: int, max_q: int, refs: dict,
                 addresses: dict, layer_begin: int = 0, num_layers: int = 0,
                 return_lse: bool = False, softmax_scale: Optional[float] = None):
        self._lib = channel._lib
        d = CaptureDesc()
        d.layer_begin, d.num_layers = int(layer_begin), int(num_layers)
        d.max_batch, d.max_q = int(max_batch), int(max_q)
        for name in ("q", "tree_kv", "out", "lse", "ready", "done"):
            r = refs.get(name)
            setattr(d, name, TensorRef(0, 0) if r is None else TensorRef(r.region, r.offset))
        d.return_lse = 1 if return_lse else 0
        if softmax_scale is not None:
            d.has_softmax_scale, d.softmax_scale = 1, float(softmax_scale)
        d.ready_pointer = int(addresses["ready"])
        d.done_pointer = int(addresses["done"])
        d.out_pointer = int(addresses["out"])
        d.lse_pointer = int(addresses.get("lse") or 0)
        handle = P()
        check(self._lib.vd_capture_prepare(channel.plane._handle, channel._handle,
                                           ctypes.byref(d), ctypes.byref(handle)),
              "PrepareCapture")
        self._handle = handle
        self.epoch = int(self._lib.vd_capture_epoch(handle))
        self.num_layers = int(self._lib.vd_capture_num_layers(handle))
        self.max_batch = int(self._lib.vd_capture_max_batch(handle))
        self.max_q = int(self._lib.vd_capture_max_q(handle))

    # -- host versions (the cpu backend) ---------------------------------------------------------
    def publish_host(self, ids, q_lens, parents, commit_lens, paths) -> int:
        """ids uint64 [n], q_lens / commit_lens int32 [n], parents / paths int32 [n, max_q]
        (numpy, C-contiguous). Returns the step published."""
        step = ctypes.c_uint64()
        ptr = (lambda a: a.ctypes.data_as(ctypes.c_void_p))
        check(self._lib.vd_capture_publish_host(self._handle, len(ids), ptr(ids), ptr(q_lens),
                                                ptr(parents), ptr(commit_lens), ptr(paths),
                                                ctypes.byref(step)), "StepPublish")
        return int(step.value)

    def signal_ready_host(self, i: int) -> None:
        check(self._lib.vd_capture_signal_ready_host(self._handle, int(i)), "SignalReady")

    def wait_done_host(self, i: int, timeout: float) -> None:
        check(self._lib.vd_capture_wait_done_host(self._handle, int(i), float(timeout)),
              "WaitDone")

    # -- CUDA: kernels recorded on the stream (capturable) ---------------------------------------
    def enable_device(self, done_timeout: float) -> None:
        check(self._lib.vd_capture_enable_device(self._handle, float(done_timeout)),
              "PrepareCapture")

    def step_publish(self, pointers: dict, stream: Any = None) -> None:
        t = StepTensors(*(int(pointers[k]) for k in ("num_seqs", "sequence_ids", "q_lens",
                                                     "parents", "commit_lens", "paths")))
        check(self._lib.vd_capture_step_publish(self._handle, _stream_handle(stream),
                                                ctypes.byref(t)), "StepPublish")

    def signal_ready(self, i: int, stream: Any = None) -> None:
        check(self._lib.vd_capture_signal_ready(self._handle, _stream_handle(stream), int(i)),
              "SignalReady")

    def wait_done(self, i: int, stream: Any = None) -> None:
        check(self._lib.vd_capture_wait_done(self._handle, _stream_handle(stream), int(i)),
              "WaitDone")

    # -- after a replay --------------------------------------------------------------------------
    def error(self, stream: Any = None) -> int:
        e = ctypes.c_uint32()
        handle = _stream_handle(stream) if stream is not None else None
        check(self._lib.vd_capture_error(self._handle, handle, ctypes.byref(e)), "CheckReplay")
        return int(e.value)

    def fault(self, stream: Any = None) -> Optional[VerifydError]:
        """The replay's fault as an error (its outputs are NaN), or None."""
        e = self.error(stream)
        if e == CAPTURE_OK:
            return None
        if e == CAPTURE_EPOCH_CHANGED:
            return make_error(grpc.StatusCode.FAILED_PRECONDITION,
                              "the capture ended (its channel closed or the daemon restarted): "
                              "the replay's outputs are NaN; prepare the capture again",
                              "CheckReplay")
        return make_error(grpc.StatusCode.UNAVAILABLE,
                          "a done flag did not come within the bound (the daemon died "
                          "mid-replay): the replay's outputs are NaN; prepare the capture again",
                          "CheckReplay")

    def wait_step(self, step: int, timeout: float) -> None:
        check(self._lib.vd_capture_wait_step(self._handle, int(step), float(timeout)),
              "CheckReplay")

    def close(self) -> None:
        handle, self._handle = self._handle, P()
        if handle:
            self._lib.vd_capture_free(handle)
