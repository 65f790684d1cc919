"""Finding and loading libverifyd_dataplane.so. Where it is looked for, in order: the path in
$VERIFYD_DATAPLANE_LIB, next to this package, the repository's build tree (build/client/c_api/),
the loader's search path (ldconfig, LD_LIBRARY_PATH). Where it is found changes nothing it
computes. Missing or of another ABI: `DataPlaneUnavailable` saying which and why. Also the one
place a library call's failure becomes a VerifydError (`check`)."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import List, Optional, Tuple

import grpc

from .dataplane_abi import ABI_VERSION, LIBRARY_NAME, SIGNATURES
from .errors import make_error

ENV_LIBRARY = "VERIFYD_DATAPLANE_LIB"  # an explicit path to the library


class DataPlaneUnavailable(NotImplementedError):
    """The data-plane library is missing or incompatible (the message says which and where it was
    looked for); the gRPC and shared-memory paths still work."""


_lib: Optional[ctypes.CDLL] = None
_why: Optional[str] = None
CODES = {s.value[0]: s for s in grpc.StatusCode}  # the library's int codes


def _candidates() -> List[str]:
    found = []
    if os.environ.get(ENV_LIBRARY):
        return [os.environ[ENV_LIBRARY]]  # an explicit choice is the only one tried
    here = os.path.dirname(os.path.abspath(__file__))
    found.append(os.path.join(here, LIBRARY_NAME))  # installed next to the package
    repo = os.path.dirname(os.path.dirname(here))
    found.append(os.path.join(repo, "build", "client", "c_api", LIBRARY_NAME))  # the build tree
    system = ctypes.util.find_library("verifyd_dataplane")
    if system:
        found.append(system)
    found.append(LIBRARY_NAME)  # the loader's own search path (LD_LIBRARY_PATH)
    return found


def _try_load() -> Tuple[Optional[ctypes.CDLL], Optional[str]]:
    reasons = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            reasons.append(f"{path}: no such file")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            reasons.append(f"{path}: {e}")
            continue
        try:
            for name, (restype, argtypes) in SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype = restype
                fn.argtypes = argtypes
        except AttributeError as e:
            return None, f"{path} is not libverifyd_dataplane ABI {ABI_VERSION}: {e}"
        version = lib.vd_abi_version()
        if version != ABI_VERSION:
            return None, (f"{path} has ABI version {version}; this package speaks "
                          f"{ABI_VERSION}: install the library and the package from one build")
        return lib, None
    return None, (f"the verifyd data-plane library {LIBRARY_NAME} was not found (build target "
                  f"verifyd_dataplane, or set ${ENV_LIBRARY} to its path); looked at: "
                  + "; ".join(reasons))


def load(raise_if_missing: bool = True) -> Optional[ctypes.CDLL]:
    """The loaded library; DataPlaneUnavailable (or None) when it cannot be had."""
    global _lib, _why
    if _lib is None and _why is None:
        _lib, _why = _try_load()
    if _lib is None and raise_if_missing:
        raise DataPlaneUnavailable(_why)
    return _lib


def _reset_for_tests() -> None:
    global _lib, _why
    _lib, _why = None, None


def available() -> bool:
    """Whether the data plane can be used in this process."""
    return load(raise_if_missing=False) is not None


def why_unavailable() -> Optional[str]:
    load(raise_if_missing=False)
    return _why


def has_cuda() -> bool:
    """Whether the library was built with CUDA (device registration, stream order)."""
    lib = load(raise_if_missing=False)
    return bool(lib is not None and lib.vd_has_cuda())


def check(rc: int, method: str) -> int:
    """rc, or the library's last error raised as the VerifydError of its code."""
    if rc >= 0:
        return rc
    lib = load()
    code = CODES.get(lib.vd_last_error_code(), grpc.StatusCode.UNKNOWN)
    raise make_error(code, (lib.vd_last_error() or b"").decode("utf-8", "replace"), method)
