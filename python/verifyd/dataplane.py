"""The co-located data plane of SPEC §3.1 from Python: registered memory, a channel per scheduler
thread, stream-ordered Verify (plans/0013, plans/0017).

The work is done by `libverifyd_dataplane.so` (client/c_api/verifyd_dataplane.h), loaded with
ctypes: one build serves every Python version (3.11 here, 3.12 on the GPU hosts) and other
languages, with no compiled Python extension. Where it is looked for, in order: the path in
$VERIFYD_DATAPLANE_LIB, next to this package, the repository's build tree (build/client/c_api/),
the loader's search path (ldconfig, LD_LIBRARY_PATH). Where it is found changes nothing it
computes. Missing or of another ABI: `DataPlaneUnavailable` saying which and why.

    plane = client.data_plane()                    # one per Client (its client_id owns regions)
    # cuda backend: any torch CUDA tensor / __cuda_array_interface__ / DLPack kDLCUDA object
    mem = plane.register(pool)                     # CUDA IPC handle made inside the library
    # cpu backend: memory the daemon can map = a sealed memfd of this process
    buf = plane.host_buffer(8 << 20)               # created, mapped, registered
    q = buf.take((n, H, 576), "bfloat16")          # numpy uint16 bits (torch=True: torch bf16)
    flags = buf.take((2,), "uint32")
    ch = plane.open_channel()
    ch.verify(0, [(7, [-1, 0, 0])], q, tree_kv, out, ready=(flags[0:1], step),
              done=(flags[1:2], step))             # returns the descriptor id
    ch.result()                                    # next completion; raises VerifydError

Stream order (CUDA): `verify` enqueues the descriptor (a host action) and then, on `stream`
(default `torch.cuda.current_stream().cuda_stream`), "write ready = value" after the stream's
earlier work and "wait until done >= value" before its later work — the CPU never blocks; the
daemon's stream waits for ready and writes done after out/lse. On host memory (cpu backend) the
host is the stream: `verify` stores ready = value after the descriptor is published, and the
caller waits with `result()` (or reads done).

Failures: every descriptor completes. A refused or failed Verify has NaN outputs and its done
flag written (the scheduler never hangs); its completion carries the gRPC code and the daemon's
message, the same as the gRPC Verify's for the same mistake. `Completion.raise_for_status()` /
`Channel.result()` raise the VerifydError subclass of that code.
"""
from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Tuple

# One module per concern; this one is the data plane's face (its names as before the split) and
# the registration of memory (DataPlane).
from .dataplane_abi import ABI_VERSION, LIBRARY_NAME, MESSAGE_BYTES, P, U64  # noqa: F401
from .dataplane_channel import (FLAG_ALIGNMENT, Channel, Completion, Flag,  # noqa: F401
                                PreparedSequences, Ref)
from .dataplane_library import (ENV_LIBRARY, DataPlaneUnavailable, available, check, has_cuda, load,
                                why_unavailable)
from .dataplane_memory import TENSOR_ALIGNMENT, HostBuffer, RegisteredMemory  # noqa: F401
from .dataplane_tensors import (address_of, device_pointer, host_pointer, is_cuda,  # noqa: F401
                                torch_tensor)
from .dlpack import DLPackTensor  # noqa: F401
from .errors import VerifydError, invalid_argument

__all__ = ["LIBRARY_NAME", "ABI_VERSION", "ENV_LIBRARY", "DataPlaneUnavailable", "available",
           "why_unavailable", "load", "has_cuda", "device_pointer", "DataPlane",
           "RegisteredMemory", "HostBuffer", "Channel", "Completion", "Flag", "Ref"]


