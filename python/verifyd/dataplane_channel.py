"""A data-plane channel (SPEC §3.1): descriptors (tensors as region + offset, flags, the batch's
sequences in C form), their enqueueing with stream order, and their completions."""
from __future__ import annotations

import ctypes
from collections import deque
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence,
                    Tuple, Union)

import grpc

from . import dataplane_tensors as _tensors
from .dataplane_abi import (NO_FLAG, NO_TENSOR, CompletionRecord, FlagRef, P, SequenceDesc,
                            TensorRef, VerifyDesc)
from .dataplane_library import CODES, check
from .dataplane_tensors import dtype_ok, shape_of
from .errors import VerifydError, invalid_argument, make_error
from .sequences import as_sequence
from .tensors import ROW, V_DIM

if TYPE_CHECKING:
    from .dataplane import DataPlane

FLAG_ALIGNMENT = 4


@dataclass(frozen=True)
class Ref:
    """A tensor named by region + byte offset (the descriptor's form)."""
    region: int
    offset: int


@dataclass(frozen=True)
class Flag:
    """A uint32 word in registered memory and the value it must reach (ready) or is set to
    (done). `word`: a tensor/array whose first element is the word, or a Ref."""
    word: Any
    value: int


@dataclass
class Completion:
    id: int
    code: grpc.StatusCode
    message: str
    committed_length: int = 0
    method: str = ""

    @property
    def ok(self) -> bool:
        return self.code == grpc.StatusCode.OK

    def error(self) -> Optional[VerifydError]:
        return None if self.ok else make_error(self.code, self.message, self.method)

    def raise_for_status(self) -> "Completion":
        if not self.ok:
            raise self.error()
        return self


def _flag_parts(x: Any, name: str) -> Tuple[Any, int]:
    if isinstance(x, tuple) and len(x) == 2:
        return x[0], int(x[1])
    if isinstance(x, Flag):
        return x.word, int(x.value)
    raise invalid_argument(f"{name} must be a Flag or a (word, value) tuple", "Verify")


def _int32_array(values: Sequence[int]):
    return (ctypes.c_int32 * max(len(values), 1))(*[int(v) for v in values])


_INT32_P = ctypes.POINTER(ctypes.c_int32)


class PreparedSequences:
    """A batch's sequences (ids, parents, riding commits) copied once into the descriptor's C
    form. Channel.prepare() makes one; verify() takes it in place of the list, so the layers of a
    step do not rebuild it (the adapter prepares the first layer's, with the riding commits, and
    the later layers'). Immutable: later changes to the source lists do not reach it."""

    __slots__ = ("sequences", "total_q", "_array", "_pointer", "_keep")

    def __init__(self, sequences: Iterable[Any]):
        seqs = [as_sequence(s) for s in sequences]
        self.sequences = seqs
        self.total_q = sum(len(s.parents) for s in seqs)
        keep = []
        array = (SequenceDesc * max(len(seqs), 1))()
        for i, s in enumerate(seqs):
            parents = _int32_array(s.parents)
            keep.append(parents)
            c = array[i]
            c.sequence_id = int(s.sequence_id)
            c.parents = ctypes.cast(parents, _INT32_P)
            c.num_parents = len(s.parents)
            if s.commit_previous is not None:
                path = _int32_array(s.commit_previous)
                keep.append(path)
                c.has_commit = 1
                c.commit_path = ctypes.cast(path, _INT32_P)
                c.commit_length = len(s.commit_previous)
        self._array = array
        self._pointer = ctypes.cast(array, ctypes.POINTER(SequenceDesc))
        self._keep = keep

    def __len__(self) -> int:
        return len(self.sequences)


