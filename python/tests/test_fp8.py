"""The fp8 store (--kv_dtype=fp8, plans/0030-fp8-store.md) from Python: verifyd.fp8's helper makes
the daemon's bytes exactly (checked against the daemon's own quantizer, tests/python's
fp8_quantize_tool, byte for byte), an fp8 daemon serves the helper's rows and its own quantization
of bf16 rows identically, bad fp8 rows are refused naming the element, a bf16 daemon refuses fp8
rows, and stats report the dtype."""
import os
import subprocess

import numpy as np
import pytest

import verifyd
from verifyd.cli_render import format_stats
from verifyd.fp8 import FP8_ROW_BYTES, dequantize_fp8_rows, e4m3_to_float, float_to_e4m3, \
    quantize_fp8_rows
from verifyd.tensors import float32_to_bf16, random_bf16

from conftest import HEADS, LAYERS, Daemon


def edge_rows(rng, n):
    """bf16 rows [n, 576] whose groups are random, zero, on the e4m3 grid or its ties (scale a
    power of two), bf16 subnormals, or one large value over tiny ones (e4m3 subnormals)."""
    rows = np.zeros((n, 576), dtype=np.uint16)
    grid = e4m3_to_float(np.arange(0x7F, dtype=np.uint8))
    for r in range(n):
        for g in range(4):
            kind = rng.integers(0, 6)
            sl = slice(128 * g, 128 * g + 128)
            if kind == 0:
                rows[r, sl] = rng.choice([0x0000, 0x8000], size=128)
            elif kind == 1:
                k = rng.integers(0, 126, size=128)
                mid = (grid[k] + grid[k + 1]) / 2
                v = np.where(rng.integers(0, 2, size=128) == 1, -mid, mid) * np.float32(2.0 ** -8)
                v[3] = 448.0 * 2.0 ** -8
                rows[r, sl] = float32_to_bf16(v.astype(np.float32))
            elif kind == 2:
                rows[r, sl] = (rng.integers(0, 0x100, size=128) |
                               (rng.integers(0, 2, size=128) << 15)).astype(np.uint16)
            elif kind == 3:
                v = rng.uniform(-1, 1, size=128).astype(np.float32) * np.float32(2.0 ** -16)
                v[5] = 1.0
                rows[r, sl] = float32_to_bf16(v * np.float32(2.0 ** int(rng.integers(-10, 14))))
            else:
                rows[r, sl] = random_bf16(rng, (128,), float(2.0 ** int(rng.integers(-12, 15))))
        rows[r, 512:] = random_bf16(rng, (64,), 10.0)
    return rows


def daemon_quantize(rows):
    tool = os.environ.get("VERIFYD_FP8_QUANTIZE_TOOL")
    if not tool or not os.access(tool, os.X_OK):
        pytest.fail("VERIFYD_FP8_QUANTIZE_TOOL is not set to the built fp8_quantize_tool (ctest "
                    "python.pytest sets it)", pytrace=False)
    done = subprocess.run([tool], input=rows.astype("<u2").tobytes(), capture_output=True,
                          check=True)
    return np.frombuffer(done.stdout, dtype=np.uint8).reshape(len(rows), FP8_ROW_BYTES)


def test_helper_equals_the_daemons_quantization_byte_for_byte(rng):
    rows = edge_rows(rng, 3000)
    want = daemon_quantize(rows)
    got = quantize_fp8_rows(rows)
    assert got.dtype == np.uint8 and got.shape == (3000, FP8_ROW_BYTES)
    bad = np.argwhere(got != want)
    assert len(bad) == 0, f"{len(bad)} bytes differ, first (row, byte) {bad[:5].tolist()}"
    # The edge kinds happened: zero groups (scale 1), e4m3 subnormal and saturated codes.
    scales = got[:, 512:528].copy().view("<f4")
    assert (scales == 1.0).sum() > 100
    codes = got[:, :512]
    assert (((codes & 0x78) == 0) & ((codes & 7) != 0)).sum() > 100
    assert ((codes & 0x7F) == 0x7E).sum() > 1000


def test_rounding_ties_go_to_even_and_dequantize_is_the_product():
    assert float_to_e4m3(np.float32([8.5, 9.5, -0.0, 1000.0, 2.0 ** -10]).astype(np.float32)) \
        .tolist() == [0x50, 0x52, 0x80, 0x7E, 0x00]
    rows = quantize_fp8_rows(float32_to_bf16(np.linspace(-3, 3, 576, dtype=np.float32)))
    values = dequantize_fp8_rows(rows)
    scale = rows[512:528].copy().view("<f4")
    exact = e4m3_to_float(rows[:512]).astype(np.float64).reshape(4, 128) * \
        scale.astype(np.float64)[:, None]
    assert np.array_equal(values[:512], exact.reshape(-1).astype(np.float32))


