"""The data plane with torch CUDA tensors and a cuda-backend daemon (stream order, errors, the
adapter in decode steps with a GEMM between layers): tools/device/python_dataplane_gpu.py's checks
under pytest. Skipped where there is no CUDA device (CI); the H200 runs the script directly
(tools/device/run_device.sh), since its Python has no pytest."""
import importlib.util
import os

import pytest

from conftest import REPO, daemon_binary

torch = pytest.importorskip("torch")
from verifyd import dataplane  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
if not dataplane.has_cuda():
    why = dataplane.why_unavailable() or "built without CUDA"
    pytest.skip(f"the data-plane library has no CUDA ({why})", allow_module_level=True)

_spec = importlib.util.spec_from_file_location(
    "python_dataplane_gpu", os.path.join(REPO, "tools", "device", "python_dataplane_gpu.py"))
gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu)


@pytest.fixture(scope="module")
def cuda_daemon():
    d = gpu.CudaDaemon(daemon_binary())
    yield d
    assert d.stop() == 0


@pytest.mark.parametrize("name", list(gpu.CHECKS))
def test_gpu_check(cuda_daemon, name):
    import zlib

    import numpy as np
    print(gpu.CHECKS[name](cuda_daemon.target, np.random.default_rng(zlib.crc32(name.encode()))))


@pytest.fixture(scope="module")
def cuda_fp8_daemon():
    d = gpu.CudaDaemon(daemon_binary(), extra=("--kv_dtype=fp8",))
    yield d
    assert d.stop() == 0


@pytest.mark.parametrize("name", list(gpu.FP8_CHECKS))
def test_gpu_fp8_check(cuda_fp8_daemon, name):
    import zlib

    import numpy as np
    print(gpu.FP8_CHECKS[name](cuda_fp8_daemon.target,
                               np.random.default_rng(zlib.crc32(name.encode()))))