class Channel:
    """One scheduler thread's channel (not thread-safe, as the C++ Channel). Descriptor ids are
    assigned here (1, 2, ...) unless given."""

    def __init__(self, plane: "DataPlane", entries: int = 64):
        self.plane = plane
        self._lib = plane._lib
        handle = P()
        check(self._lib.vd_channel_open(plane._handle, int(entries), ctypes.byref(handle)),
               "OpenChannel")
        self._handle = handle
        self._descriptor = VerifyDesc()
        self._next_id = 1
        self._methods: Dict[int, str] = {}
        self._done: Dict[int, Completion] = {}   # read while waiting for another id
        self._order: Deque[int] = deque()

    @property
    def id(self) -> int:
        return int(self._lib.vd_channel_id(self._handle))

    @property
    def entries(self) -> int:
        return int(self._lib.vd_channel_entries(self._handle))

    @property
    def in_flight(self) -> int:
        return int(self._lib.vd_channel_in_flight(self._handle)) + len(self._done)

    def _take_id(self, given: Optional[int]) -> int:
        if given is not None:
            return int(given)
        i = self._next_id
        self._next_id += 1
        return i

    # -- Verify ----------------------------------------------------------------------------------
    def prepare(self, sequences: Iterable[Any]) -> PreparedSequences:
        """The batch in descriptor form, for several verify() calls (the layers of a step)."""
        return PreparedSequences(sequences)

    def enqueue_verify(self, layer: int, sequences: Any, *, q: Ref, tree_kv: Ref,
                       out: Ref, lse: Optional[Ref] = None, ready: Optional[Tuple[Ref, int]] = None,
                       done: Optional[Tuple[Ref, int]] = None, return_lse: Optional[bool] = None,
                       softmax_scale: Optional[float] = None, id: Optional[int] = None) -> int:
        """The raw descriptor: tensors and flags as Refs (region, offset) exactly as given; no
        checks here (the daemon's answer is the completion). Returns the descriptor id."""
        prepared = sequences if isinstance(sequences, PreparedSequences) \
            else PreparedSequences(sequences)
        d = self._descriptor  # reused: the library copies it into the ring before returning
        # Every field is written (no memset): the per-layer call is the hot path.
        d.id = self._take_id(id)
        d.layer = int(layer)
        d.num_sequences = len(prepared.sequences)
        d.sequences = prepared._pointer
        d.q = TensorRef(q.region, q.offset)
        d.tree_kv = TensorRef(tree_kv.region, tree_kv.offset)
        d.out = TensorRef(out.region, out.offset)
        d.lse = TensorRef(lse.region, lse.offset) if lse is not None else NO_TENSOR
        d.return_lse = int(lse is not None if return_lse is None else bool(return_lse))
        d.has_softmax_scale = int(softmax_scale is not None)
        d.softmax_scale = 0.0 if softmax_scale is None else float(softmax_scale)
        d.ready = NO_FLAG if ready is None else \
            FlagRef(ready[0].region, ready[0].offset, int(ready[1]) & 0xFFFFFFFF, 0)
        d.done = NO_FLAG if done is None else \
            FlagRef(done[0].region, done[0].offset, int(done[1]) & 0xFFFFFFFF, 0)
        if self._lib.vd_enqueue_verify(self._handle, ctypes.byref(d)) != 0:
            check(-1, "Verify")
        self._methods[d.id] = "Verify"
        return d.id

    def verify(self, layer: int, sequences: Any, q: Any, tree_kv: Any, out: Any,
               lse: Any = None, *, ready: Union[Flag, Tuple[Any, int]],
               done: Union[Flag, Tuple[Any, int]], stream: Any = None,
               softmax_scale: Optional[float] = None, id: Optional[int] = None) -> int:
        """Verify attention of `layer` into `out` (and `lse`), all in registered memory:
        q bf16 [sum Q, H, 576], tree_kv bf16 [sum Q, 576], out bf16 [sum Q, H, 512], lse fp32
        [sum Q, H]; ready/done: (uint32 word, value). Each tensor and word: a torch tensor, a
        numpy array (bf16 as uint16 bits), an object with `__cuda_array_interface__`, or a DLPack
        object (`__dlpack__` + `__dlpack_device__`; kDLCUDA is device memory, kDLCPU and
        kDLCUDAHost host memory; bf16 as kDLBfloat or uint16 bits), C-contiguous, inside
        registered memory (keep it alive until done). `sequences`: a list of VerifySequence /
        (id, parents[, commit]) or a PreparedSequences (prepare(); what the layers of a step
        share). Device memory: the descriptor is enqueued, then "write ready" and "wait done"
        are recorded on `stream` (default: torch's current stream) — nothing blocks the CPU.
        Host memory: ready is stored by the host after the descriptor is published. Returns the
        descriptor id (see result())."""
        prepared = sequences if isinstance(sequences, PreparedSequences) \
            else PreparedSequences(sequences)
        if not prepared.sequences:
            raise invalid_argument("sequences must not be empty", "Verify")
        refs = self._torch_refs(prepared.total_q, q, tree_kv, out, lse, ready, done)
        if refs is None:  # not plain torch tensors, or something to refuse: the general path
            refs = self._checked_refs(prepared.total_q, q, tree_kv, out, lse, ready, done)
        rq, rkv, rout, rlse, rready, rdone, ready_value, done_value = refs
        descriptor_id = self.enqueue_verify(
            layer, prepared, q=rq[0], tree_kv=rkv[0], out=rout[0],
            lse=None if rlse is None else rlse[0], ready=(rready[0], ready_value),
            done=(rdone[0], done_value), softmax_scale=softmax_scale, id=id)
        ready_value &= 0xFFFFFFFF
        if rq[2]:
            handle = _stream_handle(stream)
            if self._lib.vd_stream_write_value32(handle, rready[1], ready_value) != 0 or \
                    self._lib.vd_stream_wait_value32(handle, rdone[1], done_value & 0xFFFFFFFF):
                check(-1, "Verify")
        else:
            ctypes.c_uint32.from_address(rready[1]).value = ready_value
        return descriptor_id

    def _torch_refs(self, total_q: int, q, tree_kv, out, lse, ready, done):
        """verify()'s hot path (the per-layer call of a Python scheduler, plans/0013): plain torch
        tensors of the right shapes, dtypes and layout whose places are known (the plane's cache),
        checked in straight-line code. None for anything else; the general path then accepts it
        or says what is wrong."""
        classes = _tensors.TORCH_CLASSES  # set once dtype_ok has seen torch
        tensor = classes[0] if classes else None
        if tensor is None or type(q) is not tensor or type(tree_kv) is not tensor or \
                type(out) is not tensor or (lse is not None and type(lse) is not tensor) or \
                type(ready) is not tuple or type(done) is not tuple or len(ready) != 2 or \
                len(done) != 2 or type(ready[0]) is not tensor or type(done[0]) is not tensor:
            return None
        heads = self.plane.heads
        bf16 = classes[1]
        rows = total_q * heads if heads is not None else -1
        if q.shape != (total_q, heads, ROW) or tree_kv.shape != (total_q, ROW) or \
                out.shape != (total_q, heads, V_DIM) or q.dtype is not bf16 or \
                tree_kv.dtype is not bf16 or out.dtype is not bf16 or not q.is_contiguous() or \
                not tree_kv.is_contiguous() or not out.is_contiguous():
            return None
        if lse is not None and (lse.shape != (total_q, heads) or lse.dtype is not classes[2]
                                or not lse.is_contiguous()):
            return None
        known = self.plane._refs
        on_device = q.is_cuda
        rq = known.get((q.data_ptr(), rows * ROW * 2, on_device))
        rkv = known.get((tree_kv.data_ptr(), total_q * ROW * 2, tree_kv.is_cuda))
        rout = known.get((out.data_ptr(), rows * V_DIM * 2, out.is_cuda))
        rlse = None if lse is None else known.get((lse.data_ptr(), rows * 4, lse.is_cuda))
        word, done_word = ready[0], done[0]
        rready = known.get((word.data_ptr(), word.numel() * word.element_size(), word.is_cuda))
        rdone = known.get((done_word.data_ptr(), done_word.numel() * done_word.element_size(),
                           done_word.is_cuda))
        if rq is None or rkv is None or rout is None or rready is None or rdone is None or \
                (lse is not None and rlse is None) or not word.is_contiguous() or \
                not done_word.is_contiguous():
            return None  # first sight of a tensor (the general path resolves and keeps it)
        if rkv[2] != on_device or rout[2] != on_device or rready[2] != on_device or \
                rdone[2] != on_device or (rlse is not None and rlse[2] != on_device):
            return None
        return rq, rkv, rout, rlse, rready, rdone, int(ready[1]), int(done[1])

    def _checked_refs(self, total_q: int, q, tree_kv, out, lse, ready, done):
        self._check_tensors(total_q, q, tree_kv, out, lse)
        ready_word, ready_value = _flag_parts(ready, "ready")
        done_word, done_value = _flag_parts(done, "done")
        resolve = self.plane._resolve
        rq, rkv, rout = resolve(q, "q"), resolve(tree_kv, "tree_kv"), resolve(out, "out")
        rlse = resolve(lse, "lse") if lse is not None else None
        rready, rdone = resolve(ready_word, "ready.word"), resolve(done_word, "done.word")
        on_device = rq[2]
        for r in (rkv, rout, rlse, rready, rdone):
            if r is not None and r[2] != on_device:
                raise invalid_argument("q, tree_kv, out, lse and the flags must all be device "
                                       "memory or all host memory", "Verify")
        return rq, rkv, rout, rlse, rready, rdone, ready_value, done_value

    def _check_tensors(self, total_q: int, q, tree_kv, out, lse) -> None:
        heads = self.plane.heads
        q_shape = shape_of(q, "q")
        h = q_shape[1] if len(q_shape) == 3 else -1
        if heads is not None and h != heads:
            raise invalid_argument(f"q has shape {list(q_shape)}; need [sum Q = {total_q}, "
                                   f"H = {heads}, {ROW}] (the daemon's heads)", "Verify")
        for name, x, want, bf16 in (("q", q, (total_q, h, ROW), True),
                                    ("tree_kv", tree_kv, (total_q, ROW), True),
                                    ("out", out, (total_q, h, V_DIM), True),
                                    ("lse", lse, (total_q, h), False)):
            if x is None:
                continue
            shape = q_shape if x is q else shape_of(x, name)
            if shape != want:
                raise invalid_argument(f"{name} has shape {list(shape)}; need {list(want)} "
                                       f"(sum Q = {total_q})", "Verify")
            if not dtype_ok(x, bf16, name):
                what = "bfloat16 (numpy: uint16 bits)" if bf16 else "float32"
                raise invalid_argument(f"{name} must be {what}", "Verify")

    # -- Commit ----------------------------------------------------------------------------------
    def commit(self, sequence_id: int, accepted_path: Sequence[int], *,
               id: Optional[int] = None) -> int:
        """A Commit descriptor; its completion carries committed_length. Returns the id."""
        path = [int(a) for a in accepted_path]
        arr = _int32_array(path)
        descriptor_id = self._take_id(id)
        check(self._lib.vd_enqueue_commit(self._handle, descriptor_id, int(sequence_id),
                                           ctypes.cast(arr, ctypes.POINTER(ctypes.c_int32)),
                                           len(path)), "Commit")
        self._methods[descriptor_id] = "Commit"
        return descriptor_id

    # -- completions -----------------------------------------------------------------------------
    def _completion(self, c: CompletionRecord) -> Completion:
        i = int(c.id)
        return Completion(i, CODES.get(int(c.code), grpc.StatusCode.UNKNOWN),
                          c.message.decode("utf-8", "replace"), int(c.committed_length),
                          self._methods.pop(i, ""))

    def poll(self) -> List[Completion]:
        """Every completion written so far (and any read earlier by result(id)), in order."""
        out = [self._done.pop(i) for i in list(self._order) if i in self._done]
        self._order.clear()
        buf = (CompletionRecord * 64)()
        while True:
            n = check(self._lib.vd_poll_completions(self._handle, buf, 64), "PollCompletions")
            out.extend(self._completion(buf[k]) for k in range(n))
            if n < 64:
                return out

    def wait(self, timeout: float = 30.0) -> Completion:
        """The next completion (blocks up to `timeout` seconds: DeadlineExceeded)."""
        if self._order:
            return self._done.pop(self._order.popleft())
        c = CompletionRecord()
        check(self._lib.vd_wait_completion(self._handle, float(timeout), ctypes.byref(c)),
               "WaitCompletion")
        return self._completion(c)

    def result(self, id: Optional[int] = None, timeout: float = 30.0) -> Completion:
        """The completion of descriptor `id` (default: the next one); raises its VerifydError
        when it failed. Completions of other ids read meanwhile are kept for poll()/wait()."""
        if id is None:
            return self.wait(timeout).raise_for_status()
        if id in self._done:
            self._order.remove(id)
            return self._done.pop(id).raise_for_status()
        while True:
            raw = CompletionRecord()
            check(self._lib.vd_wait_completion(self._handle, float(timeout),
                                                ctypes.byref(raw)), "WaitCompletion")
            c = self._completion(raw)
            if c.id == id:
                return c.raise_for_status()
            self._done[c.id] = c
            self._order.append(c.id)

    def heartbeat(self) -> None:
        self._lib.vd_channel_heartbeat(self._handle)

    def close(self) -> None:
        """CloseChannel: descriptors in flight complete ABORTED (NaN, done written)."""
        if self._handle:
            handle, self._handle = self._handle, P()
            check(self._lib.vd_channel_close(handle), "CloseChannel")

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - best effort at garbage collection
            pass


_CURRENT_RAW_STREAM: Optional[Callable[[], int]] = None


def _stream_handle(stream: Any) -> Optional[int]:
    """A cudaStream_t as an int: given (int, torch.cuda.Stream, or anything with .cuda_stream),
    or torch's current stream."""
    if stream is None:
        global _CURRENT_RAW_STREAM
        if _CURRENT_RAW_STREAM is None:
            import torch  # noqa: PLC0415
            raw, device = (getattr(torch._C, "_cuda_getCurrentRawStream", None),
                           getattr(torch._C, "_cuda_getDevice", None))
            # What torch.cuda.current_stream() returns, without its Stream object (~µs a call
            # on the GPU hosts); torch builds without these private calls take the public way.
            _CURRENT_RAW_STREAM = (lambda: raw(device())) if raw and device else \
                (lambda: torch.cuda.current_stream().cuda_stream)
        return int(_CURRENT_RAW_STREAM()) or None
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream) or None
    return int(stream) or None
