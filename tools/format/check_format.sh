#!/usr/bin/env bash
# Fails (exit 1) and names each C++/CUDA file that clang-format would change, against the
# repository's .clang-format. Usage: check_format.sh [ROOT] [FILE...]
#   ROOT  a checkout (default: this one); its tracked *.cc, *.h, *.cu, *.cuh are checked unless
#         FILEs (paths relative to ROOT) are given.
# The test command runs it (ctest `format`), so the tree stays formatted once it was formatted.
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
shift || true
fmt=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
if [ -z "$fmt" ]; then
  echo "check_format: clang-format not found (deploy/install_deps.sh installs it)" >&2
  exit 2
fi
cd "$root"
if (($#)); then
  files=("$@")
else
  mapfile -t files < <(git ls-files -- '*.cc' '*.h' '*.cu' '*.cuh')
fi
bad=0
for f in "${files[@]}"; do
  if ! "$fmt" --style=file "$f" | cmp -s - "$f"; then
    echo "not formatted: $f (run: $fmt -i $f)"
    bad=1
  fi
done
if ((bad)); then exit 1; fi
echo "check_format: ${#files[@]} files formatted"
