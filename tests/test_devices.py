"""Devices and resources on a CPU-only machine: which devices a grid may name here, where
"auto" resolves, bf16 on each kind of device, where the local executor places its workers,
what each Ray task asks for, and the device and dtype a cell records."""

import dataclasses
import io
import types

import pytest
import torch
from grids import STD, tiny_grid

from ablations.cli import main
from ablations.grid.devices import device_problem, precision_problem
from ablations.grid.schema import TrainingSettings
from ablations.grid.spec import SpecError, load_grid
from ablations.results.store import ResultsStore
from ablations.run import devices, local_executor, ray_executor
from ablations.run.cell_worker import run_cell
from ablations.run.devices import (
    compute_dtype,
    placements,
    resolve_device,
    slow_precision,
)
from ablations.run.executors import make_executor
from ablations.run.local_executor import LocalExecutor
from ablations.run.ray_executor import RayExecutor, ray_options, ray_slots
from ablations.run.runner import run_grid
from ablations.run.train import CellOutcome, environment

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@pytest.mark.parametrize(
    ("device", "cuda_devices", "mps", "problem"),
    [
        ("auto", 0, False, None),
        ("cpu", 0, False, None),
        ("cuda", 0, False, "torch.cuda.is_available() is False"),
        ("cuda:0", 0, False, "torch.cuda.is_available() is False"),
        ("cuda", 1, False, None),
        ("cuda:0", 2, False, None),
        ("cuda:1", 2, False, None),
        ("cuda:2", 2, False, "torch.cuda.device_count() is 2"),
        ("mps", 0, False, "torch.backends.mps.is_available() is False"),
        ("mps", 0, True, None),
    ],
)
def test_device_problem_names_what_torch_lacks(device, cuda_devices, mps, problem):
    assert device_problem(device, cuda_devices=cuda_devices, mps=mps) == problem


def test_bf16_is_refused_on_mps_only():
    assert precision_problem("bf16", "mps") == "bf16 autocast runs on CUDA and CPU, not on MPS"
    for device in ("auto", "cpu", "cuda", "cuda:1"):
        assert precision_problem("bf16", device) is None
    assert precision_problem("float32", "mps") is None


@NO_CUDA
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_is_refused_at_load_time_on_this_machine(tmp_path, device):
    path = tiny_grid(tmp_path)
    with pytest.raises(SpecError) as err:
        load_grid(path, [f"training.device={device}"])
    message = str(err.value)
    assert message.startswith(f"{path}: training.device = {device!r} is not available")
    assert "torch.cuda.is_available() is False" in message and "\n" not in message


