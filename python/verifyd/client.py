"""verifyd.Client: typed, synchronous calls to one verifyd daemon (SPEC §4), the Python twin of
client/client.h.

Every failed call raises a VerifydError (errors.py) carrying the daemon's gRPC code and message.
Each call takes `timeout=` (seconds; default `Client(timeout=30)`); a chunked Append gives every
chunk that deadline. Only idempotent calls (stats, get_compaction, health) are retried, and only
on UNAVAILABLE, all attempts sharing one deadline: a retried Verify, Append or Commit could apply
twice. Thread-safe: one Client may be shared by every thread of a scheduler.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from . import health as health_codec
from ._proto import pb, pb_grpc
from .dataplane import DataPlane
from .errors import VerifydError, error_from_rpc, invalid_argument, make_error
from .fp8 import FP8_ROW_BYTES
from .sequences import SequenceLike, VerifySequence, as_sequence
from .shared_memory import SharedMemoryRegion, SharedVerifyLayout, shared_verify_layout
from .tensors import (ROW, V_DIM, TensorKind, as_bf16_bits, check_shape, is_torch,
                      to_output_bf16, to_output_fp32)

__all__ = ["Client", "VerifySequence", "AppendResult", "VerifyResult", "APPEND_ENVELOPE_BYTES",
           "split_append", "DEFAULT_MAX_MESSAGE_BYTES"]

ADMIN_TOKEN_KEY = "x-verifyd-admin-token"
CLIENT_ID_KEY = "x-verifyd-client"  # the owner of external regions and channels (plans/0017)
# Room left in a message for everything but the KV payload (as client/append_chunking.h).
APPEND_ENVELOPE_BYTES = 1024
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20


@dataclass
class AppendResult:
    committed_length: int          # minimum fill over layers
    layer_fill: List[int]          # every layer's fill
    chunks: int = 1                # messages the append took


@dataclass
class VerifyResult:
    out: Any                       # bf16 [sum Q, H, 512]: numpy uint16 bits or torch.bfloat16
    lse: Any                       # fp32 [sum Q, H] when return_lse, else None
    committed_length: List[int]    # per sequence, request order
    response: Any = field(default=None, repr=False)  # the VerifyResponse message


def _tensor_bf16(bits: np.ndarray):
    return pb.Tensor(dtype=pb.DTYPE_BF16, shape=list(bits.shape), inline_data=bits.tobytes())


def split_append(kv_bits: np.ndarray, max_message_bytes: int) -> List[Tuple[int, int]]:
    """Token ranges [t0, t1) of kv [layers, T, 576] so that each message fits; as
    client/append_chunking.cc. INVALID_ARGUMENT when one token of every layer alone is too big."""
    layers, tokens, row = kv_bits.shape
    if kv_bits.nbytes + APPEND_ENVELOPE_BYTES <= max_message_bytes:
        return [(0, tokens)]
    token_bytes = layers * row * kv_bits.itemsize  # bf16: 2 bytes a value; fp8 rows: bytes
    per_chunk = (max_message_bytes - APPEND_ENVELOPE_BYTES) // token_bytes
    if per_chunk < 1:
        raise invalid_argument(f"one token of {layers} layers is {token_bytes} bytes; with "
                               f"{APPEND_ENVELOPE_BYTES} bytes of envelope it exceeds "
                               f"max_message_bytes = {max_message_bytes}", "Append")
    return [(t0, min(tokens, t0 + per_chunk)) for t0 in range(0, tokens, per_chunk)]


class Client:
    """One daemon. `target`: "unix:///run/verifyd/verifyd-0.sock" or "127.0.0.1:port"."""

    def __init__(self, target: str, *, timeout: float = 30.0,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, retries: int = 3,
                 retry_backoff: float = 0.05, admin_token: str = "", client_id: str = "",
                 channel: Optional[grpc.Channel] = None):
        if not target and channel is None:
            raise invalid_argument("target must not be empty")
        if not 4096 <= max_message_bytes <= 2**31 - 1:
            raise invalid_argument(f"max_message_bytes = {max_message_bytes} must be in "
                                   f"[4096, {2**31 - 1}]")
        if timeout is None or timeout <= 0:
            raise invalid_argument(f"timeout = {timeout} must be > 0")
        if not 0 <= retries <= 100:
            raise invalid_argument(f"retries = {retries} must be in [0, 100]")
        if len(client_id) > 128:
            raise invalid_argument(f"client_id has {len(client_id)} characters; at most 128")
        self.target = target
        self.timeout = float(timeout)
        self.max_message_bytes = int(max_message_bytes)
        self.retries = int(retries)
        self.retry_backoff = float(retry_backoff)
        self.admin_token = admin_token
        # Sent as x-verifyd-client with every call (as the C++ client): registered memory and
        # channels belong to it; the data plane's library uses the same id. Empty: random.
        self.client_id = client_id or secrets.token_hex(16)
        self._metadata = [(CLIENT_ID_KEY, self.client_id)]
        if admin_token:
            self._metadata.append((ADMIN_TOKEN_KEY, admin_token))
        self._data_plane = None
        self._own_channel = channel is None
        self._channel = channel or grpc.insecure_channel(target, options=[
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
        ])
        self._stub = pb_grpc.VerifydStub(self._channel)
        self._health = self._channel.unary_unary(
            health_codec.HEALTH_CHECK_METHOD, request_serializer=health_codec.encode_request,
            response_deserializer=health_codec.decode_response)

    # -- plumbing --------------------------------------------------------------------------------
    def close(self) -> None:
        if self._data_plane is not None:
            self._data_plane.close()
            self._data_plane = None
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, fn: Callable, request, *, idempotent: bool = False,
              timeout: Optional[float] = None):
        # The token rides on every call: over TCP the daemon gates every call that changes state
        # on it (plans/0015); the Unix socket needs none.
        metadata = self._metadata
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        attempts = 1 + self.retries if idempotent else 1
        backoff = self.retry_backoff
        error: Optional[VerifydError] = None
        for attempt in range(attempts):
            if attempt > 0:
                if time.monotonic() + backoff >= deadline:
                    break  # a retry that cannot finish before the deadline is not worth starting
                time.sleep(backoff)
                backoff *= 2
            try:
                return fn(request, timeout=max(deadline - time.monotonic(), 1e-6),
                          metadata=metadata)
            except grpc.RpcError as e:
                error = error_from_rpc(e, method)
                if error.code != grpc.StatusCode.UNAVAILABLE:
                    break
        assert error is not None
        raise error

    # -- Append ----------------------------------------------------------------------------------
    def append(self, sequence_id: int, kv: Any, *, layer_begin: int = 0,
               expected_fill: Optional[int] = None, timeout: Optional[float] = None
               ) -> AppendResult:
        """Appends committed tokens: kv bf16 [layer_count, T, 576] (or [T, 576] for one layer)
        to layers [layer_begin, layer_begin + layer_count), split into as many messages as
        max_message_bytes needs.

        The expected position (SPEC §2) is filled for every chunk: `expected_fill=None` means the
        sequence must not exist yet (the first chunk says `create`); an integer means every layer
        of the range must hold exactly that many tokens. Later chunks expect the fill the earlier
        ones left. So a chunk never re-creates a sequence that was released or expired meanwhile:
        the daemon answers FAILED_PRECONDITION. On an error after k chunks those k chunks stay
        appended and the message says how many tokens were.

        A uint8 kv [layer_count, T, 656] (or [T, 656]), numpy or torch (an engine's own fp8
        cache, on any device: a CUDA tensor is copied through host memory, as bf16 ones are on
        this path), is rows already in the fp8 layout (`verifyd.fp8.quantize_fp8_rows` makes them
        as the daemon does), sent as DTYPE_FP8_MLA to a daemon started with --kv_dtype=fp8; a bf16
        daemon refuses them (INVALID_ARGUMENT)."""
        fp8_rows = _is_uint8(kv)
        if fp8_rows:
            bits = _uint8_numpy(kv)
        else:
            bits, _ = as_bf16_bits(kv, "kv", "Append")
        if bits.ndim == 2:
            bits = bits.reshape(1, *bits.shape)
        if fp8_rows:
            check_shape(bits, (None, None, FP8_ROW_BYTES), "kv", "layer_count, T, 656", "Append")
        else:
            check_shape(bits, (None, None, ROW), "kv", "layer_count, T, 576", "Append")
        if bits.shape[0] < 1 or bits.shape[1] < 1:
            raise invalid_argument(f"kv has shape {list(bits.shape)}; layer_count and T must be "
                                   ">= 1", "Append")
        if expected_fill is not None and expected_fill < 0:
            raise invalid_argument(f"expected_fill = {expected_fill} must be >= 0", "Append")
        ranges = split_append(bits, self.max_message_bytes)
        response = None
        done = 0
        for i, (t0, t1) in enumerate(ranges):
            chunk = bits if len(ranges) == 1 else bits[:, t0:t1, :]
            tensor = (pb.Tensor(dtype=pb.DTYPE_FP8_MLA, shape=list(chunk.shape),
                                inline_data=chunk.tobytes()) if fp8_rows else _tensor_bf16(chunk))
            request = pb.AppendRequest(sequence_id=int(sequence_id), layer_begin=int(layer_begin),
                                       kv=tensor)
            if i == 0 and expected_fill is None:
                request.create = True
            else:
                request.expected_fill = (expected_fill or 0) + done
            try:
                response = self._call("Append", self._stub.Append, request, timeout=timeout)
            except VerifydError as e:
                if len(ranges) > 1:
                    e = make_error(e.code, f"{e.message} (chunk {i + 1} of {len(ranges)}; the "
                                   f"first {done} tokens stay appended)", "Append")
                raise e
            done += t1 - t0
        return AppendResult(int(response.committed_length), [int(f) for f in response.layer_fill],
                            len(ranges))

    def append_registered(self, sequence_id: int, kv: Any, *, layer_begin: int = 0,
                          expected_fill: Optional[int] = None, timeout: Optional[float] = None
                          ) -> AppendResult:
        """Appends committed tokens that already lie in memory registered with this Client's data
        plane (`register()`: a CUDA tensor's allocation; `host_buffer()` on the cpu backend): the
        request names the region and offset (kv.external_memory), so the rows cross neither the
        host nor the message size, one message whatever T. kv: bf16 [layer_count, T, 576] (torch
        bfloat16, or numpy uint16 bits from a host buffer), or rows already in the fp8 layout,
        uint8 [layer_count, T, 656] (an engine's own fp8 cache, for a daemon started with
        --kv_dtype=fp8); [T, ...] for one layer; contiguous. The daemon checks the values where
        they are (on the GPU for device memory: SPEC §1, a bad element named as for inline rows)
        and keeps nothing of a refused call. expected_fill as in append()."""
        method = "Append"
        fp8_rows = _is_uint8(kv)
        if not fp8_rows and not _is_bf16_bits(kv):
            raise invalid_argument("kv must be bf16 (torch.bfloat16, or numpy uint16 bits) or uint8 "
                                   "rows in the fp8 layout; got " + _dtype_name(kv), method)
        shape = [int(d) for d in kv.shape]
        if len(shape) == 2:
            shape = [1] + shape
        row = FP8_ROW_BYTES if fp8_rows else ROW
        if len(shape) != 3 or shape[2] != row:
            raise invalid_argument(
                f"kv has shape {list(kv.shape)}; must be [layer_count, T, {row}] or [T, {row}]",
                method)
        if shape[0] < 1 or shape[1] < 1:
            raise invalid_argument(f"kv has shape {list(kv.shape)}; layer_count and T must be "
                                   ">= 1", method)
        if expected_fill is not None and expected_fill < 0:
            raise invalid_argument(f"expected_fill = {expected_fill} must be >= 0", method)
        ref, _, _ = self.data_plane().ref(kv, "kv", method)
        tensor = pb.Tensor(dtype=pb.DTYPE_FP8_MLA if fp8_rows else pb.DTYPE_BF16, shape=shape,
                           external_memory=pb.ExternalMemoryRef(region=int(ref.region),
                                                                offset=int(ref.offset)))
        request = pb.AppendRequest(sequence_id=int(sequence_id), layer_begin=int(layer_begin),
                                   kv=tensor)
        if expected_fill is None:
            request.create = True
        else:
            request.expected_fill = int(expected_fill)
        response = self._call(method, self._stub.Append, request, timeout=timeout)
        return AppendResult(int(response.committed_length), [int(f) for f in response.layer_fill],
                            1)

    def append_request(self, request, *, timeout: Optional[float] = None):
        """Sends a prepared AppendRequest as is (one message; no chunking, no expected position
        added): for tools and tests."""
        return self._call("Append", self._stub.Append, request, timeout=timeout)

    # -- Verify ----------------------------------------------------------------------------------
    def _verify_request(self, layer: int, sequences: Iterable[SequenceLike], return_lse: bool,
                        softmax_scale: Optional[float]):
        seqs = [as_sequence(s) for s in sequences]
        if not seqs:
            raise invalid_argument("sequences must not be empty", "Verify")
        request = pb.VerifyRequest(layer=int(layer), sequences=[s.to_proto() for s in seqs],
                                   return_lse=bool(return_lse))
        if softmax_scale is not None:
            request.softmax_scale = float(softmax_scale)
        total_q = sum(len(s.parents) for s in seqs)
        return request, total_q

    def verify(self, layer: int, sequences: Iterable[SequenceLike], q: Any, tree_kv: Any, *,
               return_lse: bool = False, softmax_scale: Optional[float] = None,
               timeout: Optional[float] = None) -> VerifyResult:
        """Verify attention of one layer for a batch of sequences (SPEC §2).

        q bf16 [sum Q, H, 576], tree_kv bf16 [sum Q, 576], sequences in request order. Returns
        out bf16 [sum Q, H, 512] (and lse fp32 [sum Q, H] with return_lse) in the kind of q:
        numpy uint16 bits, or torch.bfloat16 on q's device."""
        request, total_q = self._verify_request(layer, sequences, return_lse, softmax_scale)
        q_bits, kind = as_bf16_bits(q, "q", "Verify")
        kv_bits, _ = as_bf16_bits(tree_kv, "tree_kv", "Verify")
        check_shape(q_bits, (total_q, None, ROW), "q", f"sum Q = {total_q}, H, 576", "Verify")
        check_shape(kv_bits, (total_q, ROW), "tree_kv", f"sum Q = {total_q}, 576", "Verify")
        request.q.CopyFrom(_tensor_bf16(q_bits))
        request.tree_kv.CopyFrom(_tensor_bf16(kv_bits))
        response = self._call("Verify", self._stub.Verify, request, timeout=timeout)
        heads = q_bits.shape[1]
        out = self._read_inline(response.out, (total_q, heads, V_DIM), np.uint16, "out")
        lse = (self._read_inline(response.lse, (total_q, heads), np.float32, "lse")
               if return_lse else None)
        return VerifyResult(to_output_bf16(out, kind),
                            None if lse is None else to_output_fp32(lse, kind),
                            [int(n) for n in response.committed_length], response)

    def verify_request(self, request, *, timeout: Optional[float] = None):
        """Sends a prepared VerifyRequest as is and returns the VerifyResponse message."""
        return self._call("Verify", self._stub.Verify, request, timeout=timeout)

    @staticmethod
    def _read_inline(t, shape, dtype, name: str) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if t.WhichOneof("data") != "inline_data" or len(t.inline_data) != n:
            raise make_error(grpc.StatusCode.INTERNAL, f"response {name}: want {n} inline bytes "
                             f"of shape {list(shape)}, got {t.WhichOneof('data')} "
                             f"({len(t.inline_data)} bytes)", "Verify")
        return np.frombuffer(t.inline_data, dtype=dtype).reshape(shape)

    # -- Commit / Release ------------------------------------------------------------------------
    def commit(self, sequence_id: int, accepted_path: Sequence[int], *,
               timeout: Optional[float] = None) -> int:
        """Commits the pending tree's accepted path (a root, then each a child of the previous;
        [] rejects the whole tree). Returns the committed length."""
        path = [int(a) for a in accepted_path]
        request = pb.CommitRequest(sequence_id=int(sequence_id),
                                   commit=pb.CommitSpec(commit_length=len(path),
                                                        accepted_path=path))
        return int(self._call("Commit", self._stub.Commit, request,
                              timeout=timeout).committed_length)

    def release(self, sequence_id: int, *, timeout: Optional[float] = None) -> int:
        """Drops a sequence; returns the slots freed."""
        request = pb.ReleaseRequest(sequence_id=int(sequence_id))
        return int(self._call("Release", self._stub.Release, request,
                              timeout=timeout).freed_slots)

    def fork(self, source_sequence_id: int, new_sequence_id: int, length: int, *,
             timeout: Optional[float] = None):
        """A new sequence on the first `length` committed tokens of the source, sharing their KV
        slots (plans/0019). Returns the ForkResponse (committed_length, shared_tokens). Not
        retried: a second attempt after a lost reply would answer ALREADY_EXISTS."""
        request = pb.ForkRequest(source_sequence_id=int(source_sequence_id),
                                 new_sequence_id=int(new_sequence_id), length=int(length))
        return self._call("Fork", self._stub.Fork, request, timeout=timeout)

    # -- Compaction ------------------------------------------------------------------------------
    def compact(self, budget_bytes: int = 0, *, timeout: Optional[float] = None) -> str:
        """Starts a compaction (budget_bytes = 0: until converged); returns its operation id."""
        return self._call("Compact", self._stub.Compact,
                          pb.CompactRequest(budget_bytes=int(budget_bytes)),
                          timeout=timeout).operation_id

    def get_compaction(self, operation_id: str, *, timeout: Optional[float] = None):
        """The CompactionStatus message (state, bytes planned/moved, fragmentation before/after)."""
        return self._call("GetCompaction", self._stub.GetCompaction,
                          pb.GetCompactionRequest(operation_id=operation_id), idempotent=True,
                          timeout=timeout)

    def wait_compaction(self, operation_id: str, *, poll_interval: float = 0.1,
                        on_progress: Optional[Callable] = None,
                        timeout: Optional[float] = None):
        """Polls until DONE or FAILED (returned, not raised: read .state and .error), calling
        on_progress(status) with every status seen. `timeout` bounds each poll."""
        done = (pb.CompactionStatus.DONE, pb.CompactionStatus.FAILED)
        while True:
            status = self.get_compaction(operation_id, timeout=timeout)
            if on_progress is not None:
                on_progress(status)
            if status.state in done:
                return status
            time.sleep(poll_interval)

    # -- Stats / health --------------------------------------------------------------------------
    def stats(self, *, timeout: Optional[float] = None):
        """The StatsResponse message (geometry, occupancy, fragmentation)."""
        return self._call("Stats", self._stub.Stats, pb.StatsRequest(), idempotent=True,
                          timeout=timeout)

    def list_sequences(self, after_sequence_id: Optional[int] = None, limit: int = 0, *,
                       timeout: Optional[float] = None):
        """One page of the live sequences: the ListSequencesResponse message (.sequences with
        sequence_id, committed_length, pending_tree_nodes, shared_tokens, idle_seconds,
        lease_remaining_seconds; .truncated; .total_sequences). Ids ascending, greater than
        `after_sequence_id` (all when None); at most `limit` (0: the daemon's 1000; it lists fewer
        when the page would not fit its --max-message-bytes). Read-only: renews no lease."""
        if not 0 <= int(limit) <= 2**32 - 1:
            raise invalid_argument(f"limit = {limit} must be in [0, {2**32 - 1}]")
        request = pb.ListSequencesRequest(limit=int(limit))
        if after_sequence_id is not None:
            request.after_sequence_id = int(after_sequence_id)
        return self._call("ListSequences", self._stub.ListSequences, request, idempotent=True,
                          timeout=timeout)

    def all_sequences(self, *, timeout: Optional[float] = None) -> list:
        """Every live sequence (SequenceInfo messages, ids ascending), page after page. Each
        page is a snapshot of its own: a sequence created or released meanwhile may be missed
        or listed. `timeout` bounds each page."""
        listed: list = []
        after: Optional[int] = None
        while True:
            page = self.list_sequences(after, timeout=timeout)
            listed.extend(page.sequences)
            if not page.truncated or not page.sequences:
                return listed
            after = page.sequences[-1].sequence_id

    def health(self, service: str = "", *, timeout: Optional[float] = None) -> str:
        """grpc.health.v1 status name: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN", "UNKNOWN"."""
        return self._call("Health", self._health, service, idempotent=True, timeout=timeout)

    def wait_until_serving(self, timeout: float = 10.0, poll_interval: float = 0.05) -> None:
        """Polls health until SERVING; raises the last error (or DEADLINE_EXCEEDED) after
        `timeout` seconds."""
        end = time.monotonic() + timeout
        last: Optional[Exception] = None
        while time.monotonic() < end:
            try:
                if self.health(timeout=max(min(1.0, end - time.monotonic()), 0.01)) == "SERVING":
                    return
            except VerifydError as e:
                last = e
            time.sleep(poll_interval)
        raise make_error(grpc.StatusCode.DEADLINE_EXCEEDED,
                         f"{self.target} not SERVING after {timeout} s"
                         + (f" (last: {last})" if last else ""), "Health")

    # -- Shared memory ---------------------------------------------------------------------------
    def create_shared_memory(self, nbytes: int, *,
                             timeout: Optional[float] = None) -> SharedMemoryRegion:
        """A region of `nbytes` created by the daemon and mapped here (plans/0010).
        FAILED_PRECONDITION when the daemon has shared memory disabled, RESOURCE_EXHAUSTED past
        its limits; this process must run as the daemon's user on the same host."""
        info = self._call("CreateSharedMemory", self._stub.CreateSharedMemory,
                          pb.CreateSharedMemoryRequest(bytes=int(nbytes)), timeout=timeout)
        try:
            return SharedMemoryRegion(self, info.region, info.path, int(info.bytes))
        except VerifydError:
            try:  # nobody else knows the name: drop it now rather than after its lease
                self.release_shared_memory(info.region, timeout=timeout)
            except VerifydError:
                pass
            raise

    def release_shared_memory(self, region: str, *, timeout: Optional[float] = None) -> int:
        """Drops a region by name (SharedMemoryRegion.release calls this); returns its bytes."""
        return int(self._call("ReleaseSharedMemory", self._stub.ReleaseSharedMemory,
                              pb.ReleaseSharedMemoryRequest(region=region),
                              timeout=timeout).bytes)

    def append_shared(self, sequence_id: int, kv: Any, region: SharedMemoryRegion, *,
                      layer_begin: int = 0, expected_fill: Optional[int] = None,
                      timeout: Optional[float] = None) -> AppendResult:
        """append() with kv copied to offset 0 of `region` (one message: the region bounds it)."""
        bits, _ = as_bf16_bits(kv, "kv", "Append")
        if bits.ndim == 2:
            bits = bits.reshape(1, *bits.shape)
        check_shape(bits, (None, None, ROW), "kv", "layer_count, T, 576", "Append")
        if bits.nbytes > region.size:
            raise invalid_argument(f"kv is {bits.nbytes} bytes, the region has {region.size}",
                                   "Append")
        region.ndarray(0, np.uint16, bits.shape)[...] = bits
        request = pb.AppendRequest(sequence_id=int(sequence_id), layer_begin=int(layer_begin))
        request.kv.CopyFrom(pb.Tensor(dtype=pb.DTYPE_BF16, shape=list(bits.shape),
                                      shared_memory=region.ref(0, bits.nbytes)))
        if expected_fill is None:
            request.create = True
        else:
            request.expected_fill = int(expected_fill)
        r = self._call("Append", self._stub.Append, request, timeout=timeout)
        return AppendResult(int(r.committed_length), [int(f) for f in r.layer_fill], 1)

    def verify_shared(self, layer: int, sequences: Iterable[SequenceLike], q: Any, tree_kv: Any,
                      region: SharedMemoryRegion, *, return_lse: bool = False,
                      softmax_scale: Optional[float] = None,
                      timeout: Optional[float] = None) -> VerifyResult:
        """verify() with q and tree_kv copied into `region` (layout shared_verify_layout(0, ...))
        and out/lse written there by the daemon. numpy outputs are views into the region (valid
        until it is reused); torch outputs are views too on CPU, copies on a CUDA device."""
        seqs = [as_sequence(s) for s in sequences]
        total_q = sum(len(s.parents) for s in seqs)
        q_bits, kind = as_bf16_bits(q, "q", "Verify")
        kv_bits, _ = as_bf16_bits(tree_kv, "tree_kv", "Verify")
        check_shape(q_bits, (total_q, None, ROW), "q", f"sum Q = {total_q}, H, 576", "Verify")
        check_shape(kv_bits, (total_q, ROW), "tree_kv", f"sum Q = {total_q}, 576", "Verify")
        layout = shared_verify_layout(0, total_q, q_bits.shape[1], return_lse)
        if layout.end > region.size:
            raise invalid_argument(f"sum Q = {total_q}, H = {q_bits.shape[1]} needs {layout.end} "
                                   "bytes of shared memory (shared_verify_bytes), the region has "
                                   f"{region.size}", "Verify")
        region.ndarray(layout.q, np.uint16, q_bits.shape)[...] = q_bits
        region.ndarray(layout.tree_kv, np.uint16, kv_bits.shape)[...] = kv_bits
        return self.verify_shared_in_place(layer, seqs, layout, region,
                                           softmax_scale=softmax_scale, timeout=timeout,
                                           output=kind)

    # -- The co-located data plane (SPEC §3.1; verifyd.dataplane) -------------------------------
    def data_plane(self):
        """This Client's data plane (libverifyd_dataplane.so through ctypes; DataPlaneUnavailable
        when the library is missing): registration, host buffers, channels, under this Client's
        client_id. Created on first use, closed with the Client."""
        if self._data_plane is None:
            plane = DataPlane(self.target, self.client_id, admin_token=self.admin_token,
                              timeout=self.timeout)
            try:
                plane.heads = int(self.stats().heads)
            except VerifydError:
                plane.close()
                raise
            self._data_plane = plane
        return self._data_plane

    def register(self, tensor: Any):
        """Registers device memory (a torch CUDA tensor, a __cuda_array_interface__ object, or a
        DLPack kDLCUDA object) with the daemon: data_plane().register(tensor)."""
        return self.data_plane().register(tensor)

    def host_buffer(self, nbytes: int, *, torch: bool = False):
        """A /dev/shm buffer mapped here and registered (the cpu backend's device memory)."""
        return self.data_plane().host_buffer(nbytes, torch=torch)

    def open_channel(self, entries: int = 64):
        """A data-plane channel (one per scheduler thread)."""
        return self.data_plane().open_channel(entries)

    def verify_shared_in_place(self, layer: int, sequences: Iterable[SequenceLike],
                               layout: SharedVerifyLayout, region: SharedMemoryRegion, *,
                               softmax_scale: Optional[float] = None,
                               timeout: Optional[float] = None,
                               output: Union[str, TensorKind] = "numpy") -> VerifyResult:
        """Verify with q and tree_kv already written in `region` at `layout` (e.g. through
        region.tensor(layout.q, ...) views, no copy on the client's path); out/lse come back into
        the region at layout.out / layout.lse. output: "numpy" (uint16 views) or "torch"
        (bfloat16 views)."""
        request, total_q = self._verify_request(layer, sequences, layout.return_lse,
                                                softmax_scale)
        if total_q != layout.total_q or layout.heads < 1:
            raise invalid_argument(f"the layout is for sum Q = {layout.total_q}, H = "
                                   f"{layout.heads}; the request has sum Q = {total_q}", "Verify")
        if layout.end > region.size:
            raise invalid_argument(f"the layout ends at byte {layout.end}, past the region's "
                                   f"{region.size}", "Verify")
        heads = layout.heads
        rows = total_q * heads
        request.q.CopyFrom(pb.Tensor(dtype=pb.DTYPE_BF16, shape=[total_q, heads, ROW],
                                     shared_memory=region.ref(layout.q, rows * ROW * 2)))
        request.tree_kv.CopyFrom(pb.Tensor(dtype=pb.DTYPE_BF16, shape=[total_q, ROW],
                                           shared_memory=region.ref(layout.tree_kv,
                                                                    total_q * ROW * 2)))
        request.out_shared_memory.CopyFrom(region.ref(layout.out, rows * V_DIM * 2))
        if layout.return_lse:
            request.lse_shared_memory.CopyFrom(region.ref(layout.lse, rows * 4))
        response = self._call("Verify", self._stub.Verify, request, timeout=timeout)
        for name, t in (("out", response.out), ("lse", response.lse)):
            if name == "lse" and not layout.return_lse:
                continue
            want = request.out_shared_memory if name == "out" else request.lse_shared_memory
            if (t.WhichOneof("data") != "shared_memory" or t.shared_memory.region != want.region
                    or t.shared_memory.offset != want.offset
                    or t.shared_memory.length != want.length):
                raise make_error(grpc.StatusCode.INTERNAL, f"response {name} does not name the "
                                 "requested range of the region", "Verify")
        kind = output if isinstance(output, TensorKind) else TensorKind(output)
        if kind.kind == "torch":
            out = region.tensor(layout.out, (total_q, heads, V_DIM))
            lse = region.tensor(layout.lse, (total_q, heads), "float32") if layout.return_lse \
                else None
            if kind.device is not None and str(kind.device) != "cpu":
                out = out.to(kind.device)
                lse = None if lse is None else lse.to(kind.device)
        else:
            out = region.ndarray(layout.out, np.uint16, (total_q, heads, V_DIM))
            lse = (region.ndarray(layout.lse, np.float32, (total_q, heads))
                   if layout.return_lse else None)
        return VerifyResult(out, lse, [int(n) for n in response.committed_length], response)


def _has_dtype(x: Any, numpy_dtype, torch_dtype: str) -> bool:
    """Whether x is a numpy array of numpy_dtype or a torch tensor of torch.<torch_dtype>."""
    if isinstance(x, np.ndarray):
        return x.dtype == numpy_dtype
    if is_torch(x):
        import torch  # noqa: PLC0415 - optional dependency
        return x.dtype == getattr(torch, torch_dtype)
    return False


def _is_uint8(x: Any) -> bool:
    """Whether x is a uint8 array: numpy, or a torch tensor (fp8 rows in the 656-byte layout)."""
    return _has_dtype(x, np.uint8, "uint8")


def _is_bf16_bits(x: Any) -> bool:
    """Whether x holds bf16 values: a torch bfloat16 tensor, or numpy uint16 bits."""
    return _has_dtype(x, np.uint16, "bfloat16")


def _dtype_name(x: Any) -> str:
    return str(getattr(x, "dtype", type(x).__name__))


def _uint8_numpy(x: Any) -> np.ndarray:
    if is_torch(x):
        return np.ascontiguousarray(x.detach().to("cpu").contiguous().numpy())
    return np.ascontiguousarray(x)
