"""Builds the protobuf/gRPC stubs from ../proto at build time (protoc + grpc_python_plugin).

`pip install --no-build-isolation python/` from the repository root (pip builds in the source
tree, so ../proto is reachable). Everything else is in pyproject.toml.

python/build_wheel.sh builds from a copy that carries libverifyd_dataplane.so (and the libraries
it needs) in verifyd/: that wheel is tagged py3-none-<platform>, since the library is loaded with
ctypes and serves every CPython version.
"""
import os
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
CARRIES_LIBRARY = os.path.exists(os.path.join(HERE, "verifyd", "libverifyd_dataplane.so"))


class BuildWithStubs(build_py):
    def run(self):
        stubs = os.path.join(HERE, "verifyd", "v1", "verifyd_pb2.py")
        proto = os.path.join(HERE, "..", "proto", "verifyd", "v1", "verifyd.proto")
        if os.path.exists(proto) or not os.path.exists(stubs):
            subprocess.check_call(["bash", os.path.join(HERE, "build_stubs.sh"), HERE])
        super().run()


class CarriesLibrary(Distribution):
    """Installed into platlib like a package with extensions (the shared libraries)."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildWithStubs}
if CARRIES_LIBRARY:
    try:
        from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
    except ImportError:
        from wheel.bdist_wheel import bdist_wheel  # Debian 12: python3-wheel

    class PlatformWheel(bdist_wheel):
        """Platform-specific (it carries shared libraries), not Python-specific (no extension)."""

        def get_tag(self):
            return "py3", "none", super().get_tag()[2]

    cmdclass["bdist_wheel"] = PlatformWheel

setup(cmdclass=cmdclass, distclass=CarriesLibrary if CARRIES_LIBRARY else Distribution)
