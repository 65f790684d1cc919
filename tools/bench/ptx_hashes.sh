#!/usr/bin/env bash
# Here (no GPU needed): the PTX of the shipped verify kernels, one hash per kernel entry and target,
# so a refactor can show that it left the device code byte-identical (plans/0004, issue 13 step 3).
# Usage: tools/bench/ptx_hashes.sh [SOURCE_ROOT] [OUT_DIR]   (default: this checkout, /tmp/ptx-<pid>)
# Compiles each kernel file with the product's flags less -lineinfo (paths and line numbers are not
# code) for compute_80, compute_90, compute_120 (portable kernels) and compute_90a (the Hopper
# kernel), cuts every .entry out of the PTX and hashes it with its mangled name replaced by the
# kernel's plain name (so are the names of its parameters and of the extern shared array), the
# function's index dropped from its branch labels and its linkage word dropped: a template argument list, a namespace (an anonymous one is named after the
# file's path) or an instantiation's linkage may change without changing one instruction. The file
# names keep the full demangled name, so the variants of one template stay apart.
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
out=${2:-/tmp/ptx-$$}
mkdir -p "$out"
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
flags=(-O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -I"$root")
compile() {  # file arch (kept when OUT_DIR already holds it: re-hashing costs no compile)
  [ -s "$out/$(basename "$1" .cu).$2.ptx" ] && return
  "$nvcc" "${flags[@]}" -ptx -arch="$2" "$root/kernels/$1" -o "$out/$(basename "$1" .cu).$2.ptx"
}
for arch in compute_80 compute_90 compute_120; do
  compile mla_verify_flash.cu "$arch" &
  compile mla_verify_combine.cu "$arch" &
  wait
done
compile mla_verify_flash_sm90.cu compute_90a
rm -f "$out"/*.entry
python3 - "$out" <<'PY'
import glob, os, re, subprocess, sys
out = sys.argv[1]
cache = {}
def plain(token):
    # A symbol's demangled name without its namespaces and template arguments; "_param_N" kept.
    m = re.fullmatch(r"(_Z\w+?)(_param_\d+)?", token)
    sym, suffix = m.group(1), m.group(2) or ""
    if sym not in cache:
        d = subprocess.run(["c++filt", sym], capture_output=True, text=True).stdout.strip()
        d = d.replace("(anonymous namespace)::", "")
        d = re.sub(r"^void ", "", d)
        depth, cut = 0, len(d)  # the name ends at the first "(" outside its template arguments
        for i, ch in enumerate(d):
            depth += {"<": 1, ">": -1}.get(ch, 0)
            if ch == "(" and depth == 0:
                cut = i
                break
        full = d[:cut]
        base = full.split("<")[0].split("::")[-1]
        cache[sym] = (base, re.sub(r"\W+", "_", full.replace("verifyd::", "")).strip("_"))
    return cache[sym][0] + suffix, cache[sym][1]
for ptx in sorted(glob.glob(os.path.join(out, "*.ptx"))):
    tag = os.path.basename(ptx)[:-4]
    lines = open(ptx).read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^(?:\.visible |\.weak )?\.entry (_Z\w+)\(", lines[i])
        if not m:
            i += 1
            continue
        full = plain(m.group(1))[1]
        body = []
        while True:
            line = re.sub(r"^(?:\.visible |\.weak )", "", lines[i])
            line = re.sub(r"_Z\w+", lambda t: plain(t.group(0))[0], line)
            # Branch labels carry the function's index in the file ($L__BB<function>_<block>).
            body.append(re.sub(r"\$L__BB\d+_", "$L__BB_", line))
            i += 1
            if lines[i - 1].startswith("}"):
                break
        open(os.path.join(out, f"{tag}.{full}.entry"), "w").write("\n".join(body) + "\n")
PY
cd "$out" && sha256sum -- *.entry | awk '{printf "%s  %s\n", substr($1, 1, 16), $2}'
