"""Builds the protobuf/gRPC stubs from ../proto at build time (protoc + grpc_python_plugin).

`pip install --no-build-isolation python/` from the repository root (pip builds in the source
tree, so ../proto is reachable). Everything else is in pyproject.toml.
"""
import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithStubs(build_py):
    def run(self):
        stubs = os.path.join(HERE, "verifyd", "v1", "verifyd_pb2.py")
        proto = os.path.join(HERE, "..", "proto", "verifyd", "v1", "verifyd.proto")
        if os.path.exists(proto) or not os.path.exists(stubs):
            subprocess.check_call(["bash", os.path.join(HERE, "build_stubs.sh"), HERE])
        super().run()


setup(cmdclass={"build_py": BuildWithStubs})
