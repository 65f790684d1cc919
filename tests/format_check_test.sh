#!/usr/bin/env bash
# The format check can fail: a copy of .clang-format beside one well-formatted and one planted,
# misformatted file must fail and name the planted file only; the well-formatted one alone passes.
set -euo pipefail
src=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$src/.clang-format" "$dir/"
printf 'int Good(int x) { return x + 1; }\n' >"$dir/good.cc"
printf 'int   Bad( int x ){return x+1;}\n' >"$dir/bad.cc"
"$src/tools/format/check_format.sh" "$dir" good.cc
if out=$("$src/tools/format/check_format.sh" "$dir" good.cc bad.cc); then
  echo "FAIL: the planted misformatted file passed"
  exit 1
fi
grep -q "not formatted: bad.cc" <<<"$out" || { echo "FAIL: bad.cc not named: $out"; exit 1; }
if grep -q "good.cc" <<<"$out"; then echo "FAIL: good.cc named: $out"; exit 1; fi
echo "PASS: planted file caught"
