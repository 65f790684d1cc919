#!/usr/bin/env bash
# Installs the Debian 12 packages verifyd builds with (idempotent; root or sudo).
# --tests adds what only the tests use: the Prometheus server and promtool (the deploy tests run
# their own server on loopback), whose package would also enable a system service: it is stopped
# and disabled again when this script installed it.
set -euo pipefail
pkgs=(cmake g++ make pkg-config git
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
      libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
      libspdlog-dev  # the daemon's event log (service/event_log.h)
      curl systemd libsystemd-dev python3-yaml
      python3-grpcio python3-protobuf python3-numpy python3-setuptools python3-venv
      python3-pip python3-wheel  # python/build_wheel.sh (pip wheel, offline)
      clang-14 libfuzzer-14-dev  # the ASan+UBSan stage and the fuzz targets (tests/fuzz)
      clang-format-14)  # the format check (tools/format/check_format.sh)
# The Python package's tests also use pytest and torch (CPU); the pictures' scripts matplotlib.
test_pkgs=(prometheus python3-pytest python3-torch python3-matplotlib)
[[ "${1:-}" == --tests ]] && pkgs+=("${test_pkgs[@]}")
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
if [[ " ${missing[*]:-} " == *" prometheus "* ]] && command -v systemctl >/dev/null &&
   [[ -d /run/systemd/system ]]; then
  ${SUDO:-} systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
