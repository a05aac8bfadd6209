"""A teacher's cell (ablations/grid/teacher.py) on the tiny trained Llama of
tests/test_replacements.py (hostile pass 8): early stop, patience and a search's pruner judge
its last stage only, the model it reports (its transfer neither stops nor prunes it); its
attention maps are recorded (the model called uncached); a teacher whose weights lack some
of its model's, or hold others, and a lora_rank above the adapted projections' widths are
refused when the grid loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from grids import assert_refused, tiny_grid

pytest.importorskip("transformers")
pytest.importorskip("peft")

import test_replacements  # noqa: E402
from test_replacements import HEADS, SIZE, TASK, TEACHER  # noqa: E402

from ablations.grid.spec import load_grid  # noqa: E402
from ablations.run.train import train_cell  # noqa: E402

teacher = test_replacements.teacher  # its fixture: a folder holding the trained teacher/

STAGED = {"transfer_steps": 4, "finetune": "all"}  # transfer: steps 1-4, fine-tuning 5-8
TRAINING = {"steps": 8, "eval_every": 1, "batch_size": 8, "warmup_steps": 0}


def one_cell(folder: Path, mechanism: dict, training: dict | None = None, name: str = "staged"):
    """The cell of a grid in `folder` (which holds teacher/) of one `mechanism`."""
    path = tiny_grid(folder, name=name, tasks=[TASK], sizes=[SIZE], seeds=[0],
                     mechanisms=[mechanism], training={**TRAINING, **(training or {})},
                     file=f"{name}.toml")  # fmt: skip
    (cell,) = load_grid(path).cells
    return cell


def linear(model: dict) -> dict:
    return {"label": "linear", "name": "linear", "kwargs": HEADS, "model": model}


@pytest.mark.parametrize(
    "model, stop, first",
    [
        (STAGED, {"early_stop_target": 1e-3}, 5),  # reached at every evaluation
        (STAGED, {"patience": 1}, 6),  # the fine-tuning's first evaluation sets its best
        ({"transfer_steps": 4, "finetune": "none"}, {"early_stop_target": 1e-3}, 1),
    ],
    ids=["target", "patience", "transfer-only"],
)
def test_early_stop_and_patience_judge_the_last_stage_only(teacher, model, stop, first):
    """With fine-tuning after the transfer, a cell stops early no sooner than in its
    fine-tuning (it stopped at step 1, or 2 with patience 1, its fine-tuning never run); a
    transfer-only cell reports its transfer, which stops it."""
    cell = one_cell(teacher, linear(model), stop)
    result = train_cell(cell)
    assert result.status == "done"
    assert result.metrics["steps"] >= first
    if "early_stop_target" in stop:
        assert result.metrics["steps"] == first
    assert [row[0] for row in result.curve] == list(range(1, result.metrics["steps"] + 1))


def test_a_pruner_is_asked_in_the_last_stage_only(teacher):
    """A search's pruner is asked at the fine-tuning's evaluations, not the transfer's; one
    that prunes at its first question ends the cell there, after its transfer."""
    cell = one_cell(teacher, linear(STAGED))
    asked = []
    result = train_cell(cell, should_prune=lambda step, loss, metric: asked.append(step) or False)
    assert result.status == "done" and asked == [5, 6, 7]  # not the last step's
    pruned = train_cell(cell, should_prune=lambda step, loss, metric: True)
    assert pruned.status == "pruned" and pruned.metrics["pruned_at"] == 5


def test_a_swapped_cell_records_its_attention_maps(teacher):
    """A window-mask standard swapped in: its maps recorded (they were lost: the model was
    called with a cache, which attention maps refuse)."""
    window = {"label": "window", "name": "standard", "model": {"finetune": "none"},
              "kwargs": {**HEADS, "mask_mod": {"name": "sliding_window", "window": 2}}}  # fmt: skip
    cell = one_cell(teacher, window, {"steps": 2})
    result = train_cell(cell, keep_maps=True)
    assert result.status == "done" and "error" not in result.maps
    layers = [f"hf.model.layers.{i}.self_attn.mechanism" for i in range(2)]
    assert sorted(result.maps["maps"]) == layers
    (weights,) = result.maps["maps"][layers[0]].values()
    assert weights.shape == (1, 2, 8, 8)  # one example, 2 heads, the copy task's 8 positions


def test_a_teacher_whose_weights_do_not_fit_its_model_is_refused(teacher, tmp_path):
    """Weights lacking one of the model's and holding one it has not: refused naming the
    folder and both (transformers filled the missing one with fresh random values, another
    in each of the cell's two loads)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(teacher / "teacher", tmp_path / "teacher")
    weights = tmp_path / "teacher" / "model.safetensors"
    state = load_file(weights)
    state["model.extra.weight"] = state.pop("model.layers.1.self_attn.o_proj.weight")
    save_file(state, weights, metadata={"format": "pt"})
    path = tiny_grid(tmp_path, tasks=[TASK], sizes=[SIZE], seeds=[0], mechanisms=[TEACHER],
                     training=TRAINING)  # fmt: skip
    assert_refused(path, [
        f"model.teacher: {tmp_path / 'teacher'}: its weights do not fit",
        "1 missing: model.layers.1.self_attn.o_proj.weight",
        "1 not the model's: model.extra.weight",
    ])  # fmt: skip
    assert not (tmp_path / "tiny.sqlite").exists()


def test_a_lora_rank_above_the_adapted_projections_is_refused(teacher):
    """The teacher's key projection maps 16 features to 8 (1 kv head of 8): rank 8 loads,
    9 is refused naming the value and the valid range."""
    lora = {"transfer_steps": 2, "finetune": "lora"}
    one_cell(teacher, linear({**lora, "lora_rank": 8}))
    path = tiny_grid(teacher, name="rank9", tasks=[TASK], sizes=[SIZE], seeds=[0],
                     mechanisms=[linear({**lora, "lora_rank": 9})], training=TRAINING,
                     file="rank9.toml")  # fmt: skip
    assert_refused(path, ["model.lora_rank = 9 is above", "valid is 1 to 8"])


@pytest.mark.parametrize(
    ("size", "asked_at"),
    [
        ({"teacher": "t", "transfer_steps": 4, "finetune": "all"}, [5, 6, 7]),
        ({"teacher": "t", "transfer_steps": 4, "finetune": "none"}, [2, 4, 5, 6, 7]),
        ({"d_model": 16}, [2, 4, 5, 6, 7]),
    ],
)
def test_a_stored_trial_is_replayed_to_the_pruner_where_its_cell_asked(size, asked_at):
    """A search rebuilding its study from stored trials (ablations/run/search.py: _tell) asks
    the pruner at the points of a curve where the cell itself asked: in its last stage only
    (after the transfer where fine-tuning follows it), and not at a done cell's last point."""
    from types import SimpleNamespace

    from ablations.run.search import _tell

    asked, step = [], [0]

    class Trial:
        def report(self, value, at):
            step[0] = at

        def should_prune(self):
            asked.append(step[0])

    spec = SimpleNamespace(search=SimpleNamespace(table=SimpleNamespace(metric="val_loss")))
    study = SimpleNamespace(tell=lambda *args, **kwargs: None)
    curve = [(s, 0.0, 1.0, 0.5) for s in (2, 4, 5, 6, 7, 8)]
    row = {"status": "done", "curve": curve, "metrics": {"val_loss": 1.0}}
    _tell(spec, study, Trial(), SimpleNamespace(size=size), row)
    assert asked == asked_at
