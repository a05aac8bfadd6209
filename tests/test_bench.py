"""The benchmark's tables: one row per (backend, N), in-run ratios, refusals noted; its
report: files, valid PNGs, ratios recomputed from the tables' own times, the machine named."""

import math
import re
import shlex

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.image import imread

from ablations.bench import measure as measure_module
from ablations.bench import suites as suites_module
from ablations.bench.masks import MASKS, MaskedKernel
from ablations.bench.measure import (
    Workload,
    add_ratios,
    isolated_peak_memory_mb,
    machine,
    measure,
    peak_memory_mb,
    wall_ms,
)
from ablations.bench.report import write_bench_report
from ablations.bench.suites import (
    bench_masks,
    bench_mechanisms,
    bench_relational,
    bench_softmax,
    bench_window,
)
from ablations.cli import main, parser


def test_softmax_table_has_every_backend_and_ratios_from_the_same_run():
    table = bench_softmax(lengths=[16, 33], repeats=1, heads=2, head_dim=8, memory=False)
    # flex and xformers do not serve CPU calls (wrong results / no kernels): not benchmarked
    assert set(table.backend) == {"naive", "chunked", "sdpa"}
    assert sorted(set(table.N)) == [16, 33]
    sdpa = table[table.backend == "sdpa"]
    assert (sdpa.time_vs_sdpa == 1).all() and (sdpa.fwd_vs_sdpa == 1).all()
    chunked = table[table.backend == "chunked"].iloc[0]
    assert chunked.fwd_bwd_ms > 0 and chunked.time_vs_naive > 0


@pytest.mark.slow  # `make test-slow`: the default suite stays under 10 minutes
def test_relational_suite_has_our_backends_the_reference_and_standard_attention():
    table = bench_relational("dual", lengths=[8], repeats=1, d_model=16, heads=2)
    assert set(table.backend) == {"auto", "naive", "chunked", "fused", "reference", "standard_sdpa"}
    reference = table[table.backend == "reference"].iloc[0]
    assert reference.time_vs_reference == 1 and reference.time_vs_standard_sdpa > 0


def test_window_suite_times_the_window_as_a_mod_and_as_a_dense_mask():
    table = bench_window(lengths=[40], window=8, repeats=1, heads=2, head_dim=8, memory=False)
    assert set(table.backend) == {"chunked:mod", "naive:mod", "chunked:mask", "naive:mask",
                                  "sdpa:mask"}  # fmt: skip
    assert table.note.fillna("").eq("").all()  # every variant ran
    assert (table[table.backend == "chunked:mask"]["time_vs_chunked:mask"] == 1).all()


def test_masks_suite_times_each_mask_as_a_mod_and_as_a_dense_mask_with_its_ratios():
    table = bench_masks(lengths=[24, 48], window=4, repeats=1, heads=2, head_dim=4, memory=False)
    hows = ("sdpa", "chunked", "dense")
    assert set(table.backend) == {f"{m}:{how}" for m in MASKS for how in hows}
    assert table.note.fillna("").eq("").all()  # every workload ran
    dense = table[table.backend.str.endswith(":dense")]
    assert (dense.time_vs_dense == 1).all() and (dense.fwd_vs_dense == 1).all()
    rows = table.set_index(["backend", "N"])
    times = rows.fwd_bwd_ms
    for how in ("sdpa", "chunked"):
        assert rows.time_vs_dense[f"window:{how}", 48] == (
            times[f"window:{how}", 48] / times["window:dense", 48]
        )
    assert rows.growth["window:chunked", 48] == (
        times["window:chunked", 48] / times["window:chunked", 24]
    )
    assert (table.kept_tiles == 1).all()  # one tile of the backends' blocks at these lengths
    mods = ~table.backend.str.endswith(":dense")
    assert table.time_vs_kept_dense[mods].equals(table.time_vs_dense[mods])
    assert table.time_vs_kept_dense[~mods].isna().all()
    assert table[table.N == 24].growth.isna().all()  # no N / 2 measured


