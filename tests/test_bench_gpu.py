"""The gpu suite (ablations/bench/gpu.py: `gpu_rows`, `bench_gpu`): every
comparison of issue 41 has its rows; on a machine without CUDA it runs end to end, the rows
that need a GPU kept in every table with why they were not run; its time budget, with a fake
clock and with none; a row's failure noted, not fatal."""

import itertools
import re
import shlex

import pandas as pd
import pytest
import torch

from ablations.bench import report as report_module
from ablations.bench.gpu import (
    GPU_DTYPES,
    GPU_GROUPS,
    CausalKernel,
    Row,
    Spent,
    bench_gpu,
    gpu_rows,
    measure_rows,
    over_budget,
)
from ablations.bench.measure import Workload
from ablations.bench.suites import DEFAULT_LENGTHS
from ablations.cli import main, parser

# Per table, its rows (the baseline first) and those that need what a CPU machine lacks
ROWS = {
    "softmax": (["sdpa", "flex", "chunked"], {"flex"}),
    "relational": (["triton", "standard_sdpa"], {"triton"}),
    "masks": (
        ["sdpa", "window:flex", "window:sdpa", "document:flex", "document:sdpa"],
        {"window:flex", "document:flex"},
    ),
    "linear": (["sdpa", "linear:chunked", "linear:fla"], {"linear:fla"}),
    "gla": (["sdpa", "gla:chunked", "gla:fla"], {"gla:fla"}),
}
TINY = dict(heads=2, head_dim=16, d_model=32, ra_heads=2, window=4)


def test_the_suite_has_every_comparison_of_the_issue_in_both_dtypes_up_to_16k():
    assert GPU_DTYPES == ("bfloat16", "float32")
    assert DEFAULT_LENGTHS["gpu"] == [1024, 2048, 4096, 8192, 16384]
    assert {group: baseline for group, (baseline, _) in GPU_GROUPS.items()} == {
        "softmax": "sdpa", "relational": "standard_sdpa", "masks": "sdpa", "linear": "sdpa",
        "gla": "sdpa",
    }  # fmt: skip
    for group, (labels, _) in ROWS.items():
        for dtype in GPU_DTYPES:
            rows = gpu_rows(group, dtype)
            assert [row.label for row in rows] == labels
            assert {row.workload.dtype for row in rows} == {dtype}
    backends = {(row.label, row.family, row.backend) for row in gpu_rows("relational", "bfloat16")}
    assert backends == {("triton", "relational", "triton"), ("standard_sdpa", "softmax", "sdpa")}
    with pytest.raises(ValueError, match="gpu group 'nope': valid are softmax, relational"):
        gpu_rows("nope", "float32")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """`attn-zoo bench --suite gpu` on the CPU at tiny sizes, with a report; without its plots
    (tests/test_bench.py checks them; 20 figures took 13 s here)."""
    folder = tmp_path_factory.mktemp("gpu_report")
    argv = ["bench", "--suite", "gpu", "--device", "cpu", "--lengths", "16", "--repeats", "1",
            "--heads", "2", "--head-dim", "16", "--d-model", "32", "--ra-heads", "2",
            "--window", "4", "--budget", "120", "--report", str(folder)]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report_module, "_plots", lambda table: [])
        assert main(argv) == 0
    return folder, argv


def test_on_a_cpu_every_table_keeps_the_gpu_rows_with_why_and_measures_the_rest(cpu_run):
    folder, _ = cpu_run
    for group, (labels, gpu_only) in ROWS.items():
        for dtype in GPU_DTYPES:
            table = pd.read_csv(folder / f"bench_gpu_{group}_{dtype}.csv", keep_default_na=False)
            assert table.backend.tolist() == labels and table.N.eq(16).all()
            times = table[["fwd_ms", "fwd_bwd_ms"]].apply(pd.to_numeric, errors="coerce")
            skipped = table.backend.isin(gpu_only)
            assert times[skipped].isna().all().all(), (group, dtype)
            assert (times[~skipped] > 0).all().all(), (group, dtype, table.note.tolist())
            assert table.note[~skipped].eq("").all(), (group, dtype)
            for note in table.note[skipped]:
                assert "cpu" in note.lower(), note  # why: the device
    markdown = (folder / "report.md").read_text()
    assert "- flex at N = 16: no kernel for device 'cpu'" in markdown
    assert "- triton at N = 16: no kernel for device 'cpu'" in markdown
    assert "- gla:fla at N = 16: no kernel for device 'cpu': flash-linear-attention" in markdown
    assert "- window:flex at N = 16:" in markdown and "- linear:fla at N = 16:" in markdown


def test_the_report_names_each_table_and_the_command_that_repeats_it(cpu_run):
    folder, argv = cpu_run
    markdown = (folder / "report.md").read_text()
    for group in GPU_GROUPS:
        for dtype in GPU_DTYPES:
            assert f"## Suite: gpu_{group}_{dtype}\n" in markdown
            assert f"gpu suite, {group}: " in markdown
    assert "ratios to standard_sdpa at the same N, dtype and pass" in markdown
    assert "fwd+bwd vs sdpa" in markdown and "fwd+bwd vs standard_sdpa" in markdown
    command = re.search(r"^- Command: (.*)$", markdown, re.M).group(1)
    program, *words = shlex.split(command)
    assert program == "attn-zoo"
    assert vars(parser().parse_args(words)) == vars(parser().parse_args(argv))


