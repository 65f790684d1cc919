#!/usr/bin/env bash
# Here (the build machine): the bundles tools/device/pending_gpu_checks.sh compares, for the work of
# session 24 that no device could check (plans/0031 change 2, plans/0034 v6c, the fp8 gate):
#   bundle/            this tree as it is (build it with the changes under test re-applied, e.g.
#                      `git revert --no-commit 5b33d4d` for plans/0031 change 2, and the fp8 gate
#                      lifted as plans/0030 says), then `tar czf bundle.tgz --exclude=bundle/pylib
#                      --exclude=bundle/wheel bundle`
#   bundle-v6b/        the kernel targets of experiment ab2ceee (v6c, plans/0034), built in a scratch worktree
#   bundle-before/     decode_step_bench of the commit BEFORE (default HEAD), for the A/B of the step
# carry ["bundle.tgz", "bundle-v6b", "bundle-before"] (all three together stay under 64 MiB).
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
build_at "${V6B:-ab2ceee}" bundle-v6b mla_verify_flash_test mla_verify_flash_fp8_test mla_verify_bench
build_at "${BEFORE:-HEAD}" bundle-before decode_step_bench
du -sh bundle-v6b bundle-before
