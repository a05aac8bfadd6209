"""The benchmark's tables: one row per (backend, N), in-run ratios, refusals noted."""

import math

import torch

from attn_zoo.bench import (
    Workload,
    bench_mechanisms,
    bench_relational,
    bench_softmax,
    isolated_peak_memory_mb,
    machine,
    peak_memory_mb,
)
from attn_zoo.cli import main


def test_softmax_table_has_every_backend_and_ratios_from_the_same_run():
    table = bench_softmax(lengths=[16, 33], repeats=1, heads=2, head_dim=8, memory=False)
    assert set(table.backend) == {"naive", "chunked", "sdpa", "flex"}  # xformers: no CPU kernels
    assert sorted(set(table.N)) == [16, 33]
    sdpa = table[table.backend == "sdpa"]
    assert (sdpa.time_vs_sdpa == 1).all() and (sdpa.fwd_vs_sdpa == 1).all()
    flex = table[table.backend == "flex"].iloc[0]
    assert "no backward on cpu" in flex.note and math.isnan(flex.fwd_bwd_ms) and flex.fwd_ms > 0
    chunked = table[table.backend == "chunked"].iloc[0]
    assert chunked.fwd_bwd_ms > 0 and chunked.time_vs_naive > 0


def test_relational_suite_has_our_backends_the_reference_and_standard_attention():
    table = bench_relational("dual", lengths=[8], repeats=1, d_model=16, heads=2)
    assert set(table.backend) == {"auto", "naive", "chunked", "fused", "reference", "standard_sdpa"}
    reference = table[table.backend == "reference"].iloc[0]
    assert reference.time_vs_reference == 1 and reference.time_vs_standard_sdpa > 0


def test_peak_memory_sees_a_large_temporary():
    mb = peak_memory_mb(lambda: torch.ones(64 * 2**20 // 4).sum(), "cpu")  # 64 MiB
    assert 60 < mb < 80


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
