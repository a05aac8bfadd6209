"""The GPU paths, on a CUDA machine (every test skips without one): flex with the kit's score and
mask mods, sdpa, chunked and xformers (where installed) against the float64 naive reference on
the GPU, outputs and gradients, around flex's 128-wide blocks; the triton relational kernel
compiled (not interpreted); a cell resumed on the GPU from its checkpoint ends as an
uninterrupted run. Tolerances are the kit's (attn_zoo/testing/agreement.py).

Run on a GPU machine with ``pytest tests/test_cuda.py``; measured results go into the notes of
the session that ran them."""

import pytest
import torch

from attn_zoo.testing import (
    ALL_MASK_MODS,
    ALL_SCORE_MODS,
    AttentionProblem,
    RelationalProblem,
    assert_backends_agree,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def every_call_compiles():
    """Past dynamo's recompile limit (8 by default) flex would run eagerly and a compile-only
    failure could hide: raised for these tests only, restored after (other modules of the same
    process keep the default)."""
    before = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 1024
    yield
    torch._dynamo.config.recompile_limit = before


# (N, M) around flex's 128-wide query and key blocks, with a mask kind and causality per case
CASES = [
    (1, 1, "none", False), (127, 129, "random", True), (128, 128, "empty_rows", False),
    (129, 257, "additive", "bottom_right"), (40, 40, "none", False),
    (257, 127, "key_padding", True),
]  # fmt: skip


@pytest.mark.parametrize(("n", "m", "mask", "causal"), [CASES[0], CASES[1], CASES[3]])
@pytest.mark.parametrize("score_mod", ALL_SCORE_MODS)
def test_every_gpu_backend_agrees_with_float64_naive_under_mods(n, m, mask, causal, score_mod):
    """Each case with every mask mod of the kit in turn; flex must serve all of them."""
    for i, mask_mod in enumerate(ALL_MASK_MODS):
        problem = AttentionProblem(
            batch=2, heads=4, kv_heads=2, q_len=n, k_len=m, key_dim=24, value_dim=16,
            mask=mask, is_causal=causal, seed=n + m + i, score_mod=score_mod, mask_mod=mask_mod,
        )  # fmt: skip
        report = assert_backends_agree(problem, device="cuda")
        assert report["flex"] == "ok", report
        assert report["chunked"] == "ok", report


def test_flex_compiles_once_for_a_training_loop():
    """Ten steps of one shape and one mask mod (each call builds new closures) compile once:
    a recompile per step would run into dynamo's limit and fall back to the eager, N x M path."""
    from torch._dynamo.utils import counters

    from attn_zoo.kernels import softmax_attention
    from attn_zoo.kernels.softmax import build_mod

    window = build_mod({"name": "sliding_window", "window": 32})
    q, k, v = (torch.randn(2, 4, 256, 32, device="cuda", requires_grad=True) for _ in range(3))
    graphs = []
    for _ in range(10):
        softmax_attention(q, k, v, mask_mod=window, backend="flex").sum().backward()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[-1] == graphs[0], graphs


def test_flex_refuses_head_widths_below_16_and_auto_picks_another():
    problem = AttentionProblem(q_len=40, k_len=40, key_dim=8, value_dim=32, mask_mod="causal")
    report = assert_backends_agree(problem, device="cuda")
    assert "head widths >= 16" in report["flex"] and report["chunked"] == "ok"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flex_in_half_precision(dtype):
    for n, m, mask, causal in CASES:
        problem = AttentionProblem(
            batch=1, heads=2, kv_heads=1, q_len=n, k_len=m, key_dim=16, value_dim=32,
            mask=mask, is_causal=causal, dtype=dtype, seed=n, mask_mod="sliding_window",
        )  # fmt: skip
        assert assert_backends_agree(problem, backends=["flex"], device="cuda") == {"flex": "ok"}


@pytest.mark.parametrize("rel_activation", ["identity", "softmax", "sigmoid"])
def test_the_triton_relational_kernel_compiled(rel_activation):
    for i, (n, m, mask, causal) in enumerate(CASES):
        problem = RelationalProblem(
            q_len=n, k_len=m, mask="none" if mask == "additive" else mask, is_causal=causal,
            rel_activation=rel_activation, seed=i,
        )  # fmt: skip
        report = assert_backends_agree(problem, "relational", backends=["triton"], device="cuda")
        assert report == {"triton": "ok"}


def test_a_cell_resumed_on_the_gpu_ends_as_an_uninterrupted_run():
    from ablations.grid.cell import Cell
    from ablations.run.resume import ResumePlan
    from ablations.run.train import train_cell

    cell = Cell(
        grid="g", task="same_pair", task_name="same_pair",
        task_kwargs=dict(n_train=256, n_validation=64, n_test=64),
        size=dict(label="s", d_model=32, n_layers=2, dropout=0.1), mechanism="std",
        mechanism_name="standard", mechanism_kwargs=dict(n_heads=2),
        training=dict(steps=60, eval_every=10, batch_size=16, device="cuda"),
        seed=0,
    )  # fmt: skip
    first, again = train_cell(cell), train_cell(cell)
    if first.curve != again.curve:
        pytest.skip("two uninterrupted GPU runs differ (non-deterministic kernels)")
    saved = []
    train_cell(cell, resume=ResumePlan(every_steps=20), on_checkpoint=lambda s, d: saved.append(d))
    resumed = train_cell(cell, resume=ResumePlan(data=saved[0]))

    def untimed(metrics: dict) -> dict:  # wall_s, step_ms differ between any two runs
        return {k: v for k, v in metrics.items() if k not in ("wall_s", "step_ms")}

    assert resumed.curve == first.curve and untimed(resumed.metrics) == untimed(first.metrics)
