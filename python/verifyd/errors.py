"""Errors: every failed call raises VerifydError carrying the gRPC code and the daemon's message.

The daemon's message names the field and the bound (SPEC §3); it is kept unchanged in `.message`.
`str(error)` is "Method: message (CODE)". One subclass per code that a caller may want to catch
on its own (NotFound for an expired sequence, FailedPrecondition for an Append whose expected
position is wrong, ResourceExhausted when the KV pool is full, DeadlineExceeded for `timeout=`).
Checks the client makes before sending anything raise the same classes (INVALID_ARGUMENT).
"""
from __future__ import annotations

from typing import Optional

import grpc

__all__ = [
    "VerifydError", "InvalidArgument", "NotFound", "FailedPrecondition", "ResourceExhausted",
    "DeadlineExceeded", "Unavailable", "PermissionDenied", "Unimplemented", "GroupError",
    "error_from_rpc", "invalid_argument",
]


class VerifydError(Exception):
    """A failed verifyd call: `.code` (grpc.StatusCode), `.message` (the daemon's text, or the
    client's for checks made before sending), `.method` ("Append", "Verify", ...)."""

    def __init__(self, code: grpc.StatusCode, message: str, method: str = ""):
        self.code = code
        self.message = message
        self.method = method
        prefix = f"{method}: " if method else ""
        super().__init__(f"{prefix}{message} ({code.name})")


class InvalidArgument(VerifydError):
    pass


class NotFound(VerifydError):
    pass


class FailedPrecondition(VerifydError):
    pass


class ResourceExhausted(VerifydError):
    pass


class DeadlineExceeded(VerifydError):
    pass


class Unavailable(VerifydError):
    pass


class PermissionDenied(VerifydError):
    pass


class Unimplemented(VerifydError):
    pass


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
}


def make_error(code: grpc.StatusCode, message: str, method: str = "") -> VerifydError:
    return _BY_CODE.get(code, VerifydError)(code, message, method)


def invalid_argument(message: str, method: str = "") -> VerifydError:
    return InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT, message, method)


def error_from_rpc(error: grpc.RpcError, method: str) -> VerifydError:
    """A grpc.RpcError (raised by a stub call) as a VerifydError of the same code."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return make_error(code or grpc.StatusCode.UNKNOWN, details or "", method)


class GroupError(VerifydError):
    """A group call where some rank failed: code and message of the lowest failing rank
    (prefixed "rank r: "); `.results[r]` holds each rank's result or its VerifydError."""

    def __init__(self, rank: int, error: VerifydError, results: list):
        self.rank = rank
        self.results = results
        self.cause = error
        super().__init__(error.code, f"rank {rank}: {error.message}", error.method)

    def errors(self) -> dict:
        return {r: x for r, x in enumerate(self.results) if isinstance(x, VerifydError)}


def first_error(results: list) -> Optional[GroupError]:
    for r, x in enumerate(results):
        if isinstance(x, VerifydError):
            return GroupError(r, x, results)
    return None
