#!/usr/bin/env python3
"""The verifyd package this interpreter imports is an installed wheel: imported from outside the
checkout, its data-plane library the one beside it, and that library loads every library it links
from beside itself (checked in a child interpreter started with -S, where nothing else has loaded
gRPC, protobuf or abseil yet). Prints one line per check; exit 1 on the first failure. Run by
tests/python/wheel_test.sh (CI) and tools/device/wheel_gpu.sh (the GPU host's Python).

    python installed_wheel_check.py --repo REPOSITORY [--cuda]
"""
import argparse
import os
import subprocess
import sys

CHILD = r"""
import ctypes, os, re, sys
where = os.path.dirname(sys.argv[1])
ctypes.CDLL(sys.argv[1])
mapped = set(re.findall(r"\s(/\S+\.so[.\d]*)\n", open("/proc/self/maps").read()))
ours = [p for p in mapped
        if re.search(r"/lib(grpc|gpr|absl|protobuf|upb|re2|cares|address_sorting|verifyd)", p)]
print(len(ours), " ".join(sorted(p for p in ours if os.path.dirname(p) != where)))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", required=True, help="the checkout, which must not be imported")
    p.add_argument("--cuda", action="store_true", help="the library must be a CUDA build")
    args = p.parse_args()
    for var in ("PYTHONPATH", "VERIFYD_DATAPLANE_LIB"):
        if os.environ.get(var):
            print(f"FAIL ${var} is set: the check needs the package as installed")
            return 1
    import verifyd
    from verifyd import dataplane
    here = os.path.dirname(os.path.abspath(verifyd.__file__))
    if here.startswith(os.path.abspath(args.repo) + os.sep):
        print(f"FAIL verifyd imported from the checkout: {here}")
        return 1
    print(f"ok verifyd {verifyd.__version__} from {here} (python {sys.version.split()[0]})")
    lib = os.path.join(here, dataplane.LIBRARY_NAME)
    loaded = dataplane.load(raise_if_missing=False)
    if loaded is None or loaded._name != lib:
        print(f"FAIL the data plane is not the wheel's {lib}: "
              f"{loaded._name if loaded else dataplane.why_unavailable()}")
        return 1
    print(f"ok data plane {lib}, cuda = {dataplane.has_cuda()}")
    if args.cuda and not dataplane.has_cuda():
        print("FAIL the wheel's library was built without CUDA")
        return 1
    r = subprocess.run([sys.executable, "-S", "-c", CHILD, lib], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"})
    count, _, outside = r.stdout.strip().partition(" ")
    if r.returncode != 0 or outside or int(count or 0) < 5:
        print(f"FAIL the library's own libraries: {r.stdout.strip()} {r.stderr.strip()}")
        return 1
    print(f"ok {count} libraries mapped, all from {here}")
    import verifyd.mla, verifyd.tools.tree_decode  # noqa: F401,E401 - what engines import
    return 0


if __name__ == "__main__":
    sys.exit(main())
