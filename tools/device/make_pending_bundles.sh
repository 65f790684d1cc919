#!/usr/bin/env bash
# Here (the build machine): everything tools/device/pending_gpu_checks.sh needs, for the work of
# session 24 that no device could check (plans/0031 change 2, plans/0034 v6c and v6d, the fp8 gate),
# each built in a scratch worktree so this tree is left as it is:
#   bundle.tgz         HEAD with the reverts of change 2 (5b33d4d) and of the gate's lifting
#                      (d61dfe4) reverted in turn, every default target of make_bundle.sh (the
#                      Python parts left out of the archive); MAIN_TOO=0 skips it (~25 minutes)
#   bundle-v6c/, bundle-v6d/  the kernel targets of experiments ab2ceee (v6c) and ca32e2d (v6d)
#   bundle-before/     decode_step_bench of BEFORE (default HEAD), for the A/B of the step
# carry ["bundle.tgz", "bundle-v6c", "bundle-v6d", "bundle-before"] (together under 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH="$PATH:/usr/local/cuda/bin"
# build_at COMMIT DEST REVERTS TARGETS: a worktree at COMMIT with the commits REVERTS (comma-
# separated, may be empty) reverted without committing, its make_bundle.sh output as DEST.
build_at() {
  local commit=$1 dest=$2 reverts=$3 targets=$4
  local wt
  wt=$(mktemp -d)
  git worktree add -q --detach "$wt" "$commit"
  if [ -n "$reverts" ]; then
    (cd "$wt" && git revert --no-commit ${reverts//,/ })
  fi
  (cd "$wt" && ARCHS=90 TARGETS="$targets" bash tools/device/make_bundle.sh >/dev/null)
  rm -rf "${root:?}/$dest"
  if [ "$dest" = bundle ]; then
    mv "$wt/bundle" "$root/bundle"
    tar -C "$root" czf "$root/bundle.tgz" --exclude=bundle/pylib --exclude=bundle/wheel bundle
  else
    mkdir -p "$root/$dest"
    cp -r "$wt/bundle/bin" "$root/$dest/"
  fi
  git worktree remove --force "$wt"
}
for v in v6c:ab2ceee v6d:ca32e2d; do
  build_at "${v#*:}" "bundle-${v%%:*}" "" "mla_verify_flash_test mla_verify_flash_fp8_test mla_verify_bench"
done
build_at "${BEFORE:-HEAD}" bundle-before "" decode_step_bench
if [ "${MAIN_TOO:-1}" = 1 ]; then
  # make_bundle.sh's default list: TARGETS unset inside it.
  build_at HEAD bundle "5b33d4d,d61dfe4" ""
fi
du -sh bundle-v6c bundle-v6d bundle-before
[ -f bundle.tgz ] && du -sh bundle.tgz