@pytest.mark.parametrize("mask", list(MASKS))
def test_the_masks_suite_compares_the_same_attention_as_a_mod_and_as_a_mask(mask):
    x = torch.randn(1, 40, 3 * 2 * 4, dtype=torch.float64)
    as_mask = MaskedKernel(24, 2, mask, 5, dense=True, backend="sdpa")(x)
    for backend in ("sdpa", "chunked"):
        as_mod = MaskedKernel(24, 2, mask, 5, dense=False, backend=backend)(x)
        torch.testing.assert_close(as_mod, as_mask)


def test_peak_memory_sees_a_large_temporary():
    """The best of three: another thread of this test process (a cell an earlier test left
    training in a thread, which a stopped run never joins) freeing memory meanwhile lowers the
    resident set under the temporary (a rise of 0 MiB once, in a pytest-xdist worker)."""
    rises = [peak_memory_mb(lambda: torch.ones(64 * 2**20 // 4).sum(), "cpu") for _ in range(3)]
    assert 60 < max(rises) < 80  # 64 MiB


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's synchronize and memory statistics stubbed (no GPU here): the calls, each
    as (function, device), land in the returned list; the allocator's peak reads 3 MiB."""
    calls = []

    def stub(name, value):
        def call(device=None):
            calls.append((name, device))
            return value

        return call

    for name, value in (
        ("synchronize", None),
        ("memory_allocated", 0),
        ("reset_peak_memory_stats", None),
        ("max_memory_allocated", 3 * 2**20),
    ):
        monkeypatch.setattr(torch.cuda, name, stub(name, value))
    return calls


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_any_cuda_device_is_synchronised_and_measured_by_the_allocator(fake_cuda, device):
    wall_ms(lambda: None, device)
    assert fake_cuda == [("synchronize", device)] * 2
    assert peak_memory_mb(lambda: None, device) == 3
    assert {name for name, _ in fake_cuda} >= {"memory_allocated", "max_memory_allocated"}
    assert {d for _, d in fake_cuda} == {device}


def test_measure_on_cuda_n_takes_the_gpu_memory_path(fake_cuda, monkeypatch):
    make = Workload.make  # the workload itself runs on the CPU (no GPU here)
    monkeypatch.setattr(Workload, "make", lambda self, n, grad, device: make(self, n, grad))

    def isolated(*args):
        raise AssertionError("a CUDA device measured in a CPU process")

    monkeypatch.setattr(measure_module, "isolated_peak_memory_mb", isolated)
    shape = dict(batch=1, heads=1, head_dim=4)
    table = measure([Workload("naive", "softmax", "naive", shape)], [8], 1, "cuda:0", ())
    assert table.train_peak_mb.tolist() == [3]
    assert ("synchronize", "cuda:0") in fake_cuda


@pytest.mark.parametrize(
    ("option", "error"),
    [
        (["--device", "cpu:7"], "--device 'cpu:7': the bench runs on cpu, cuda or cuda:N"),
        (["--device", "meta"], "--device 'meta': the bench runs on cpu, cuda or cuda:N"),
        (["--device", "cuda:99"], "--device cuda:99: torch.cuda."),
        (["--lengths", "8", "16", "8"], "--lengths [8, 16, 8]: each length once (repeated: [8])"),
        (["--csv-dir", "{file}/x"], "--csv-dir {file}/x: cannot write files there"),
        (["--report", "{file}/x"], "--report {file}/x: cannot write files there"),
    ],
)
def test_cli_refuses_a_bad_setting_in_one_line_before_measuring(
    option, error, monkeypatch, tmp_path
):
    def measured(*args):
        raise AssertionError("measured before the settings were checked")

    monkeypatch.setattr(suites_module, "_suite_table", measured)
    file = tmp_path / "file"  # a folder below a file cannot be made
    file.write_text("")
    option = [word.format(file=file) for word in option]
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--suite", "softmax", "--lengths", "8", *option])
    assert str(exit_.value).startswith(f"error: {error.format(file=file)}")


@pytest.mark.slow  # `make test-slow`: the default suite stays under 10 minutes
def test_isolated_memory_grows_quadratically_for_naive_and_linearly_for_chunked():
    def peak(backend, n):
        shape = dict(batch=1, heads=4, head_dim=16)
        return isolated_peak_memory_mb(Workload(backend, "softmax", backend, shape), n)

    naive, chunked = (
        peak("naive", 2048) / peak("naive", 1024),
        peak("chunked", 2048) / peak("chunked", 1024),
    )
    assert 3 < naive < 5 and chunked < 2.5, (naive, chunked)  # chunked: O(N), tiles constant


def test_cli_prints_the_machine_and_tables(capsys, tmp_path):
    argv = ["bench", "--lengths", "8", "--repeats", "1", "--backends", "naive", "sdpa"]
    assert (
        main(
            [*argv, "--d-model", "16", "--ra-heads", "2", "--no-memory", "--csv-dir", str(tmp_path)]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert machine() in out and "time_vs_sdpa" in out and "time_vs_reference" in out
    for suite in ("softmax", "relational", "dual", "mechanisms"):
        assert (tmp_path / f"bench_{suite}.csv").read_text().startswith("backend,N,")


def test_mechanisms_suite_covers_each_sequence_mechanism_backend():
    table = bench_mechanisms(lengths=[8], repeats=1, d_model=16, heads=2, memory=False)
    assert {"standard:sdpa", "linear:chunked", "additive:scan", "axial:chunked"} <= set(
        table.backend
    )
    assert (table[table.backend == "standard:sdpa"]["time_vs_standard:sdpa"] == 1).all()


LENGTHS = [64, 128, 256]
SUITES = {  # suite: ({backend: fwd+bwd ms at N=64}, baselines, peak memory measured)
    "softmax": ({"naive": 3.0, "sdpa": 1.5, "flex": float("nan")}, ("naive", "sdpa"), True),
    "dual": (
        {"fused": 2.0, "reference": 8.0, "standard_sdpa": 0.5},
        ("reference", "standard_sdpa"),
        False,
    ),
}
REPORTED = {"softmax": ["sdpa"], "dual": ["standard_sdpa", "reference"]}  # ratio columns shown


def fwd_bwd_ms(suite: str, backend: str, n: int) -> float:
    """Made-up times: naive and reference grow as N^2, the others as N."""
    quadratic = backend in ("naive", "reference")
    return SUITES[suite][0][backend] * (n / 64) ** (2 if quadratic else 1)


def peak_mb(backend: str, n: int) -> float:
    return {"naive": 4.0, "sdpa": 1.0, "flex": float("nan")}[backend] * n / 64


def synthetic_table(suite: str) -> pd.DataFrame:
    times, baselines, memory = SUITES[suite]
    rows = [
        {
            "backend": backend,
            "N": n,
            "fwd_ms": fwd_bwd_ms(suite, backend, n) / 3 if backend != "flex" else 0.5,
            "fwd_bwd_ms": fwd_bwd_ms(suite, backend, n),
            "train_peak_mb": peak_mb(backend, n) if memory else float("nan"),
            "note": "no backward on cpu" if backend == "flex" else "",
        }
        for n in LENGTHS
        for backend in times
    ]
    return add_ratios(pd.DataFrame(rows), baselines)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tables = {suite: synthetic_table(suite) for suite in SUITES}
    settings = {suite: f"{suite} settings, median of 3" for suite in SUITES}
    folder = tmp_path_factory.mktemp("bench_report")
    return write_bench_report(tables, folder, "Bench fixture", settings, "attn-zoo bench --x 1")


def markdown_rows(markdown: str, suite: str) -> list[dict[str, str]]:
    """The rows of a suite's table in the markdown, as {header: cell}."""
    section = markdown.split(f"## Suite: {suite}\n")[1].split("\n## ")[0]
    lines = [line.strip("| ").split(" | ") for line in section.splitlines() if line[:2] == "| "]
    return [dict(zip(lines[0], cells, strict=True)) for cells in lines[1:]]  # [0]: header


def test_bench_report_files_and_pngs(report):
    pngs = {"time_softmax.png", "memory_softmax.png", "ratio_softmax.png"}
    pngs |= {"time_dual.png", "ratio_dual.png"}  # dual: no peak memory measured
    csvs = {"bench_softmax.csv", "bench_dual.csv"}
    assert {p.name for p in report.iterdir()} == pngs | csvs | {"report.md", "index.html"}
    for name in pngs:
        data = (report / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(np.unique(imread(report / name))) > 1
    markdown = (report / "report.md").read_text()
    assert sorted(re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)) == sorted(pngs)
    page = (report / "index.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(pngs) and ".png" not in page
    numbers = pd.read_csv(report / "bench_softmax.csv").drop(columns="note")
    pd.testing.assert_frame_equal(numbers, synthetic_table("softmax").drop(columns="note"))


def test_bench_report_names_the_machine_and_settings(report):
    markdown = (report / "report.md").read_text()
    assert f"- Machine: {machine()}" in markdown and "- Command: attn-zoo bench --x 1" in markdown
    assert "softmax settings, median of 3" in markdown and "dual settings" in markdown
    assert "- flex at N = 64, 128, 256: no backward on cpu" in markdown


def test_bench_report_ratios_match_the_times(report):
    markdown = (report / "report.md").read_text()
    for suite, bases in REPORTED.items():
        rows = markdown_rows(markdown, suite)
        assert [(int(r["N"]), r["backend"]) for r in rows] == [
            (n, b) for n in LENGTHS for b in SUITES[suite][0]
        ]
        assert ("memory vs sdpa" in rows[0]) == SUITES[suite][2]
        for row in rows:
            backend, n = row["backend"], int(row["N"])
            for base in bases:
                ratio = fwd_bwd_ms(suite, backend, n) / fwd_bwd_ms(suite, base, n)
                expected = "-" if math.isnan(ratio) else f"{ratio:.3g}"
                assert row[f"fwd+bwd vs {base}"] == expected, (suite, backend, n, base)
            if suite == "softmax":
                memory = peak_mb(backend, n) / peak_mb("sdpa", n)
                assert row["memory vs sdpa"] == ("-" if math.isnan(memory) else f"{memory:.3g}")


def test_cli_writes_a_report_with_the_command_that_repeats_it(tmp_path, capsys):
    argv = ["bench", "--suite", "relational", "--lengths", "64", "128", "--repeats", "1"]
    argv += ["--no-memory", "--d-model", "16", "--ra-heads", "2", "--report", str(tmp_path)]
    assert main(argv) == 0
    assert f"wrote {tmp_path}/report.md" in capsys.readouterr().out
    pngs = {"time_relational.png", "ratio_relational.png"}  # --no-memory: no memory plot
    names = {"report.md", "index.html", "bench_relational.csv"} | pngs
    assert {p.name for p in tmp_path.iterdir()} == names
    markdown = (tmp_path / "report.md").read_text()
    command = re.search(r"^- Command: (.*)$", markdown, re.M).group(1)
    program, *words = shlex.split(command)
    assert program == "attn-zoo"
    assert vars(parser().parse_args(words)) == vars(parser().parse_args(argv))
    assert "d_model 16, 2 heads" in markdown and "fwd+bwd vs reference" in markdown


def test_cli_times_chosen_relational_backends_causal_and_not(tmp_path):
    argv = ["bench", "--suite", "relational", "--lengths", "8", "--repeats", "1", "--no-memory",
            "--d-model", "16", "--ra-heads", "2", "--ra-backends", "chunked", "--also-non-causal",
            "--csv-dir", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    for name in ("relational", "relational_noncausal"):
        table = pd.read_csv(tmp_path / f"bench_{name}.csv")
        assert set(table.backend) == {"chunked", "reference", "standard_sdpa"}
    with pytest.raises(ValueError, match=r"relational backends \['nope'\]: valid are"):
        bench_relational(lengths=[8], repeats=1, d_model=16, heads=2, backends=["nope"])
