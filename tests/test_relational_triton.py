"""The triton relational backend: its dispatch on this machine, and its outputs and gradients
against the float64 naive reference under the Triton interpreter (CPU, no GPU needed).

A Triton kernel runs interpreted or compiled as TRITON_INTERPRET said when triton decorated it,
at import. So the numerical cases run in one child process started with TRITON_INTERPRET=1 (this
file run as a script); this process and the other test modules never see the variable.
Tolerances are the testing kit's, as for every backend: float32 against float64 naive, atol
1e-5 / rtol 1e-4 on outputs and atol 5e-5 / rtol 1e-4 on the gradients of q, k, qr, kr and v,
with no NaN or inf anywhere; float16: atol 1e-2 / rtol 5e-3. The interpreter's bfloat16 dot
multiplies raw bit patterns (triton 3.9), so bfloat16 is not checked here.
"""

import functools
import importlib.util
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

import attn_zoo as az
from attn_zoo.kernels import UnsupportedCallError
from attn_zoo.kernels.dispatch import Call, family
from attn_zoo.kernels.relational import relational_attention
from attn_zoo.kernels.relational.triton import triton_relational
from attn_zoo.testing import (
    MASK_KINDS,
    RelationalProblem,
    assert_backends_agree,
    relational_problems,
)

BOOLEAN_MASKS = tuple(kind for kind in MASK_KINDS if kind != "additive")

ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
WIDE = dict(key_dim=16, rel_dim=16, head_dim=16)

# Each case exercises the tiles (BLOCK=16: 33 positions make three tiles, a partial one last),
# padding (widths, heads and relations that are not powers of two) and the features declared.
CASES = {
    "one_position": RelationalProblem(q_len=1, k_len=1, **WIDE),
    "causal_batch2": RelationalProblem(batch=2, q_len=7, k_len=7, is_causal=True, **WIDE),
    "causal_three_tiles": RelationalProblem(q_len=33, k_len=33, is_causal=True, **WIDE, seed=1),
    "gelu_gqa_odd_widths": RelationalProblem(
        heads=3,
        kv_heads=1,
        n_relations=3,
        q_len=16,
        k_len=33,
        key_dim=5,
        rel_dim=7,
        head_dim=3,
        rel_activation="gelu",
        seed=2,
    ),
    "tanh_gqa_empty_rows": RelationalProblem(
        kv_heads=1, q_len=7, k_len=16, mask="empty_rows", rel_activation="tanh", seed=3
    ),
    "relu_causal_key_padding": RelationalProblem(
        batch=2,
        q_len=20,
        k_len=33,
        mask="key_padding",
        is_causal=True,
        rel_activation="relu",
        seed=4,
    ),
    "softmax_causal": RelationalProblem(
        q_len=33, k_len=33, is_causal=True, rel_activation="softmax", seed=5
    ),
    "softmax_random_mask": RelationalProblem(
        q_len=7, k_len=18, mask="random", rel_activation="softmax", seed=6
    ),
    "sigmoid_scales": RelationalProblem(
        q_len=7, k_len=9, rel_activation="sigmoid", scale=0.7, rel_scale=1.6, seed=7
    ),
    "silu": RelationalProblem(q_len=17, k_len=7, rel_activation="silu", seed=8),
    "float16_causal": RelationalProblem(
        q_len=33, k_len=20, is_causal=True, dtype=torch.float16, **WIDE, seed=9
    ),
}


def agrees(problem: RelationalProblem) -> None:
    kernels = {"triton": triton_relational}
    assert_backends_agree(problem, "relational", backends=[], kernels=kernels)


@settings(max_examples=25, derandomize=True, database=None, deadline=None)
@given(relational_problems(relative=(False,), max_len=40, masks=BOOLEAN_MASKS))
def agrees_on_drawn_problems(problem):
    """Widths 1-8, 1-3 relations, drawn scales, every boolean mask kind (the kernel declares
    no float masks), causal alignment and activation."""
    agrees(problem)


def triton_inputs(requires_grad=True):
    """A small softmax-activation, masked, causal GQA call: every input the ops take."""
    problem = RelationalProblem(
        heads=2, kv_heads=1, q_len=9, k_len=9, mask="key_padding", is_causal=True,
        rel_activation="softmax", seed=11,
    )  # fmt: skip
    x = problem.inputs()
    tensors = {n: x[n].detach().requires_grad_(requires_grad) for n in ("q", "k", "v", "qr", "kr")}
    mask = x["attn_mask"].reshape((1,) * (4 - x["attn_mask"].dim()) + x["attn_mask"].shape)
    return tensors, mask


