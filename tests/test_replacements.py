"""Grids over attention replacements (ablations/grid/teacher.py): a tiny Llama teacher trained
by a grid of its own and exported with save_pretrained (ablations/run/export.py), then cells
that swap its attention and distil it, from the command line with two workers, with the
teacher's own cell reproducing its test loss, bad teachers and swaps refused before training,
a resume across the transfer / fine-tuning boundary ending as an uninterrupted run, a lora
cell's stages training what distil's do, and an export refused for a cell that is not done,
weights that are not finite, or a folder that holds files (without --force)."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from grids import assert_refused, tiny_grid

pytest.importorskip("transformers")
pytest.importorskip("peft")

from ablations.cli import main  # noqa: E402
from ablations.grid.cell_model import build_cell_model  # noqa: E402
from ablations.grid.spec import load_grid  # noqa: E402
from ablations.grid.teacher import load_teacher, recovered  # noqa: E402
from ablations.results.store import ResultsStore  # noqa: E402
from ablations.run import export  # noqa: E402
from ablations.run.export import export_cell  # noqa: E402
from ablations.run.provenance import (  # noqa: E402
    data_record,
    mixed_provenance,
    plugin_record,
    source_state,
)
from ablations.run.resume import ResumePlan  # noqa: E402
from ablations.run.train import train_cell  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 16
TASK = {
    "name": "copy",
    "kwargs": {"vocab_size": VOCAB, "length": 4, "n_train": 128, "n_validation": 32,
               "n_test": 32},
}  # fmt: skip
ARCHITECTURE = dict(  # a config.json: 2 layers, hidden 16, grouped-query heads
    model_type="llama", vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
    max_position_embeddings=16,
)  # fmt: skip
SIZE = {"label": "t", "d_model": 16, "n_layers": 2, "teacher": "teacher"}
HEADS = {"n_heads": 2}
TEACHER = {"label": "teacher", "name": "standard", "kwargs": HEADS,
           "model": {"finetune": "none"}}  # fmt: skip
LINEAR = {"label": "linear", "name": "linear", "kwargs": HEADS,
          "model": {"transfer_steps": 3, "finetune": "attention"}}  # fmt: skip
TRAINING = {"steps": 6, "eval_every": 2, "batch_size": 8, "warmup_steps": 2}
TIMING = ("wall_s", "step_ms")


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """A folder holding teacher/, a tiny Llama trained from scratch on the copy task by a
    grid of one cell (its config.json in arch/), exported as `make hf-teacher` does."""
    folder = tmp_path_factory.mktemp("teacher")
    (folder / "arch").mkdir()
    (folder / "arch" / "config.json").write_text(json.dumps(ARCHITECTURE))
    size = {**SIZE, "teacher": "arch", "from_scratch": True}
    mechanism = {"label": "llama", "name": "standard", "kwargs": HEADS}
    path = tiny_grid(folder, name="make_teacher", tasks=[TASK], sizes=[size], seeds=[0],
                     mechanisms=[mechanism], checkpoints=True, file="make_teacher.toml",
                     training={"steps": 40, "eval_every": 20, "lr": 1e-2})  # fmt: skip
    assert main(["ablate", "run", str(path), "--workers", "1"]) == 0
    export_cell(load_grid(path), folder / "teacher")
    return folder


def grid(folder: Path, mechanisms: list[dict], name: str = "replacements", **kwargs) -> Path:
    return tiny_grid(folder, name=name, tasks=[TASK], sizes=[SIZE], seeds=[0],
                     mechanisms=mechanisms, training=TRAINING, file=f"{name}.toml",
                     **kwargs)  # fmt: skip


def exact(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in TIMING}


def test_loading_a_teacher_draws_no_progress_bar_and_leaves_the_setting_as_it_was(teacher, capfd):
    from transformers.utils import logging

    for enabled in (True, False):
        (logging.enable_progress_bar if enabled else logging.disable_progress_bar)()
        load_teacher(teacher / "teacher")
        assert logging.is_progress_bar_enabled() is enabled
        assert "Loading weights" not in capfd.readouterr().err  # once per cell of a grid
    logging.enable_progress_bar()


def test_the_teachers_own_cell_gives_its_test_loss_and_recovers_all_of_it(teacher):
    from transformers import AutoModelForCausalLM

    (cell,) = load_grid(grid(teacher, [TEACHER], name="itself")).cells
    result = train_cell(cell)
    assert result.status == "done" and result.metrics["steps"] == 0 and result.curve == []
    test = cell.build_task().splits(cell.seed)["test"]
    hf = AutoModelForCausalLM.from_pretrained(teacher / "teacher").eval()
    with torch.no_grad():
        logits = hf(input_ids=test.inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), test.targets.flatten(),
                                             ignore_index=-1)  # fmt: skip
    assert result.metrics["test_loss"] == pytest.approx(float(loss), rel=1e-6)
    assert result.metrics["teacher_test_loss"] == result.metrics["test_loss"]
    assert result.metrics["teacher_test_loss"] < math.log(VOCAB)  # it learnt something
    assert result.metrics["test_recovered"] == 1.0
    assert result.metrics["test_bits"] == pytest.approx(result.metrics["test_loss"] / math.log(2))


@pytest.mark.slow  # two worker processes importing transformers, then a report: about a minute
def test_replacements_run_from_the_command_line_with_two_workers_and_report(teacher, tmp_path):
    (tmp_path / "teacher").symlink_to(teacher / "teacher")
    gla = {"label": "gla", "name": "gla", "kwargs": HEADS, "model": {"finetune": "none"}}
    path = grid(tmp_path, [TEACHER, LINEAR, gla])
    selection = '[selection]\nmetric = "val_loss"\nreported = ["test_bits", "test_recovered"]\n'
    path.write_text(path.read_text() + selection)
    command = [sys.executable, "-m", "ablations.cli", "ablate", "run", str(path),
               "--workers", "2"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    spec = load_grid(path)
    with ResultsStore(spec.store, readonly=True) as store:
        rows = {row["config"]["mechanism"]: row for row in store.rows()}
    assert {label: row["status"] for label, row in rows.items()} == dict.fromkeys(
        ("teacher", "linear", "gla"), "done"
    )
    assert rows["teacher"]["metrics"]["test_recovered"] == 1.0
    teacher_loss = rows["teacher"]["metrics"]["test_loss"]
    for label in ("linear", "gla"):  # measured against the same teacher on the same split
        metrics = rows[label]["metrics"]
        assert metrics["teacher_test_loss"] == teacher_loss
        uniform = math.log(VOCAB)
        share = (uniform - metrics["test_loss"]) / (uniform - teacher_loss)
        assert metrics["test_recovered"] == pytest.approx(share)
    curve = rows["linear"]["curve"]  # steps 2 (transfer: its MSE), 4 and 6 (next-token loss)
    assert [row[0] for row in curve] == [2, 4, 6] and curve[0][1] < 0.1 < curve[1][1]
    recorded = rows["gla"]["environment"]["data"]  # the teacher's files, as data files
    assert {Path(p).name for p in recorded} >= {"config.json", "model.safetensors"}

    report = tmp_path / "report"
    assert main(["report", str(path), "--out", str(report)]) == 0
    assert "test_recovered" in (report / "report.md").read_text()

    config = tmp_path / "teacher" / "config.json"  # a changed teacher flags its cells
    config.resolve().write_text(config.read_text() + "\n")
    try:
        with ResultsStore(spec.store) as store:
            flagged = mixed_provenance(spec.cells, store, plugin_record([]))
        assert flagged is not None and "config.json" in flagged
    finally:
        config.resolve().write_text(config.read_text()[:-1])


@pytest.mark.parametrize(
    "size, mechanism, fragments",
    [
        ({"teacher": "nowhere"}, TEACHER, ["nowhere is no folder", "save_pretrained"]),
        ({"teacher": "arch"}, TEACHER, ["holds no *.safetensors weights"]),
        ({"teacher": "gpt2"}, TEACHER, ["is a 'gpt2' model", "llama, mistral, qwen2"]),
        ({"teacher": "empty"}, TEACHER, ["empty holds no config.json"]),
        ({}, {**LINEAR, "name": "relational"}, ["cannot be a causal LM's self-attention"]),
        ({"d_model": 32}, TEACHER, ["d_model = 32, the teacher's hidden_size is 16"]),
        (
            {},
            {**TEACHER, "kwargs": {"n_heads": 4}},
            ["n_heads = 4: a swapped standard layer", "has 2"],
        ),
        ({}, {**LINEAR, "model": {"transfer_steps": 6}}, ["leaves no step"]),
        ({}, {**TEACHER, "model": {"transfer_steps": 3}}, ["keeps the teacher's attention"]),
        ({"teacher": None, "transfer_steps": 2}, TEACHER, ["set model.teacher"]),
    ],
    ids=[
        "missing",
        "no-weights",
        "foreign",
        "not-a-model",
        "refused-swap",
        "other-size",
        "other-heads",
        "no-finetune-step",
        "standard-transfer",
        "no-teacher",
    ],  # fmt: skip
)
def test_bad_teachers_and_swaps_are_refused_before_training(
    teacher, tmp_path, size, mechanism, fragments
):
    (tmp_path / "empty").mkdir()
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (tmp_path / "teacher").symlink_to(teacher / "teacher")
    (tmp_path / "arch").symlink_to(teacher / "arch")  # a config.json, no weights
    sized = {k: v for k, v in {**SIZE, **size}.items() if v is not None}
    path = tiny_grid(tmp_path, tasks=[TASK], sizes=[sized], seeds=[0], mechanisms=[mechanism],
                     training=TRAINING)  # fmt: skip
    assert_refused(path, fragments)
    assert not (tmp_path / "tiny.sqlite").exists()


WINDOW = {"name": "sliding_window"}
ADDED_HEADS = dict(  # dual attention: the teacher's 2 heads (1 kv) and 2 relational heads
    n_heads_sa=2, n_heads_ra=2, combine="sum", sa_kwargs={"n_kv_heads": 1},
    symbol_retrieval="symbolic_attention", symbol_retrieval_kwargs={"n_symbols": 4, "n_heads": 2},
)  # fmt: skip


@pytest.mark.parametrize(
    "name, kwargs, starts_as_teacher",
    [
        ("standard", {**HEADS, "mask_mod": {**WINDOW, "window": 8}}, True),  # the whole input
        ("standard", {**HEADS, "mask_mod": {**WINDOW, "window": 1}}, False),  # itself only
        ("dual", ADDED_HEADS, True),
    ],
    ids=["window-8", "window-1", "dual-added-heads"],
)
def test_replacements_keeping_the_teachers_heads_are_swapped_in_with_its_projections(
    teacher, name, kwargs, starts_as_teacher
):
    """Standard attention with a mask mod (more kwargs than the teacher's heads) is swapped in
    with the teacher's projections, as dual attention with relational heads added is: right
    after the swap, a window covering the copy task's 8 positions, and the added heads, give
    the teacher's test loss (float32), a window of 1 does not; attention transfer trains them."""
    from attn_zoo.interop.surgery import swapped_mechanisms

    swapped = {"label": "swapped", "name": name, "kwargs": kwargs, "model": {"finetune": "none"}}
    transferred = {**swapped, "label": "transferred",
                   "model": {"transfer_steps": 4, "finetune": "none"}}  # fmt: skip
    cells = load_grid(grid(teacher, [swapped, transferred], name="kept")).cells
    model = build_cell_model(cells[0], cells[0].build_task())
    assert len(swapped_mechanisms(model.hf)) == ARCHITECTURE["num_hidden_layers"]
    right_after, after_transfer = (train_cell(cell) for cell in cells)
    assert right_after.status == "done" and right_after.metrics["steps"] == 0
    kept = right_after.metrics["test_recovered"] == pytest.approx(1.0, abs=1e-5)
    assert kept == starts_as_teacher, right_after.metrics
    assert after_transfer.status == "done"
    assert [row[0] for row in after_transfer.curve] == [2, 4]  # the transfer's MSE
    assert all(math.isfinite(row[1]) for row in after_transfer.curve)


def test_a_cell_resumed_across_the_transfer_boundary_ends_as_an_uninterrupted_one(teacher):
    lora = {**LINEAR, "label": "lora", "model": {"transfer_steps": 3, "finetune": "lora",
                                                 "lora_rank": 2}}  # fmt: skip
    (cell,) = load_grid(grid(teacher, [lora], name="resumed")).cells
    sources = {"code": source_state(), "plugins": {}}  # once, as a run's driver does
    points = {}
    plain = train_cell(cell, resume=ResumePlan(every_steps=1, sources=sources),
                       on_checkpoint=lambda step, data: points.update({step: data}))  # fmt: skip
    assert sorted(points) == [1, 2, 3, 4, 5]
    for step in (2, 3, 4):  # in the transfer, at its last step, in the fine-tuning
        resumed = train_cell(cell, resume=ResumePlan(data=points[step], sources=sources))
        assert resumed.notes == [f"resumed from its checkpoint at step {step}"]
        assert resumed.curve == plain.curve and exact(resumed.metrics) == exact(plain.metrics)


def test_a_lora_cells_stages_train_what_distil_trains(teacher):
    """A cell with transfer_steps and finetune 'lora' trains, stage by stage, the parameters
    attn_zoo.interop.distill.distil(finetune="lora") trains (the cell holds its adapters from
    the start: its projections' weights are named base_layer.weight, and only the lora stage
    trains the adapters)."""
    from ablations.grid.teacher import load_teacher
    from attn_zoo.interop.distill import distil
    from attn_zoo.interop.surgery import swap_attention

    lora = {**LINEAR, "model": {"transfer_steps": 3, "finetune": "lora", "lora_rank": 2}}
    (cell,) = load_grid(grid(teacher, [lora], name="stages")).cells
    model = build_cell_model(cell, cell.build_task())
    cells = {
        stage.name: {name.removeprefix("hf.").replace(".base_layer", "") for name in stage.trains}
        for stage in model.stages
    }
    student = swap_attention(load_teacher(teacher / "teacher"), "linear", **HEADS)
    distils = {}

    def record(stage: str, step: int, loss: float) -> None:
        trains = {name for name, p in student.named_parameters() if p.requires_grad}
        distils["lora" if stage == "finetune" else stage] = trains

    batch = cell.build_task().splits(0)["train"].inputs[:8]
    distil(load_teacher(teacher / "teacher"), student, [batch], transfer_steps=1,
           finetune_steps=1, lr=1e-3, finetune="lora", on_step=record)  # fmt: skip
    assert cells == distils
    assert not any("lora_" in name for name in cells["transfer"])
    assert any("lora_" in name for name in cells["lora"])


def test_a_distilled_cell_exports_as_a_swapped_model_with_its_test_loss(teacher, tmp_path):
    from attn_zoo.interop.surgery import load_swapped

    (tmp_path / "teacher").symlink_to(teacher / "teacher")
    lora = {**LINEAR, "model": {"transfer_steps": 3, "finetune": "lora", "lora_rank": 2}}
    path = grid(tmp_path, [lora], checkpoints=True)
    assert main(["ablate", "run", str(path), "--workers", "1"]) == 0
    spec = load_grid(path)
    export_cell(spec, tmp_path / "student")
    with ResultsStore(spec.store, readonly=True) as store:
        (row,) = store.rows()
    hf = load_swapped(tmp_path / "student")  # the swap recorded, the adapters merged
    test = spec.cells[0].build_task().splits(0)["test"]
    with torch.no_grad():
        logits = hf(input_ids=test.inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), test.targets.flatten(),
                                             ignore_index=-1)  # fmt: skip
    assert float(loss) == pytest.approx(row["metrics"]["test_loss"], rel=1e-5)