class DataPlane:
    """A Client's data plane: its own C++ client inside the library, with the Python Client's
    client_id, so regions and channels belong to that Client (x-verifyd-client)."""

    def __init__(self, target: str, client_id: str, *, admin_token: str = "",
                 timeout: float = 30.0):
        self._lib = load()
        handle = P()
        check(self._lib.vd_connect(target.encode(), client_id.encode(), admin_token.encode(),
                                    float(timeout), ctypes.byref(handle)), "Connect")
        self._handle = handle
        self.target = target
        self.client_id = client_id
        self._memory: List[RegisteredMemory] = []
        self._refs: Dict[Tuple[int, int, bool], Tuple[Ref, int, bool]] = {}  # resolved tensors
        self.heads: Optional[int] = None  # the daemon's H, for shape checks (set by the Client)

    # -- registration ----------------------------------------------------------------------------
    def register_file(self, path: str, nbytes: int, address: int = 0, *, device: int = 0,
                      keep: Any = None) -> RegisteredMemory:
        """Registers host memory (cpu backend) mapped at `address` in this process: `path` is
        /proc/<this pid>/fd/<n>, a memfd sealed against shrinking with its pages allocated."""
        region = U64()
        check(self._lib.vd_register_file(self._handle, path.encode(), int(nbytes), int(device),
                                          ctypes.byref(region)), "RegisterExternalMemory")
        m = RegisteredMemory(self, region.value, address, int(nbytes), False, keep)
        self._memory.append(m)
        return m

    def register(self, tensor: Any) -> RegisteredMemory:
        """Registers device memory: a torch CUDA tensor, an object with
        `__cuda_array_interface__`, or a DLPack object (`__dlpack__` + `__dlpack_device__`) on
        kDLCUDA; contiguous. The CUDA IPC handle of its allocation is made inside the library;
        nothing crosses the host. The region is the CUDA allocation holding the tensor,
        from its base (what the daemon's cudaIpcOpenMemHandle maps), so register one tensor per
        allocation — a pool the engine carves its buffers from — and keep it alive while
        registered; a tensor inside an already registered range gets that region back. Host
        memory must come from host_buffer()."""
        if isinstance(tensor, HostBuffer):
            return tensor.memory
        method = "RegisterExternalMemory"
        if not is_cuda(tensor, "tensor", method):
            raise invalid_argument("register() takes device memory (a CUDA tensor, "
                                   "__cuda_array_interface__ or DLPack kDLCUDA); host memory for "
                                   "the cpu backend comes from host_buffer(bytes)", method)
        pointer, nbytes, _ = device_pointer(tensor, "tensor", method)
        for m in self._memory:  # inside a registered allocation already: the same region
            if m.device and m.contains(pointer, nbytes):
                return m
        region, base = U64(), U64()
        check(self._lib.vd_register_cuda(self._handle, pointer, nbytes, ctypes.byref(region),
                                          ctypes.byref(base)), "RegisterExternalMemory")
        m = RegisteredMemory(self, region.value, base.value, pointer + nbytes - base.value, True,
                             tensor)
        self._memory.append(m)
        return m

    def host_buffer(self, nbytes: int, *, torch: bool = False) -> HostBuffer:
        """A registered sealed memfd (the cpu backend's "device memory")."""
        return HostBuffer(self, nbytes, torch=torch)

    def _forget(self, m: RegisteredMemory) -> None:
        self._memory = [x for x in self._memory if x is not m]
        self._refs.clear()

    def ref(self, x: Any, name: str, method: str = "Verify") -> Tuple[Ref, int, bool]:
        """(Ref, address, on device) of a tensor inside registered memory."""
        if isinstance(x, Ref):
            return x, 0, False
        return self._resolve(x, name, method)

    def _resolve(self, x: Any, name: str, method: str = "Verify") -> Tuple[Ref, int, bool]:
        if torch_tensor(x):  # the common case, without building __array_interface__ dicts
            if not x.is_contiguous():
                raise invalid_argument(f"{name} must be contiguous", method)
            key = (x.data_ptr(), x.numel() * x.element_size(), bool(x.is_cuda))
        elif isinstance(x, Ref):
            return x, 0, False
        else:
            key = address_of(x, name, method)
        hit = self._refs.get(key)
        if hit is not None:
            return hit
        address, nbytes, on_device = key
        for m in self._memory:
            if m.device == on_device and m.contains(address, nbytes):
                found = (Ref(m.region, address - m.base), address, on_device)
                if len(self._refs) > 4096:
                    self._refs.clear()
                self._refs[key] = found
                return found
        where = "device" if on_device else "host"
        raise invalid_argument(f"{name} ({where} address 0x{address:x}, {nbytes} bytes) is not "
                               "inside a buffer registered by this client (register() / "
                               "host_buffer())", method)

    # -- channels --------------------------------------------------------------------------------
    def open_channel(self, entries: int = 64) -> "Channel":
        return Channel(self, entries)

    def close(self) -> None:
        if self._handle:
            for m in list(self._memory):
                try:
                    m.release()
                except VerifydError:
                    pass
            self._lib.vd_disconnect(self._handle)
            self._handle = P()

    def __enter__(self) -> "DataPlane":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