def test_bf16_with_mps_is_refused_at_load_time_where_mps_is_available(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    path = tiny_grid(tmp_path)
    assert load_grid(path, ["training.device=mps"]).training.device == "mps"
    with pytest.raises(SpecError) as err:
        load_grid(path, ["training.device=mps", "training.precision=bf16"])
    message = str(err.value)
    assert message.startswith(f"{path}: training.precision = 'bf16' cannot be used with")
    assert "training.device = 'mps'" in message and "valid there: float32" in message


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_bf16_is_accepted_on_the_cpu(tmp_path, device):
    overrides = [f"training.device={device}", "training.precision=bf16"]
    (cell, *_) = load_grid(tiny_grid(tmp_path), overrides).cells
    assert cell.training.precision == "bf16"
    assert compute_dtype("bf16", "cpu") == torch.bfloat16


@pytest.mark.parametrize(
    ("precision", "device", "cuda_devices", "native_bf16", "slow"),
    [
        ("bf16", "cpu", 0, False, True),
        ("bf16", "auto", 0, False, True),  # auto without a GPU: the CPU
        ("bf16", "cpu", 0, True, False),  # a CPU with bfloat16 instructions
        ("bf16", "auto", 1, False, False),  # auto with a GPU: the GPU
        ("bf16", "cuda", 1, False, False),
        ("bf16", "cpu", 1, False, True),  # named: the CPU, GPUs or not
        ("float32", "cpu", 0, False, False),
    ],
)
def test_bf16_on_a_cpu_without_bfloat16_instructions_is_called_slow(
    precision, device, cuda_devices, native_bf16, slow
):
    found = slow_precision(precision, device, cuda_devices=cuda_devices, native_bf16=native_bf16)
    assert (found is not None) == slow
    if slow:
        assert found.startswith("training.precision = 'bf16' on this CPU")


@NO_CUDA
@pytest.mark.parametrize("native", [False, True, None])
def test_a_local_run_warns_once_before_training_where_bf16_is_emulated(
    tmp_path, monkeypatch, native
):
    """One warning line for the bf16 cells of a grid that sweeps the precision, printed before
    the first cell trains, where oneDNN has no bfloat16 path (as on the 2-core CI machine);
    none where it has one or torch cannot say, and never for the float32 cells."""
    monkeypatch.setattr(devices, "cpu_has_bf16", lambda: native)
    path = tiny_grid(tmp_path, seeds=[0, 1], mechanisms=[STD], training={"steps": 2})
    with path.open("a") as grid:
        grid.write('\n[sweep]\ntraining.precision = ["float32", "bf16"]\n')
    out = io.StringIO()
    assert run_grid(load_grid(path), workers=1, out=out)["done"] == 4
    lines = out.getvalue().splitlines()
    warnings = [i for i, line in enumerate(lines) if line.startswith("warning: training.precision")]
    assert warnings == ([1] if native is False else [])  # after the grid's line, before a cell
    assert lines[0].startswith("grid 'tiny': 4 cells")


def test_compute_dtype_refuses_bf16_where_it_cannot_run():
    assert compute_dtype("float32", "mps") == torch.float32
    with pytest.raises(RuntimeError, match="CUDA and CPU"):
        compute_dtype("bf16", "mps")


@NO_CUDA
def test_auto_resolves_to_the_cpu_here_and_cuda_fails_in_the_worker():
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    assert resolve_device("mps") == "mps"  # only when named
    with pytest.raises(RuntimeError, match=r"torch.cuda.is_available\(\) is False"):
        resolve_device("cuda")


@pytest.mark.parametrize(
    ("workers", "n_gpus", "device", "expected"),
    [
        (2, 2, "auto", ["cuda:0", "cuda:1"]),
        (1, 4, "auto", ["cuda:0"]),
        (5, 2, "auto", ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]),  # round-robin
        (3, 3, "cuda", ["cuda:0", "cuda:1", "cuda:2"]),
        (2, 0, "auto", ["cpu", "cpu"]),  # as before: CPU workers
        (2, 4, "cpu", ["cpu", "cpu"]),
        (3, 2, "cuda:1", ["cuda:1"] * 3),  # a named GPU: every worker on it
        (2, 0, "mps", ["mps", "mps"]),
    ],
)
def test_placements_put_one_worker_per_gpu(workers, n_gpus, device, expected):
    assert placements(workers, n_gpus, device) == expected


def test_the_local_executor_places_each_worker_by_its_index(monkeypatch):
    pool = LocalExecutor(3, gpus=2)
    auto = types.SimpleNamespace(training=TrainingSettings())  # device at its default: "auto"
    named = types.SimpleNamespace(training=TrainingSettings(device="cpu"))
    workers = [types.SimpleNamespace(index=i) for i in range(3)]
    assert [pool._device(w, auto) for w in workers] == ["cuda:0", "cuda:1", "cuda:0"]
    # None: the cell's own setting decides ("cpu" here; "auto" on a machine without GPUs)
    assert [pool._device(w, named) for w in workers] == [None] * 3
    assert LocalExecutor(2, gpus=0)._device(workers[1], auto) is None

    monkeypatch.setattr(devices, "gpu_count", lambda: 2)  # one worker per GPU by default
    assert make_executor("local").slots == 2
    assert make_executor("local", device="cpu").slots == devices.usable_cpus()
    assert make_executor("local", workers=5).slots == 5


def test_local_workers_follow_the_cores_and_threads_the_grid(monkeypatch):
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    monkeypatch.setattr(devices, "usable_cpus", lambda: 3)
    monkeypatch.setattr(ray_executor, "usable_cpus", lambda: 3)
    default = make_executor("local")
    assert (default.slots, default.threads) == (3, 1)  # one worker per usable core
    one = make_executor("local", workers=1)
    assert (one.slots, one.threads) == (1, 1)  # the threads are the grid's, not the cores'
    wide = make_executor("local", resources={"num_cpus": 3})
    assert (wide.slots, wide.threads) == (1, 3)  # as many workers as the cores hold
    assert make_executor("local", resources={"num_cpus": 2}).slots == 1


def test_the_local_executor_sends_each_worker_its_placement(tmp_path, monkeypatch):
    seen = []

    def fake_run_cell(cell, threads, progress=None, keep_state=False, device=None, imports=()):
        seen.append(device)
        return CellOutcome("failed", environment(device), error="not trained")

    monkeypatch.setattr(local_executor, "run_cell", fake_run_cell)
    (cell, *_) = load_grid(tiny_grid(tmp_path)).cells
    pool = LocalExecutor(1, gpus=3)  # a thread worker: the patched run_cell is the one called
    try:
        handle = pool.submit(cell, False)
        ((_, outcome),) = pool.wait([handle], timeout=30)
    finally:
        pool.close()
    assert seen == ["cuda:0"] and outcome.environment["device"] == "cuda:0"


