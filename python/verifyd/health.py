"""grpc.health.v1 Health/Check, encoded by hand (two fields), like client/health_codec.cc.

Hand encoding avoids registering `grpc.health.v1.*` in protobuf's default descriptor pool, which
would clash with a scheduler that also imports grpcio-health-checking's stubs.
"""
from __future__ import annotations

HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"
STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_request(service: str) -> bytes:
    """HealthCheckRequest {string service = 1}."""
    data = service.encode()
    return b"\x0a" + _varint(len(data)) + data if data else b""


def decode_response(data: bytes) -> str:
    """HealthCheckResponse {ServingStatus status = 1} -> the status name; unknown fields skipped."""
    status, i = 0, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
            if field == 1:
                status = value
        elif wire == 2:
            length, i = _read_varint(data, i)
            i += length
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"HealthCheckResponse: wire type {wire} of field {field}")
    return STATUS_NAMES.get(status, "UNKNOWN")


def _read_varint(data: bytes, i: int):
    value, shift = 0, 0
    while True:
        if i >= len(data):
            raise ValueError("HealthCheckResponse: truncated varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
