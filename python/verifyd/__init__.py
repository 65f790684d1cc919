"""verifyd: Python client of the verifyd daemon (tree-speculative-decoding verify attention for
MLA models). See python/README section of the repository README and plans/0013.

    import numpy as np, verifyd
    with verifyd.Client("unix:///run/verifyd/verifyd-0.sock") as c:
        c.append(7, kv)                                   # bf16 [layers, T, 576], creates seq 7
        r = c.verify(0, [(7, [-1, 0, 0])], q, tree_kv)    # q [3, H, 576], tree_kv [3, 576]
        c.commit(7, [0, 2])
"""
from .client import (APPEND_ENVELOPE_BYTES, AppendResult, Client, VerifyResult, VerifySequence,
                     split_append)
from .errors import (DeadlineExceeded, FailedPrecondition, GroupError, InvalidArgument, NotFound,
                     PermissionDenied, ResourceExhausted, Unavailable, Unimplemented,
                     VerifydError)
from .group import GroupClient
from .shared_memory import (SharedMemoryRegion, SharedVerifyLayout, shared_verify_bytes,
                            shared_verify_layout)
from .tensors import ROW, V_DIM, bf16_to_float32, float32_to_bf16

__version__ = "0.1.0"

__all__ = [
    "Client", "GroupClient", "VerifySequence", "AppendResult", "VerifyResult", "split_append",
    "APPEND_ENVELOPE_BYTES", "SharedMemoryRegion", "SharedVerifyLayout", "shared_verify_layout",
    "shared_verify_bytes", "VerifydError", "InvalidArgument", "NotFound", "FailedPrecondition",
    "ResourceExhausted", "DeadlineExceeded", "Unavailable", "PermissionDenied", "Unimplemented",
    "GroupError", "ROW", "V_DIM", "bf16_to_float32", "float32_to_bf16", "__version__",
]