def passes_opcheck():
    """torch.library.opcheck of both custom ops (schema, fake kernels against the kernels'
    outputs, autograd registration, dynamic-shape tracing), run by the interpreter."""
    from attn_zoo.kernels.relational.triton import _backward_op, _forward_op

    x, mask = triton_inputs()
    args = (*x.values(), mask, True, 0.5, 0.5, "softmax", 16)
    torch.library.opcheck(_forward_op, args)
    out, lse, rlse = _forward_op(*(t.detach() for t in x.values()), *args[5:])
    hd = x["v"].shape[-1]
    do_sym, do_rel = torch.randn_like(out[..., :hd]), torch.randn_like(out[..., hd:])
    delta = (do_sym * out[..., :hd]).sum(-1) + (do_rel * out[..., hd:]).sum(-1)
    row_term = (do_rel * out[..., hd:]).sum(1).transpose(1, 2).contiguous()
    plain = tuple(t.detach() for t in x.values())
    tensors = (*plain, mask, do_sym, do_rel, lse, delta, rlse, row_term)
    torch.library.opcheck(_backward_op, (*tensors, *args[6:]))


def compiles_fullgraph():
    """triton_relational under torch.compile(fullgraph=True) (interpreted kernels on CPU): one
    graph, the same outputs and gradients as eager."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def attend(q, k, v, qr, kr, mask):
        return triton_relational(q, k, qr, kr, v=v, attn_mask=mask, is_causal=True,
                                 rel_activation="softmax")  # fmt: skip

    x, mask = triton_inputs()
    out = attend(*x.values(), mask)
    grads = torch.autograd.grad(out.sum(), list(x.values()))
    counter = CompileCounterWithBackend("aot_eager_decomp_partition")
    compiled = torch.compile(attend, fullgraph=True, backend=counter)
    c_out = compiled(*x.values(), mask)
    c_grads = torch.autograd.grad(c_out.sum(), list(x.values()))
    assert counter.frame_count == 1
    torch.testing.assert_close(c_out, out, atol=1e-5, rtol=1e-4)
    for c_grad, grad in zip(c_grads, grads, strict=True):
        torch.testing.assert_close(c_grad, grad, atol=5e-5, rtol=1e-4)


CHECKS = {name: functools.partial(agrees, problem) for name, problem in CASES.items()}
CHECKS["drawn_problems"] = agrees_on_drawn_problems
CHECKS["opcheck"] = passes_opcheck
CHECKS["compiled_fullgraph"] = compiles_fullgraph


def run_check(name: str) -> str:
    """'ok', or why the check failed (in the interpreter child)."""
    try:
        CHECKS[name]()
    except Exception:  # reported by the parent test of this check
        return traceback.format_exc()
    return "ok"


@pytest.fixture(scope="module")
def interpreted():
    """{case: 'ok' or the failure}, from one child process under TRITON_INTERPRET=1."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    child = subprocess.run(
        [sys.executable, __file__], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, f"interpreter child failed:\n{child.stdout}\n{child.stderr}"
    return json.loads(child.stdout.strip().splitlines()[-1])


@needs_triton
@pytest.mark.slow  # one child process interprets every case (about 45 s): `make test-slow`
@pytest.mark.parametrize("check", list(CHECKS))
def test_interpreted_kernel_agrees_with_naive(interpreted, check):
    assert interpreted["_interpreted"] == "yes", "the child did not run the Triton interpreter"
    if interpreted[check] != "ok":
        pytest.fail(f"{check}:\n{interpreted[check]}", pytrace=False)


def test_registered_but_cuda_only_with_its_reason():
    assert "triton" in az.list_backends("relational")
    ok, reason = az.backend_status("relational", "triton", device="cpu")
    assert not ok and "Triton kernels need a CUDA GPU" in reason
    x = RelationalProblem().inputs()
    with pytest.raises(UnsupportedCallError, match="'triton'.*need a CUDA GPU.*can: naive"):
        relational_attention(**x, backend="triton")


@pytest.mark.parametrize(
    ("feature", "why"),
    [
        ("dropout", "has no dropout"),
        ("relative_symbols", "absolute symbol values v, not v_rel"),
    ],
)
def test_dispatch_refuses_what_the_kernel_lacks(feature, why):
    call = Call("cuda", torch.float32, frozenset({"grad", feature}))
    with pytest.raises(UnsupportedCallError, match=why) as err:
        family("relational").select("triton", call)
    assert why in err.value.reasons["triton"]
    assert family("relational").select("auto", call).name != "triton"


def test_capabilities_cover_what_the_kernel_does():
    supported = frozenset({"grad", "mask", "causal", "gqa", "rel_activation"})
    capabilities = family("relational").backends["triton"].capabilities
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert capabilities.refusal(Call("cuda", dtype, supported)) is None
    assert "dtype" in capabilities.refusal(Call("cuda", torch.float64, frozenset()))


