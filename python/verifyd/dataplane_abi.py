"""The C ABI of libverifyd_dataplane.so (client/c_api/verifyd_dataplane.h) as ctypes: the
structs a descriptor and a completion are made of, and every function's signature (set on the
library when it is loaded, dataplane_library.py)."""
from __future__ import annotations

import ctypes

LIBRARY_NAME = "libverifyd_dataplane.so"
ABI_VERSION = 1
MESSAGE_BYTES = 256


class TensorRef(ctypes.Structure):
    _fields_ = [("region", ctypes.c_uint64), ("offset", ctypes.c_uint64)]


class FlagRef(ctypes.Structure):
    _fields_ = [("region", ctypes.c_uint64), ("offset", ctypes.c_uint64),
                ("value", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


NO_TENSOR, NO_FLAG = TensorRef(0, 0), FlagRef(0, 0, 0, 0)


class SequenceDesc(ctypes.Structure):
    _fields_ = [("sequence_id", ctypes.c_uint64), ("parents", ctypes.POINTER(ctypes.c_int32)),
                ("num_parents", ctypes.c_uint32), ("has_commit", ctypes.c_uint32),
                ("commit_path", ctypes.POINTER(ctypes.c_int32)),
                ("commit_length", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


class VerifyDesc(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("layer", ctypes.c_uint32),
                ("num_sequences", ctypes.c_uint32), ("sequences", ctypes.POINTER(SequenceDesc)),
                ("q", TensorRef), ("tree_kv", TensorRef), ("out", TensorRef),
                ("lse", TensorRef), ("return_lse", ctypes.c_uint32),
                ("has_softmax_scale", ctypes.c_uint32), ("softmax_scale", ctypes.c_float),
                ("reserved", ctypes.c_uint32), ("ready", FlagRef), ("done", FlagRef)]


class CompletionRecord(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("committed_length", ctypes.c_uint64),
                ("code", ctypes.c_int32), ("reserved", ctypes.c_uint32),
                ("message", ctypes.c_char * MESSAGE_BYTES)]

class CaptureDesc(ctypes.Structure):
    _fields_ = [("layer_begin", ctypes.c_uint32), ("num_layers", ctypes.c_uint32),
                ("max_batch", ctypes.c_uint32), ("max_q", ctypes.c_uint32),
                ("q", TensorRef), ("tree_kv", TensorRef), ("out", TensorRef),
                ("lse", TensorRef), ("ready", TensorRef), ("done", TensorRef),
                ("return_lse", ctypes.c_uint32), ("has_softmax_scale", ctypes.c_uint32),
                ("softmax_scale", ctypes.c_float), ("reserved", ctypes.c_uint32),
                ("ready_pointer", ctypes.c_uint64), ("done_pointer", ctypes.c_uint64),
                ("out_pointer", ctypes.c_uint64), ("lse_pointer", ctypes.c_uint64)]


class StepTensors(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("num_seqs", "sequence_ids", "q_lens", "parents",
                                               "commit_lens", "paths")]


P = ctypes.c_void_p
U64 = ctypes.c_uint64
U32 = ctypes.c_uint32
SIGNATURES = {
    "vd_abi_version": (ctypes.c_int, []),
    "vd_has_cuda": (ctypes.c_int, []),
    "vd_last_error_code": (ctypes.c_int, []),
    "vd_last_error": (ctypes.c_char_p, []),
    "vd_connect": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                  ctypes.c_double, ctypes.POINTER(P)]),
    "vd_disconnect": (None, [P]),
    "vd_client_id": (ctypes.c_char_p, [P]),
    "vd_register_file": (ctypes.c_int, [P, ctypes.c_char_p, U64, U32,
                                        ctypes.POINTER(U64)]),
    "vd_register_cuda": (ctypes.c_int, [P, U64, U64, ctypes.POINTER(U64),
                                        ctypes.POINTER(U64)]),
    "vd_release_memory": (ctypes.c_int, [P, U64, ctypes.POINTER(U64)]),
    "vd_channel_open": (ctypes.c_int, [P, U32, ctypes.POINTER(P)]),
    "vd_channel_close": (ctypes.c_int, [P]),
    "vd_channel_id": (U64, [P]),
    "vd_channel_entries": (U32, [P]),
    "vd_channel_in_flight": (U64, [P]),
    "vd_channel_heartbeat": (None, [P]),
    "vd_enqueue_verify": (ctypes.c_int, [P, ctypes.POINTER(VerifyDesc)]),
    "vd_enqueue_commit": (ctypes.c_int, [P, U64, U64, ctypes.POINTER(ctypes.c_int32), U32]),
    "vd_poll_completions": (ctypes.c_int, [P, ctypes.POINTER(CompletionRecord), U32]),
    "vd_wait_completion": (ctypes.c_int, [P, ctypes.c_double, ctypes.POINTER(CompletionRecord)]),
    "vd_stream_write_value32": (ctypes.c_int, [P, U64, U32]),
    "vd_stream_wait_value32": (ctypes.c_int, [P, U64, U32]),
    # A captured decode step (plans/0033).
    "vd_capture_prepare": (ctypes.c_int, [P, P, ctypes.POINTER(CaptureDesc), ctypes.POINTER(P)]),
    "vd_capture_free": (None, [P]),
    "vd_capture_epoch": (U64, [P]),
    "vd_capture_num_layers": (U32, [P]),
    "vd_capture_max_batch": (U32, [P]),
    "vd_capture_max_q": (U32, [P]),
    "vd_capture_publish_host": (ctypes.c_int, [P, U32, P, P, P, P, P, ctypes.POINTER(U64)]),
    "vd_capture_signal_ready_host": (ctypes.c_int, [P, U32]),
    "vd_capture_wait_done_host": (ctypes.c_int, [P, U32, ctypes.c_double]),
    "vd_capture_error": (ctypes.c_int, [P, P, ctypes.POINTER(U32)]),
    "vd_capture_wait_step": (ctypes.c_int, [P, U64, ctypes.c_double]),
    "vd_capture_enable_device": (ctypes.c_int, [P, ctypes.c_double]),
    "vd_capture_step_publish": (ctypes.c_int, [P, P, ctypes.POINTER(StepTensors)]),
    "vd_capture_signal_ready": (ctypes.c_int, [P, P, U32]),
    "vd_capture_wait_done": (ctypes.c_int, [P, P, U32]),
}

