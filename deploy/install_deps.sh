#!/usr/bin/env bash
# Installs the Debian 12 packages verifyd builds and tests with (idempotent; root or sudo).
set -euo pipefail
pkgs=(cmake g++ make pkg-config git
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
      libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
      prometheus curl systemd python3-yaml
      python3-grpcio python3-protobuf python3-numpy python3-pytest python3-setuptools
      python3-torch python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
