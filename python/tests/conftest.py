"""Fixtures: a CPU verifyd daemon on a Unix socket in a temp dir, started once per session.

The daemon binary: $VERIFYD_BINARY (the ctest entry passes the built target), else
<repo>/build/service/verifyd. A missing binary is an error, not a skip: a run that tests nothing
must not pass.
"""
from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the package from the checkout (stubs: build_stubs.sh)

import verifyd  # noqa: E402

REPO = HERE.parents[1]
LAYERS, HEADS, MAX_TREE_NODES = 2, 2, 64
DAEMON_MESSAGE_BYTES = 1 << 20


def daemon_binary() -> str:
    path = os.environ.get("VERIFYD_BINARY") or str(REPO / "build" / "service" / "verifyd")
    if not os.access(path, os.X_OK):
        pytest.fail(f"verifyd binary not found at {path}: build it (cmake --build build --target "
                    "verifyd) or set VERIFYD_BINARY", pytrace=False)
    return path


class Daemon:
    def __init__(self, name: str, extra_flags=(), layers=LAYERS, heads=HEADS):
        self.dir = tempfile.mkdtemp(prefix=f"verifyd-py-{name}-")
        self.target = f"unix://{self.dir}/verifyd.sock"
        self.log_path = os.path.join(self.dir, "daemon.log")
        self.layers, self.heads = layers, heads
        flags = [f"--listen={self.target}", "--metrics=", "--backend=cpu", f"--layers={layers}",
                 f"--heads={heads}", f"--max_tree_nodes={MAX_TREE_NODES}",
                 "--kv_capacity_tokens=16384", f"--max_message_bytes={DAEMON_MESSAGE_BYTES}",
                 "--shm_max_region_bytes=8388608", "--shm_max_bytes=67108864",
                 "--compute_threads=2", "--drain_seconds=2", *extra_flags]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([daemon_binary(), *flags], stdout=self._log,
                                     stderr=subprocess.STDOUT)
        try:
            with verifyd.Client(self.target) as c:
                c.wait_until_serving(timeout=30)
        except Exception:
            self.stop()
            raise RuntimeError(f"verifyd did not start: {self.log()}")

    def client(self, **options) -> verifyd.Client:
        return verifyd.Client(self.target, **options)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.close()
        if self.proc.returncode == 0:
            shutil.rmtree(self.dir, ignore_errors=True)  # kept (with its log) when it failed


@pytest.fixture(scope="session")
def daemon():
    d = Daemon("main")
    yield d
    d.stop()
    assert d.proc.returncode == 0, f"verifyd exited {d.proc.returncode}: {d.log()}"


@pytest.fixture(scope="session")
def daemon_rank1():
    """A second daemon: rank 1 of a tensor-parallel group."""
    d = Daemon("rank1")
    yield d
    d.stop()


@pytest.fixture(scope="session")
def short_lease_daemon():
    """Sequences expire after 0.5 s untouched."""
    d = Daemon("lease", ["--lease_seconds=0.5"])
    yield d
    d.stop()


@pytest.fixture
def client(daemon):
    with daemon.client() as c:
        yield c


_ids = itertools.count(1)


@pytest.fixture
def seq_ids():
    """Fresh sequence ids for one test: next(seq_ids)."""
    return (100000 * os.getpid() % (1 << 40) + i for i in _ids)


@pytest.fixture
def rng(request):
    import zlib

    import numpy as np
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))  # same every run
