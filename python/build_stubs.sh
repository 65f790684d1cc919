#!/usr/bin/env bash
# Generates the gRPC/protobuf stubs of proto/verifyd/v1/verifyd.proto into python/verifyd/v1/
# (git-ignored), for running the package from the checkout with PYTHONPATH=python.
# `pip install python/` runs the same step itself (setup.py). Needs Debian's protobuf-compiler and
# protobuf-compiler-grpc (protoc + grpc_python_plugin); no Python package is needed to generate.
# usage: python/build_stubs.sh [OUT_DIR]   (OUT_DIR gets verifyd/v1/*.py; default: python/)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
proto_root="$here/../proto"
plugin="${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || true)}"
[[ -n "$plugin" ]] || { echo "build_stubs.sh: grpc_python_plugin not found (apt-get install protobuf-compiler-grpc)" >&2; exit 1; }
command -v protoc >/dev/null || { echo "build_stubs.sh: protoc not found (apt-get install protobuf-compiler)" >&2; exit 1; }
mkdir -p "$out/verifyd/v1"
protoc -I "$proto_root" --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" "$proto_root/verifyd/v1/verifyd.proto"
[[ -f "$out/verifyd/v1/__init__.py" ]] || : > "$out/verifyd/v1/__init__.py"
