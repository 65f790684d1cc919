"""The client against an in-process Python gRPC server built from the same generated stubs: checks
the stubs and the client on whatever grpcio/protobuf/numpy/torch this Python has (no daemon needed;
this is the test run on the GPU hosts' Python 3.12, and where CUDA is visible, the CUDA tensor path
of the gRPC transport)."""
from concurrent import futures

import grpc
import numpy as np
import pytest

import verifyd
from verifyd._proto import pb, pb_grpc
from verifyd.tensors import bf16_to_float32, random_bf16


class FakeVerifyd(pb_grpc.VerifydServicer):
    """out[i, h, :] = q[i, h, :512] (so the client's reshaping is checked), lse = i + h."""

    def __init__(self):
        self.appends = []

    def Append(self, request, context):
        self.appends.append(request)
        if request.sequence_id == 13:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "sequence 13: expected 5, has 0")
        t = request.kv.shape[1]
        fill = (request.expected_fill if request.WhichOneof("expected_position") ==
                "expected_fill" else 0) + t
        return pb.AppendResponse(committed_length=fill, layer_fill=[fill] * request.kv.shape[0])

    def Verify(self, request, context):
        q = np.frombuffer(request.q.inline_data, np.uint16).reshape(tuple(request.q.shape))
        out = np.ascontiguousarray(q[:, :, :512])
        lse = np.add.outer(np.arange(q.shape[0]), np.arange(q.shape[1])).astype(np.float32)
        return pb.VerifyResponse(
            out=pb.Tensor(dtype=pb.DTYPE_BF16, shape=list(out.shape), inline_data=out.tobytes()),
            lse=pb.Tensor(dtype=pb.DTYPE_FP32, shape=list(lse.shape), inline_data=lse.tobytes()),
            committed_length=[7] * len(request.sequences))

    def Stats(self, request, context):
        return pb.StatsResponse(backend="fake", layers=3, heads=2,
                                fragmentation=pb.Fragmentation(sequences=1))


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    servicer = FakeVerifyd()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_VerifydServicer_to_server(servicer, server)
    handler = grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
        "Check": grpc.unary_unary_rpc_method_handler(
            lambda req, ctx: b"\x08\x01", request_deserializer=lambda b: b,
            response_serializer=lambda b: b)})
    server.add_generic_rpc_handlers((handler,))
    target = f"unix://{tmp_path_factory.mktemp('fake')}/fake.sock"
    server.add_insecure_port(target)
    server.start()
    yield target, servicer
    server.stop(0)


def test_calls_through_generated_stubs(fake):
    target, servicer = fake
    with verifyd.Client(target, max_message_bytes=16 << 10) as c:
        assert c.health() == "SERVING"
        assert c.stats().backend == "fake"
        rng = np.random.default_rng(0)
        r = c.append(1, random_bf16(rng, (2, 20, 576)))
        assert r.chunks == 4 and r.committed_length == 20
        assert [a.WhichOneof("expected_position") for a in servicer.appends[-4:]] == \
            ["create"] + ["expected_fill"] * 3
        with pytest.raises(verifyd.FailedPrecondition, match="expected 5, has 0") as info:
            c.append(13, random_bf16(rng, (1, 2, 576)), expected_fill=5)
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
        q, tkv = random_bf16(rng, (3, 2, 576)), random_bf16(rng, (3, 576))
        v = c.verify(0, [(1, [-1, 0, 0])], q, tkv, return_lse=True)
        assert np.array_equal(v.out, q[:, :, :512]) and v.lse[2, 1] == 3.0


def test_cli_json_on_this_protobuf(fake, capsys):
    from verifyd.__main__ import main
    assert main(["--target", fake[0], "-o", "json", "stats"]) == 0
    assert '"backend": "fake"' in capsys.readouterr().out


def test_ml_dtypes_bfloat16_when_present(fake):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(1)
    q = bf16_to_float32(random_bf16(rng, (2, 2, 576))).astype(ml_dtypes.bfloat16)
    tkv = np.ones((2, 576), dtype=ml_dtypes.bfloat16)
    with verifyd.Client(fake[0]) as c:
        v = c.verify(0, [(1, [-1, 0])], q, tkv)
    assert np.array_equal(v.out, q.view(np.uint16)[:, :, :512])


def test_torch_cuda_tensors_via_host(fake):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    q = torch.randn(4, 2, 576, device="cuda").to(torch.bfloat16)
    tkv = torch.randn(4, 576, device="cuda").to(torch.bfloat16)
    with verifyd.Client(fake[0]) as c:
        v = c.verify(0, [(1, [-1, 0, 1, 2])], q, tkv, return_lse=True)
    assert v.out.is_cuda and v.out.dtype == torch.bfloat16 and v.lse.is_cuda
    assert torch.equal(v.out, q[:, :, :512])
    from verifyd.adapter import VerifyAttention
    attn = VerifyAttention(verifyd.Client(fake[0]))
    attn.begin_step([(1, [-1, 0, 1, 2])])
    out = torch.empty(4, 2, 512, dtype=torch.bfloat16, device="cuda")
    attn.forward_verify(0, q, tkv, out)
    assert torch.equal(out, q[:, :, :512])