def stored_teacher(folder: Path, status: str, weight: float | None = None) -> Path:
    """A grid of one from-scratch teacher cell whose store holds it as `status` with its kept
    weights, each filled with `weight` (None: as built), and the data files it read (its
    teacher's config.json), without training it."""
    (folder / "arch").mkdir()
    (folder / "arch" / "config.json").write_text(json.dumps(ARCHITECTURE))
    mechanism = {"label": "llama", "name": "standard", "kwargs": HEADS}
    path = tiny_grid(folder, name="stored", tasks=[TASK], mechanisms=[mechanism], seeds=[0],
                     sizes=[{**SIZE, "teacher": "arch", "from_scratch": True}],
                     training=TRAINING, checkpoints=True)  # fmt: skip
    (cell,) = load_grid(path).cells
    task = cell.build_task()
    weights = build_cell_model(cell, task).state_dict()
    if weight is not None:
        weights = {name: torch.full_like(tensor, weight) for name, tensor in weights.items()}
    data = io.BytesIO()
    torch.save(weights, data)
    with ResultsStore(folder / "stored.sqlite") as store:
        store.claim(cell.config())
        store.finish(cell.key, status, metrics={}, curve=[],
                     environment={"data": data_record(cell, task)},
                     files={store.checkpoint_path(cell.key): data.getvalue()})  # fmt: skip
    return path


