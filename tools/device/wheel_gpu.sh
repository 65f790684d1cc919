#!/usr/bin/env bash
# On the GPU machine (run tool, carry the bundle: tools/device/make_bundle.sh puts the wheel in
# bundle/wheel/): installs the verifyd wheel into a fresh venv of the host's own python3
# (--system-site-packages, so the image's torch, grpcio, protobuf, numpy and transformers are
# seen; `pip install --no-deps`, nothing compiled), then runs everything Python from that venv,
# none of it from the checkout:
#   1. tests/python/installed_wheel_check.py --cuda  the package and its CUDA library are the
#      wheel's, the library's own libraries come from beside it
#   2. tools/device/python_dataplane_gpu.py --installed  the Python data-plane GPU checks (a cuda
#      daemon, torch CUDA tensors registered, stream-ordered Verify, every output against float64)
#   3. tools/device/real_model_gpu.py --installed  transformers' DeepSeek-V3 decoding with trees
#      through verifyd, token for token (REAL_MODEL_ARGS: e.g. --quick; REAL_MODEL=0 skips it;
#      REAL_MODEL_TIMEOUT seconds, 420 by default, inside the device tool's 600 s a command)
# Logs and real_model.json go to $OUT; the summary comes last. Exit 1 when anything failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/verifyd-wheel-gpu}
B=${BUNDLE:-bundle}
mkdir -p "$OUT"
[ -d "$B" ] || tar xzf bundle.tgz
summary=""
status=0
note() { summary="$summary$1\n"; echo "$1"; }

wheel=$(ls "$B"/wheel/verifyd-*.whl 2>/dev/null | head -1)
if [[ -z "$wheel" ]]; then
  echo "FAIL: no $B/wheel/verifyd-*.whl (tools/device/make_bundle.sh builds it)"
  exit 1
fi
# The daemon alone gets the bundle's libraries (and cuBLAS's directory).
cublas_dir=$(bash tools/device/cublas_dir.sh)
daemon_ld="$(cd "$B" && pwd)/lib${cublas_dir:+:$cublas_dir}"

venv="$(mktemp -d)/venv"
python3 -m venv --system-site-packages "$venv" >"$OUT/venv.log" 2>&1 ||
  python3 -m venv --system-site-packages --without-pip "$venv" >>"$OUT/venv.log" 2>&1 ||
  { echo "FAIL: python3 -m venv: $(tail -3 "$OUT/venv.log")"; exit 1; }
py=$venv/bin/python
# What the host's python3 sees (its site-packages, or those of the venv it runs in: an engine
# image's), after the new venv's own site-packages, where the wheel goes.
python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
  >"$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/host-site.pth"
# pip inside the venv (ensurepip), else the host's pip aimed at the venv, else the wheel unpacked
# into the venv's site-packages by hand (a wheel is a zip laid out as installed).
if "$py" -m pip --version >/dev/null 2>&1; then
  how="pip install --no-deps (the venv's pip)"
  "$py" -m pip install --no-deps --no-index "$wheel" >"$OUT/install.log" 2>&1
elif python3 -m pip --version >/dev/null 2>&1; then
  how="pip --python VENV install --no-deps (the host's pip)"
  python3 -m pip --python "$py" install --no-deps --no-index "$wheel" >"$OUT/install.log" 2>&1
else
  how="unpacked into the venv (no pip on this host)"
  "$py" - "$wheel" >"$OUT/install.log" 2>&1 <<'PY'
import sys, sysconfig, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sysconfig.get_paths()["platlib"])
PY
fi
rc=$?
[ $rc -ne 0 ] && status=1
note "install $(basename "$wheel") into $("$py" --version 2>&1) venv: $how rc=$rc"
[ $rc -ne 0 ] && { tail -5 "$OUT/install.log"; echo -e "== summary (status 1)\n$summary"; exit 1; }

run() { env -u PYTHONPATH -u VERIFYD_DATAPLANE_LIB -u LD_LIBRARY_PATH "$@"; }
run "$py" tests/python/installed_wheel_check.py --repo "$PWD" --cuda 2>&1 | tee "$OUT/installed.log"
rc=${PIPESTATUS[0]}
[ $rc -ne 0 ] && status=1
note "installed_wheel_check rc=$rc"

run "$py" tools/device/python_dataplane_gpu.py --installed --verifyd "$B/bin/verifyd" \
  --daemon-ld-path "$daemon_ld" >"$OUT/python_dataplane_wheel.log" 2>&1
rc=$?
[ $rc -ne 0 ] && status=1
grep -E "^(PASS|FAIL|verifyd from|python )" "$OUT/python_dataplane_wheel.log"
note "python_dataplane (from the wheel) rc=$rc $(tail -1 "$OUT/python_dataplane_wheel.log")"

if [ "${REAL_MODEL:-1}" = 1 ]; then
  # shellcheck disable=SC2086 - REAL_MODEL_ARGS is a list of options
  run OUT="$OUT" timeout "${REAL_MODEL_TIMEOUT:-420}" "$py" tools/device/real_model_gpu.py \
    --installed --verifyd "$B/bin/verifyd" --daemon-ld-path "$daemon_ld" --out "$OUT" \
    ${REAL_MODEL_ARGS:-} 2>&1 | tee "$OUT/real_model.log"
  rc=${PIPESTATUS[0]}
  [ $rc -ne 0 ] && status=1
  note "real_model (from the wheel) rc=$rc $(tail -1 "$OUT/real_model.log")"
fi
echo "== summary (status $status)"
echo -e "$summary"
exit $status