@pytest.fixture(scope="module")
def fp8_daemon():
    d = Daemon("fp8", ["--kv_dtype=fp8"])
    yield d
    d.stop()
    assert d.proc.returncode == 0, f"verifyd exited {d.proc.returncode}: {d.log()}"


def test_an_fp8_daemon_serves_the_helpers_rows_as_its_own(fp8_daemon, rng, seq_ids):
    with fp8_daemon.client() as c:
        s = c.stats()
        assert (s.kv_dtype, s.kv_bytes_per_token) == ("fp8", 656)
        assert s.kv_pool_bytes == s.capacity_tokens * LAYERS * 656
        text = format_stats(s)
        assert "kv dtype" in text and "fp8" in text
        kv = random_bf16(rng, (LAYERS, 200, 576), 3.0)
        a, b = next(seq_ids), next(seq_ids)
        c.append(a, kv)                      # bf16: the daemon quantizes
        c.append(b, quantize_fp8_rows(kv))   # uint8 [L, T, 656]: sent as DTYPE_FP8_MLA
        parents = [-1, 0, 1, 1, -1]
        q = random_bf16(rng, (5, HEADS, 576), 0.3)
        tkv = random_bf16(rng, (5, 576), 3.0)
        for layer in range(LAYERS):
            va = c.verify(layer, [(a, parents)], q, tkv, return_lse=True)
            vb = c.verify(layer, [(b, parents)], q, tkv, return_lse=True)
            assert np.array_equal(va.out, vb.out)
            assert np.array_equal(va.lse, vb.lse)
        c.release(a)
        c.release(b)


def test_torch_uint8_rows_are_sent_as_fp8_rows(fp8_daemon, rng, seq_ids):
    """An engine's fp8 cache as a torch uint8 tensor goes as it is: the same bytes as numpy's."""
    torch = pytest.importorskip("torch")
    with fp8_daemon.client() as c:
        kv = random_bf16(rng, (LAYERS, 70, 576), 2.0)
        rows = quantize_fp8_rows(kv)
        a, b = next(seq_ids), next(seq_ids)
        c.append(a, rows)
        c.append(b, torch.from_numpy(rows.copy())[:, :, :])
        parents = [-1, 0, 0]
        q = random_bf16(rng, (3, HEADS, 576), 0.3)
        tkv = random_bf16(rng, (3, 576), 2.0)
        for layer in range(LAYERS):
            va = c.verify(layer, [(a, parents)], q, tkv, return_lse=True)
            vb = c.verify(layer, [(b, parents)], q, tkv, return_lse=True)
            assert np.array_equal(va.out, vb.out)
            assert np.array_equal(va.lse, vb.lse)
        # A torch uint8 tensor of the wrong row size is refused naming the shape, nothing kept.
        used = c.stats().used_tokens
        with pytest.raises(verifyd.InvalidArgument, match="656"):
            c.append(next(seq_ids), torch.zeros((LAYERS, 2, 600), dtype=torch.uint8))
        assert c.stats().used_tokens == used
        c.release(a)
        c.release(b)


def test_bad_fp8_rows_are_refused_naming_the_element(fp8_daemon, rng, seq_ids):
    with fp8_daemon.client() as c:
        used = c.stats().used_tokens
        rows = quantize_fp8_rows(random_bf16(rng, (LAYERS, 3, 576)))
        rows[1, 2, 40] = 0x7F
        sid = next(seq_ids)
        with pytest.raises(verifyd.InvalidArgument, match=r"kv\[1, 2\] byte 40 .* NaN encoding"):
            c.append(sid, rows)
        rows = quantize_fp8_rows(random_bf16(rng, (LAYERS, 3, 576)))
        rows[0, 1, 512:516] = np.frombuffer(np.float32(-2.0).tobytes(), dtype=np.uint8)
        with pytest.raises(verifyd.InvalidArgument, match=r"kv\[0, 1\] group 0 scale"):
            c.append(sid, rows)
        assert c.stats().used_tokens == used


def test_a_bf16_daemon_refuses_fp8_rows(client, rng, seq_ids):
    rows = quantize_fp8_rows(random_bf16(rng, (LAYERS, 2, 576)))
    with pytest.raises(verifyd.InvalidArgument, match="DTYPE_FP8_MLA"):
        client.append(next(seq_ids), rows)
    assert client.stats().kv_dtype == "bf16"


def _data_plane(c):
    from verifyd import dataplane
    if not dataplane.available():
        pytest.fail(f"the data-plane library must be built for these tests: "
                    f"{dataplane.why_unavailable()}", pytrace=False)
    return c.data_plane()