@pytest.mark.parametrize(
    "status, weight, fragments",
    [
        ("diverged", math.nan, ["is diverged: only a done cell's weights are exported"]),
        ("failed", None, ["is failed"]),
        ("done", math.inf, ["kept weights that are not finite in", "model.embed_tokens.weight"]),
    ],
    ids=["diverged", "failed", "done-not-finite"],
)
def test_export_refuses_a_cell_not_done_or_not_finite_and_writes_nothing(
    tmp_path, status, weight, fragments
):
    path = stored_teacher(tmp_path, status, weight)
    (key,) = {cell.key for cell in load_grid(path).cells}
    with pytest.raises(SystemExit) as exited:
        export.main([str(path), str(tmp_path / "teacher")])
    assert f"(key {key})" in str(exited.value)
    assert all(fragment in str(exited.value) for fragment in fragments)
    assert not (tmp_path / "teacher").exists()


def test_export_into_a_folder_holding_files_needs_force(tmp_path):
    path = stored_teacher(tmp_path, "done")
    out = tmp_path / "teacher"
    assert export.main([str(path), str(out)]) == 0
    (out / "README.md").write_text("a teacher trained for a week\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (out / "model.safetensors").write_bytes(b"the week's weights")
    with pytest.raises(SystemExit) as exited:
        export.main([str(path), str(out)])
    assert f"out={str(out)!r} is a folder that is not empty" in str(exited.value)
    assert "--force" in str(exited.value)
    assert (out / "model.safetensors").read_bytes() == b"the week's weights"  # untouched
    with pytest.raises(SystemExit, match="is a file"):
        export.main([str(path), str(out / "README.md")])
    assert export.main([str(path), str(out), "--force"]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_export_refuses_a_cell_whose_teacher_config_changed_since_it_trained(tmp_path, force):
    """The teacher's config.json edited after its cell trained (rope_theta 10000 -> 3): the
    weights would be saved under a model they never were (hostile pass 7, D12). Refused naming
    the file, with --force too (it is about OUT), and nothing written."""
    path = stored_teacher(tmp_path, "done")
    config = tmp_path / "arch" / "config.json"
    config.write_text(json.dumps({**ARCHITECTURE, "rope_theta": 3.0}))
    with pytest.raises(SystemExit) as exited:
        export.main([str(path), str(tmp_path / "teacher"), *["--force"] * force])
    assert f"changed: {config.resolve()}" in str(exited.value)
    assert "trained on the data files {config.json: " in str(exited.value)
    assert not (tmp_path / "teacher").exists()


def test_recovered_is_not_recorded_for_a_teacher_barely_better_than_uniform_guessing():
    """The eleventh hostile pass: a teacher 1e-4 nats below log V gave test_recovered of +-100
    (1e-6 nats: +-1e4), recorded without a note. Under 1% of log V there is none."""
    uniform = math.log(VOCAB)
    assert recovered(uniform - 0.5, uniform - 1e-4, VOCAB) is None
    assert recovered(uniform - 0.5, uniform - 0.0099 * uniform, VOCAB) is None
    teacher = uniform - 0.02 * uniform  # 2% below: recorded, the formula's value
    assert recovered(uniform - 0.01 * uniform, teacher, VOCAB) == pytest.approx(0.5)
    assert recovered(teacher, teacher, VOCAB) == 1.0
