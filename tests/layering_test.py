#!/usr/bin/env python3
"""The layering rule of ARCHITECTURE.md: no #include goes up the stack.

Reads every #include "..." of the product folders and fails on an edge the table below does not
allow. Third-party headers that belong to one layer (gRPC, protobuf, Prometheus, the generated
proto) are rooms of their own here, so nothing below the gRPC edge can include them either.
Before checking the tree it checks itself: a planted upward include must be reported.

Usage: layering_test.py <repo root>
"""
import os
import re
import sys
import tempfile

# room -> the rooms its files may include (its own room is always allowed).
ALLOWED = {
    "base": set(),
    # The data plane's shared-memory wire format (ring, descriptors): header-only, std + absl,
    # used by the client library and the executor alike (plans/0017-data-plane.md).
    "channel": {"base"},
    "verify": {"base"},
    "kernels": {"base", "verify"},
    "kvstore": {"base", "verify"},
    "backend": {"base", "verify", "kernels", "kvstore"},
    "executor": {"base", "verify", "kvstore", "backend", "channel"},
    "service": {"base", "verify", "kvstore", "backend", "executor", "channel", "proto", "grpc",
                "prometheus"},
    # base: the data-plane C library (client/c_api) takes the CUDA driver entry points
    # (base/cuda_driver.h) for its stream-order helpers; the C++ client library itself does not.
    # verify: the fp8 row's quantizer (verify/kv_fp8_layout.h, header-only and std-only), so that
    # the client's helper makes the daemon's bytes with the daemon's code (plans/0030).
    "client": {"proto", "grpc", "channel", "base", "verify"},
}
# Include prefixes that name a room (first path component, or a third-party library's).
ROOM_OF_PREFIX = {
    "verifyd/v1/": "proto",
    "google/protobuf/": "proto",
    "grpcpp/": "grpc",
    "grpc/": "grpc",
    "prometheus/": "prometheus",
}
# Edges that exist today and are being removed, each with the reason; empty when the tree is clean.
# (The executor's six, to the flags' options, Prometheus and protobuf, went with the seams step of
# issue 13: per-layer options, a metrics interface, plain result structs.)
PENDING = set()

INCLUDE = re.compile(r'^\s*#\s*include\s+[<"]([^">]+)[">]', re.M)
SOURCE = (".h", ".cc", ".cu", ".cuh")


def room_of(include, product_rooms):
    for prefix, room in ROOM_OF_PREFIX.items():
        if include.startswith(prefix):
            return room
    first = include.split("/", 1)[0]
    if "/" in include and first in product_rooms:
        return first
    return None  # the standard library, absl, CUDA: allowed everywhere


def violations(root):
    found = []
    for room in ALLOWED:
        top = os.path.join(root, room)
        for dirpath, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                for include in INCLUDE.findall(text):
                    target = room_of(include, ALLOWED.keys() | {"tools", "tests", "python"})
                    if target is None or target == room or target in ALLOWED[room]:
                        continue
                    edge = (rel, include)
                    if edge not in PENDING:
                        found.append(f"{rel}: includes {include} ({room} -> {target} is not allowed)")
    return found


def self_check():
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "kvstore"))
        with open(os.path.join(tmp, "kvstore", "planted.h"), "w") as f:
            f.write('#include "service/service_options.h"\n#include "verify/bf16.h"\n')
        os.makedirs(os.path.join(tmp, "executor"))
        with open(os.path.join(tmp, "executor", "planted.cc"), "w") as f:
            f.write('#include <grpcpp/grpcpp.h>\n')
        found = violations(tmp)
        if len(found) != 2:
            sys.exit(f"layering self-check: expected the 2 planted violations, got {found}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    self_check()
    found = violations(sys.argv[1])
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} upward includes (tests/layering_test.py states the allowed edges)")
        return 1
    print("layering: every include goes down the stack")
    return 0


if __name__ == "__main__":
    sys.exit(main())