def test_a_table_stops_a_row_at_the_n_its_time_would_not_fit_in_the_budget():
    """A fake clock, one second a reading: each row's warm-up reads as a second of setup, so
    with 20 s the rows are measured at the first lengths, then noted over the budget from one
    N on, never measured again after it."""
    clock = itertools.count().__next__
    rows = gpu_rows("softmax", "float32", heads=2, head_dim=16)
    lengths = [8, 16, 32, 64, 128]
    table = measure_rows(rows, lengths, 1, "cpu", "sdpa", 20.0, clock, memory=False)
    for label in ("sdpa", "chunked"):
        measured = table[table.backend == label].set_index("N")
        ran = measured.fwd_bwd_ms.notna().tolist()
        assert ran[0] and not ran[-1] and ran == sorted(ran, reverse=True), ran
        assert (
            measured.note[~measured.fwd_bwd_ms.notna()]
            .str.startswith("over the time budget: ")
            .all()
        )
    assert table.set_index(["backend", "N"]).note["flex", 128].startswith("no kernel for device")


def test_with_no_budget_left_every_row_is_noted_and_none_measured():
    tables = bench_gpu([8], 1, "cpu", budget=1e-9, memory=False, **TINY)
    assert set(tables) == {(group, dtype) for group in GPU_GROUPS for dtype in GPU_DTYPES}
    for (group, _), table in tables.items():
        assert table.fwd_ms.isna().all() and table.fwd_bwd_ms.isna().all()
        gpu_only = table.backend.isin(ROWS[group][1])
        assert table.note[~gpu_only].eq("over the time budget: none left for this table").all()


def test_over_budget_grows_the_calls_and_counts_a_setup_that_came_again():
    first = Spent(1024, calls=2.0, setup=30.0, again=False)  # a first compile: once
    assert first.next_n() == 8.0
    assert over_budget(first, 8.5) is None
    assert over_budget(first, 7.5) == (
        "over the time budget: 8 s expected after N = 1024 (its calls' 2 s times 4), more "
        "than the 7.5 s this table had left"
    )
    again = Spent(2048, calls=2.0, setup=3.0, again=True)  # compiled again for this N
    assert again.next_n() == 11.0 and over_budget(again, 12.0) is None
    assert "times 4 and its setup's 3 s), more than the 10 s" in over_budget(again, 10.0)
    assert over_budget(None, 5.0) is None  # nothing measured yet, time left: try it
    assert over_budget(first, 0.0) == "over the time budget: none left for this table"


def test_a_row_that_fails_is_noted_with_its_error_and_not_run_again():
    kernel = f"{CausalKernel.__module__}.{CausalKernel.__name__}"
    kwargs = dict(d_model=6 * 4, heads=2, kernel="softmax", backend="sdpa")
    rows = [
        Row(Workload("sdpa", "module", kernel, kwargs), "softmax", "sdpa"),
        Row(Workload("broken", "module", kernel, kwargs, causal=False), "softmax", "sdpa"),
    ]
    table = measure_rows(rows, [8, 16], 1, "cpu", "sdpa", 60.0, memory=False)
    notes = table.set_index(["backend", "N"]).note
    assert notes["broken", 8] == (
        "failed: ValueError: is_causal=False: CausalKernel computes causal attention only"
    )
    assert notes["broken", 16] == "not run: it failed at N = 8"
    assert table[table.backend == "sdpa"].fwd_bwd_ms.notna().all()


@pytest.mark.parametrize(("kernel", "backends"), [("softmax", ("naive", "chunked", "sdpa")),
                                                  ("linear", ("naive", "chunked")),
                                                  ("gla", ("naive", "chunked"))])  # fmt: skip
def test_causal_kernel_cuts_one_input_into_the_same_attention_on_each_backend(kernel, backends):
    parts = 4 if kernel == "gla" else 3
    x = torch.randn(1, 20, parts * 2 * 8, dtype=torch.float64)
    want = CausalKernel(parts * 16, 2, kernel, backends[0])(x)
    assert want.shape == (1, 2, 20, 8)
    for backend in backends[1:]:
        torch.testing.assert_close(CausalKernel(parts * 16, 2, kernel, backend)(x), want)


def test_causal_kernel_refuses_a_bad_setting_by_name():
    with pytest.raises(ValueError, match="kernel='cubic': valid are softmax, linear, gla"):
        CausalKernel(48, 2, "cubic", "naive")
    with pytest.raises(
        ValueError, match=r"d_model=36: gla needs a multiple of 4 x heads \(4 x 2\)"
    ):
        CausalKernel(36, 2, "gla", "naive")


@pytest.mark.parametrize(
    ("option", "error"),
    [
        (["--suite", "gpu", "softmax"], "--suite gpu runs on its own"),
        (["--suite", "gpu", "--also-non-causal"], "--suite gpu times causal attention"),
        (["--suite", "gpu", "--no-causal"], "--suite gpu times causal attention"),
    ],
)
def test_cli_refuses_a_gpu_setting_it_cannot_run(option, error):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--lengths", "8", *option])
    assert str(exit_.value).startswith(f"error: {error}")


def test_cli_refuses_a_budget_of_no_time(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--suite", "gpu", "--budget", "0"])
    assert exit_.value.code == 2
    assert "--budget: invalid value '0': valid is float > 0" in capsys.readouterr().err