@needs_triton
def test_direct_calls_check_their_own_arguments():
    """The raw kernel checks what only it knows (CUDA or the interpreter, its tile size); what
    it cannot serve is refused through dispatch, by its declared capabilities."""
    from attn_zoo.kernels.relational.triton import _interpreted

    x = RelationalProblem().inputs()
    if not _interpreted():  # compiled kernels (TRITON_INTERPRET unset), CPU tensors
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            triton_relational(**x)
    else:
        with pytest.raises(ValueError, match="block=24"):
            triton_relational(**x, block=24)
    triton = family("relational").backends["triton"]
    assert "no dropout" in triton.refusal(Call("cuda", torch.float32, frozenset({"dropout"})))
    v_rel = Call("cuda", torch.float32, frozenset({"relative_symbols"}))
    assert "not v_rel" in triton.refusal(v_rel)


def fake_inputs(device, requires_grad, dtype=torch.float16):
    """Fake (B=2, H=4, Hkv=2, N=5, M=7) inputs, widths 8/6/4, R=3, and a boolean (N, M) mask."""
    shapes = dict(q=(2, 4, 5, 8), k=(2, 2, 7, 8), v=(2, 2, 7, 6), qr=(2, 3, 5, 4), kr=(2, 3, 7, 4))
    x = {
        n: torch.randn(*s, device=device, dtype=dtype).requires_grad_(requires_grad)
        for n, s in shapes.items()
    }
    return x, torch.ones(5, 7, dtype=torch.bool, device=device)


@needs_triton
@pytest.mark.parametrize("act", ["identity", "softmax"])
def test_traces_on_cuda_fake_tensors_into_one_custom_op(act):
    """No GPU needed: on fake CUDA tensors, the family call under Dynamo (torch.export strict,
    the tracer torch.compile uses) is one graph holding the forward op, with the output's
    shape, dtype and device from its fake kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Attend(torch.nn.Module):
        def forward(self, q, k, v, qr, kr, mask):
            return relational_attention(q, k, qr, kr, v=v, attn_mask=mask, rel_activation=act,
                                        is_causal=True, backend="triton")  # fmt: skip

    with FakeTensorMode(allow_non_fake_inputs=True):
        x, mask = fake_inputs("cuda", requires_grad=False)
        out = Attend()(*x.values(), mask)
        assert (out.shape, out.dtype, out.device.type) == ((2, 4, 5, 9), torch.float16, "cuda")
        graph = torch.export.export(Attend(), (*x.values(), mask), strict=True).graph
    ops = [str(node.target) for node in graph.nodes if "attn_zoo" in str(node.target)]
    assert ops == ["attn_zoo.relational_triton_forward.default"]


@needs_triton
def test_backward_traces_through_the_registered_autograd(monkeypatch):
    """Forward and backward traced on fake tensors (CPU fakes: autograd needs a device guard,
    which a CPU-only build lacks for CUDA): the graph holds both custom ops, and every gradient
    has its input's shape and dtype."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from attn_zoo.kernels.relational import triton as module

    monkeypatch.setattr(module, "_interpreted", lambda: True)  # CPU tensors pass its check

    def attend(q, k, v, qr, kr, mask):
        out = triton_relational(q, k, qr, kr, v=v, attn_mask=mask, rel_activation="softmax")
        return out, *torch.autograd.grad(out.sum(), (q, k, v, qr, kr))

    with FakeTensorMode():
        x, mask = fake_inputs("cpu", requires_grad=True)
        out, *grads = attend(*x.values(), mask)
        graph = make_fx(attend)(*x.values(), mask).graph
    assert out.shape == (2, 4, 5, 9)
    for grad, t in zip(grads, x.values(), strict=True):
        assert (grad.shape, grad.dtype) == (t.shape, t.dtype)
    ops = [str(node.target) for node in graph.nodes if "attn_zoo" in str(node.target)]
    assert ops == [
        "attn_zoo.relational_triton_forward.default",
        "attn_zoo.relational_triton_backward.default",
    ]


def test_imports_and_reports_missing_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"  # import triton -> ImportError
        "import attn_zoo as az\n"
        "from attn_zoo.kernels.dispatch import Call, family\n"
        "import torch\n"
        "backend = family('relational').backends['triton']\n"
        "print(backend.refusal(Call('cuda', torch.float32)))\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr
    assert "triton is not installed" in child.stdout


if __name__ == "__main__":  # the interpreter child of the `interpreted` fixture
    from attn_zoo.kernels.relational.triton import _interpreted

    results = {name: run_check(name) for name in CHECKS}
    results["_interpreted"] = "yes" if _interpreted() else "no"
    print(json.dumps(results))