def test_ray_options_ask_for_the_grid_resources():
    assert ray_options() == {"num_cpus": 1, "num_gpus": 0, "max_retries": 3}
    assert ray_options({"num_cpus": 2, "num_gpus": 0.5}, retries=1) == {
        "num_cpus": 2,
        "num_gpus": 0.5,
        "max_retries": 1,
    }
    assert ray_slots({"CPU": 16.0}, ray_options()) == 16
    assert ray_slots({"CPU": 16.0, "GPU": 2.0}, ray_options({"num_gpus": 0.5})) == 4
    assert ray_slots({"CPU": 16.0, "GPU": 2.0}, ray_options({"num_cpus": 8})) == 2
    assert ray_slots({"CPU": 1.0}, ray_options({"num_cpus": 4})) == 1


def test_the_ray_executor_submits_each_cell_with_its_options(tmp_path):
    calls = []

    class Task:
        def options(self, **options):
            calls.append(("options", options))
            return self

        def remote(self, *args):
            calls.append(("remote", args))
            return object()

    spec = load_grid(tiny_grid(tmp_path), ["resources.num_cpus=2", "resources.num_gpus=0.25"])
    pool = object.__new__(RayExecutor)  # no Ray instance: what submit hands to Ray
    pool.options, pool.threads, pool.progress = ray_options(spec.resources), 2, None
    pool.task, pool.in_flight, pool.imports = Task(), set(), []
    cell = spec.cells[0]
    pool.submit(cell, True)
    assert calls == [
        ("options", {"num_cpus": 2, "num_gpus": 0.25, "max_retries": 3}),
        ("remote", (cell, 2, None, True, None, [])),
    ]


def test_the_ray_executor_refuses_cuda_without_gpus_before_starting_ray():
    pytest.importorskip("ray")
    import ray

    with pytest.raises(SpecError, match=r"device = 'cuda' .* needs resources.num_gpus > 0"):
        make_executor("ray", workers=1, device="cuda")
    assert not ray.is_initialized()


def test_run_cell_records_the_device_and_dtype_and_a_failed_cells_device(tmp_path):
    (cell, *_) = load_grid(tiny_grid(tmp_path, mechanisms=[STD], seeds=[0])).cells
    done = run_cell(cell, 1)
    assert done.status == "done"
    assert done.environment["device"] == "cpu" and done.environment["dtype"] == "float32"
    bf16 = dataclasses.replace(cell, training=dict(cell.training, precision="bf16"))
    assert run_cell(bf16, 1, device="cpu").environment["dtype"] == "bfloat16"
    # a placement that cannot be used here fails the cell, naming the device tried
    failed = run_cell(cell, 1, device="cuda:99")
    assert failed.status == "failed" and "Traceback" in failed.error
    assert failed.environment["device"] == "cuda:99"


def test_a_compile_error_fails_the_cell_without_falling_back_to_eager(tmp_path, monkeypatch):
    def broken(gm, example_inputs):
        raise RuntimeError("backend exploded")

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: compile_(model, backend=broken))
    (cell, *_) = load_grid(tiny_grid(tmp_path, mechanisms=[STD], seeds=[0])).cells
    compiled = dataclasses.replace(cell, training=dict(cell.training, compile=True))
    outcome = run_cell(compiled, 1)
    assert outcome.status == "failed" and "backend exploded" in outcome.error
    assert run_cell(cell, 1).status == "done"  # eager cells never compile


@NO_CUDA
def test_status_and_report_read_a_cuda_grid_on_a_machine_without_cuda(tmp_path, capsys):
    path = tiny_grid(tmp_path, training={"device": "cuda"})
    with pytest.raises(SpecError, match="training.device = 'cuda' is not available"):
        load_grid(path)
    with pytest.raises(SystemExit, match="training.device = 'cuda' is not available"):
        main(["ablate", "run", str(path)])
    assert main(["ablate", "status", str(path)]) == 0
    assert "4 todo" in capsys.readouterr().out
    spec = load_grid(path, check_device=False)
    store = ResultsStore(spec.store)
    for cell in spec.cells:  # as the GPU machine's run left them
        store.finish(store.claim(cell.config()), "done", {"test_acc": 0.5}, [], {})
    store.close()
    assert main(["report", str(path), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "report.md").is_file()
