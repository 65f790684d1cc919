"""Pieces that need no daemon: chunking, health codec, layout, reference, data-plane loader."""
import grpc
import numpy as np
import pytest

import verifyd
from verifyd import dataplane, dataplane_library, health
from verifyd.adapter import VerifyAttention
from verifyd.reference import ancestor_mask, verify_reference
from verifyd.tensors import bf16_to_float32, random_bf16


def test_split_append_matches_the_cpp_rule():
    kv = np.ones((2, 300, 576), np.uint16)
    assert verifyd.split_append(kv, 64 << 20) == [(0, 300)]
    ranges = verifyd.split_append(kv, 64 << 10)  # (65536 - 1024) // 2304 = 28 tokens a chunk
    assert ranges[0] == (0, 28) and ranges[-1] == (280, 300) and len(ranges) == 11
    assert all(b - a == 28 for a, b in ranges[:-1])
    with pytest.raises(verifyd.InvalidArgument, match="exceeds max_message_bytes = 4096"):
        verifyd.split_append(np.ones((61, 5, 576), np.uint16), 4096)


def test_health_codec():
    assert health.encode_request("") == b""
    assert health.encode_request("verifyd.v1.Verifyd") == b"\x0a\x12verifyd.v1.Verifyd"
    assert health.decode_response(b"\x08\x01") == "SERVING"
    assert health.decode_response(b"\x08\x02") == "NOT_SERVING"
    assert health.decode_response(b"") == "UNKNOWN"
    assert health.decode_response(b"\x12\x01x\x08\x03") == "SERVICE_UNKNOWN"


def test_shared_verify_layout_matches_cpp():
    # SharedVerifyLayoutAt(0, 16, 8, true) in client/shared_calls.cc: q 147456 B, tree_kv
    # 18432 B, out 131072 B, lse 512 B, each start a multiple of 64.
    l = verifyd.shared_verify_layout(0, 16, 8, True)
    assert (l.q, l.tree_kv, l.out, l.lse, l.end) == (0, 147456, 165888, 296960, 297472)
    assert verifyd.shared_verify_bytes(16, 8, False) == 296960
    l = verifyd.shared_verify_layout(1, 3, 1, False)
    assert l.q == 64 and l.tree_kv % 64 == 0 and l.out % 64 == 0


def test_reference_visibility_and_masking():
    assert ancestor_mask([-1, 0, 0, 1, -1]).tolist() == [
        [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [0, 0, 0, 0, 1]]
    with pytest.raises(ValueError):
        ancestor_mask([-1, 1])
    rng = np.random.default_rng(3)
    prefix, tree = random_bf16(rng, (5, 576)), random_bf16(rng, (3, 576))
    q = random_bf16(rng, (3, 2, 576))
    o, lse = verify_reference(prefix, tree, q, [-1, 0, -1], 0.1)
    # Node 2 (a second root) sees the prefix and itself only: recompute by hand.
    c = np.concatenate([bf16_to_float32(prefix), bf16_to_float32(tree[2:3])]).astype(np.float64)
    s = 0.1 * c @ bf16_to_float32(q[2, 1]).astype(np.float64)
    p = np.exp(s - s.max())
    assert np.allclose(o[2, 1], (p / p.sum()) @ c[:, :512])
    assert np.isclose(lse[2, 1], s.max() + np.log(p.sum()))
    assert (random_bf16(rng, (1000,)) & 0x7FFF).min() > 0  # never a zero


def test_error_types():
    e = verifyd.errors.make_error(grpc.StatusCode.NOT_FOUND, "gone", "Commit")
    assert isinstance(e, verifyd.NotFound) and isinstance(e, verifyd.VerifydError)
    assert str(e) == "Commit: gone (NOT_FOUND)" and e.code == grpc.StatusCode.NOT_FOUND
    other = verifyd.errors.make_error(grpc.StatusCode.INTERNAL, "x")
    assert type(other) is verifyd.VerifydError


def test_data_plane_is_reported_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv(dataplane.ENV_LIBRARY, str(tmp_path / "missing.so"))
    monkeypatch.setattr(dataplane_library, "_lib", None)
    monkeypatch.setattr(dataplane_library, "_why", None)
    assert not dataplane.available()
    why = dataplane.why_unavailable()
    assert "missing.so: no such file" in why and dataplane.ENV_LIBRARY in why
    with pytest.raises(dataplane.DataPlaneUnavailable):
        dataplane.load()
    with verifyd.Client("unix:///nonexistent/verifyd.sock") as c:
        with pytest.raises(NotImplementedError, match="missing.so"):
            VerifyAttention(c, transport="device")


def test_device_pointer_of_cuda_array_interface():
    class Fake:
        __cuda_array_interface__ = {"shape": (4, 8), "typestr": "<u2", "data": (1234, False),
                                    "version": 2}
    assert dataplane.device_pointer(Fake()) == (1234, 64, -1)
    with pytest.raises(verifyd.InvalidArgument, match="__cuda_array_interface__"):
        dataplane.device_pointer(object())

    class Strided:
        __cuda_array_interface__ = {"shape": (4, 8), "typestr": "<u2", "data": (1234, False),
                                    "strides": (32, 2), "version": 2}
    with pytest.raises(verifyd.InvalidArgument, match="not C-contiguous"):
        dataplane.device_pointer(Strided())


def test_package_modules_import_without_a_cycle():
    # Each module's imports of its siblings, at module level or inside functions (where an import
    # cycle would hide), less those for type checkers only: the graph must have no cycle.
    import ast
    import pathlib
    package = pathlib.Path(verifyd.__file__).parent
    graph = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        typing_only = {id(m) for n in ast.walk(tree) if isinstance(n, ast.If)
                       and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"
                       for m in ast.walk(n)}
        graph[path.stem] = {n.module.split(".")[0] for n in ast.walk(tree)
                            if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module
                            and id(n) not in typing_only}
    state = {}

    def visit(name, trail):
        if state.get(name) == "done":
            return
        assert state.get(name) != "open", f"import cycle: {' -> '.join(trail + [name])}"
        state[name] = "open"
        for dep in sorted(graph.get(name, ())):
            visit(dep, trail + [name])
        state[name] = "done"

    for name in sorted(graph):
        visit(name, [])
