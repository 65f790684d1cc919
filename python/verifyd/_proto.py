"""The generated stubs, with an error that says how to make them when they are missing."""
try:
    from .v1 import verifyd_pb2 as pb
    from .v1 import verifyd_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - depends on the install
    if "verifyd_pb2" not in str(e):
        raise
    raise ImportError(
        "verifyd: the generated stubs (verifyd/v1/verifyd_pb2.py) are missing: install with "
        "`pip install --no-build-isolation python/` or run `python/build_stubs.sh` and use "
        "PYTHONPATH=python (needs Debian's protobuf-compiler and protobuf-compiler-grpc)") from e

__all__ = ["pb", "pb_grpc"]
