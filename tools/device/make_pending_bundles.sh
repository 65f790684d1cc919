#!/usr/bin/env bash
# Here (the build machine): the bundles tools/device/pending_gpu_checks.sh compares, for the work of
# session 24 that no device could check (plans/0031 change 2, plans/0034 v6c and v6d, the fp8 gate):
#   bundle/            this tree as it is (build it with the changes under test re-applied, e.g.
#                      `git revert --no-commit 5b33d4d` for plans/0031 change 2, and the fp8 gate
#                      lifted as plans/0030 says), then `tar czf bundle.tgz --exclude=bundle/pylib
#                      --exclude=bundle/wheel bundle`
#   bundle-v6c/, bundle-v6d/  the kernel targets of experiments ab2ceee (v6c) and ca32e2d (v6d,
#                      plans/0034), each built in a scratch worktree
#   bundle-before/     decode_step_bench of the commit BEFORE (default HEAD), for the A/B of the step
# carry ["bundle.tgz", "bundle-v6c", "bundle-v6d", "bundle-before"] (together under 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export PATH="$PATH:/usr/local/cuda/bin"
build_at() {  # commit dest targets...
  local commit=$1 dest=$2
  shift 2
  local wt
  wt=$(mktemp -d)
  git worktree add -q --detach "$wt" "$commit"
  (cd "$wt" && ARCHS=90 TARGETS="$*" bash tools/device/make_bundle.sh >/dev/null)
  rm -rf "$root/$dest"
  mkdir -p "$root/$dest"
  cp -r "$wt/bundle/bin" "$root/$dest/"
  git worktree remove --force "$wt"
}
for v in v6c:ab2ceee v6d:ca32e2d; do
  build_at "${v#*:}" "bundle-${v%%:*}" mla_verify_flash_test mla_verify_flash_fp8_test mla_verify_bench
done
build_at "${BEFORE:-HEAD}" bundle-before decode_step_bench
du -sh bundle-v6c bundle-v6d bundle-before