def _same_attention(c, a, b, rng, n=4):
    parents = [-1, 0, 0, 2][:n]
    q = random_bf16(rng, (n, HEADS, 576), 0.3)
    tkv = random_bf16(rng, (n, 576), 2.0)
    for layer in range(LAYERS):
        va = c.verify(layer, [(a, parents)], q, tkv, return_lse=True)
        vb = c.verify(layer, [(b, parents)], q, tkv, return_lse=True)
        assert np.array_equal(va.out, vb.out), f"layer {layer}"
        assert np.array_equal(va.lse, vb.lse), f"layer {layer}"
    c.commit(a, [])  # the trees verified above are rejected: both sequences take Appends again
    c.commit(b, [])


def test_append_registered_takes_fp8_rows_where_they_lie(fp8_daemon, rng, seq_ids):
    """Rows already in the fp8 layout inside registered memory (a host buffer here; a CUDA
    tensor's allocation on the cuda backend) go by region and offset, one message: the store holds
    what an inline Append of the same bytes holds (the same attention, bit for bit), a bad row is
    named as for inline rows and nothing is kept, and a later Append extends at the fill."""
    with fp8_daemon.client() as c:
        plane = _data_plane(c)
        buf = plane.host_buffer(4 << 20)
        kv = random_bf16(rng, (LAYERS, 300, 576), 3.0)
        rows = quantize_fp8_rows(kv)
        placed = buf.take(rows.shape, "uint8")
        placed[...] = rows
        a, b = next(seq_ids), next(seq_ids)
        c.append(a, rows)
        r = c.append_registered(b, placed)
        assert (r.committed_length, r.chunks) == (300, 1)
        _same_attention(c, a, b, rng)
        # More tokens at the fill, one layer's [T, 656] form included.
        more = quantize_fp8_rows(random_bf16(rng, (LAYERS, 20, 576), 3.0))
        extra = buf.take(more.shape, "uint8")
        extra[...] = more
        c.append(a, more, expected_fill=300)
        assert c.append_registered(b, extra, expected_fill=300).committed_length == 320
        one = buf.take((5, FP8_ROW_BYTES), "uint8")
        one[...] = quantize_fp8_rows(random_bf16(rng, (5, 576), 1.0))
        assert c.append_registered(b, one, layer_begin=0, expected_fill=320).layer_fill[:2] == \
            [325, 320]
        c.append(a, one.copy(), layer_begin=0, expected_fill=320)
        # A bad row: the same message as inline, nothing kept.
        used = c.stats().used_tokens
        bad = buf.take((LAYERS, 3, FP8_ROW_BYTES), "uint8")
        bad[...] = quantize_fp8_rows(random_bf16(rng, (LAYERS, 3, 576)))
        bad[1, 2, 40] = 0x7F
        with pytest.raises(verifyd.InvalidArgument, match=r"kv\[1, 2\] byte 40 .* NaN encoding"):
            c.append_registered(next(seq_ids), bad)
        assert c.stats().used_tokens == used
        c.release(a)
        c.release(b)


def test_append_registered_bf16_and_its_refusals(client, rng, seq_ids):
    """bf16 rows from registered memory equal the same rows inline; memory this client did not
    register, a wrong row width or dtype, and a bf16 daemon given fp8 rows are refused naming the
    field, nothing kept."""
    plane = _data_plane(client)
    buf = plane.host_buffer(2 << 20)
    kv = random_bf16(rng, (LAYERS, 100, 576), 2.0)
    placed = buf.take(kv.shape)
    placed[...] = kv
    a, b = next(seq_ids), next(seq_ids)
    client.append(a, kv)
    assert client.append_registered(b, placed).committed_length == 100
    _same_attention(client, a, b, rng)
    used = client.stats().used_tokens
    with pytest.raises(verifyd.InvalidArgument, match="not inside a buffer registered"):
        client.append_registered(next(seq_ids), kv.copy())
    with pytest.raises(verifyd.InvalidArgument, match=r"\[layer_count, T, 576\]"):
        client.append_registered(next(seq_ids), buf.take((LAYERS, 4, 512)))
    with pytest.raises(verifyd.InvalidArgument, match="must be bf16"):
        client.append_registered(next(seq_ids), buf.take((LAYERS, 4, 576), "float32"))
    fp8 = buf.take((LAYERS, 2, FP8_ROW_BYTES), "uint8")
    fp8[...] = quantize_fp8_rows(random_bf16(rng, (LAYERS, 2, 576)))
    with pytest.raises(verifyd.InvalidArgument, match="DTYPE_FP8_MLA|fp8"):
        client.append_registered(next(seq_ids), fp8)
    assert client.stats().used_tokens == used
    client.release(a)
    client.release(b)
