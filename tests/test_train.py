"""Training one cell: deterministic on CPU, early stop (target, patience), epochs, divergence,
every task kind, bf16 autocast and torch.compile."""

import dataclasses
import io

import pytest
import torch
from grids import STD, tiny_grid

from ablations.grid.cell import Cell
from ablations.grid.schema import TrainingSettings
from ablations.grid.spec import load_grid
from ablations.results.store import ResultsStore
from ablations.run.runner import run_grid
from ablations.run.train import MAPS_EXAMPLE, forward, lr_factor, train_cell
from ablations.tasks import IGNORE_INDEX, build_task


def cell(**changes):
    base = Cell(
        grid="t",
        task="same_pair",
        task_name="same_pair",
        task_kwargs=dict(n_train=256, n_validation=64, n_test=64),
        size=dict(label="s", d_model=16, n_layers=1),
        mechanism="std",
        mechanism_name="standard",
        mechanism_kwargs=dict(n_heads=2),
        training=dict(steps=30, eval_every=10, batch_size=16),
        seed=0,
    )
    return dataclasses.replace(base, **changes)


def test_same_seed_same_metrics_and_curve():
    a, b = train_cell(cell()), train_cell(cell())
    assert a.status == "done" and a.curve == b.curve
    assert a.metrics["test_acc"] == b.metrics["test_acc"] and a.metrics["steps"] == 30
    assert [row[0] for row in a.curve] == [10, 20, 30]
    assert train_cell(cell(seed=1)).curve != a.curve


def test_early_stop_at_the_target():
    result = train_cell(
        cell(
            training=dict(
                steps=30,
                eval_every=10,
                batch_size=16,
                early_stop_target=0.01,
            )
        )
    )
    assert result.metrics["steps"] == 10 and len(result.curve) == 1


def test_divergence_is_recorded_at_its_step():
    wild = dict(
        steps=30,
        eval_every=10,
        batch_size=16,
        lr=1e30,
        warmup_steps=1,
        grad_clip=1e30,
    )
    result = train_cell(cell(training=wild))
    assert result.status == "diverged" and 1 < result.metrics["diverged_at"] <= 30
    assert "test_acc" not in result.metrics


@pytest.mark.parametrize(
    ("task", "kwargs", "mechanism", "mech_kwargs"),
    [
        (
            "mqar",
            dict(
                vocab_size=32, seq_len=16, num_kv_pairs=2, n_train=128, n_validation=32, n_test=32
            ),
            "standard",
            dict(n_heads=2),
        ),
        (
            "match_pattern",
            dict(n_train=128, n_validation=32, n_test=32),
            "dual",
            dict(
                n_heads_sa=1,
                n_heads_ra=1,
                symbol_retrieval="positional_symbols",
                symbol_retrieval_kwargs=dict(max_length=8),
            ),
        ),
        (  # fresh object vectors: the classifier embeds vectors (input_dim)
            "match_pattern",
            dict(objects="vectors", object_dim=4, n_train=128, n_validation=32, n_test=32),
            "relational",
            dict(
                n_heads=2,
                symbol_retrieval="positional_symbols",
                symbol_retrieval_kwargs=dict(max_length=6),
            ),
        ),  # fmt: skip
    ],
)
def test_both_task_kinds_and_symbolic_mechanisms(task, kwargs, mechanism, mech_kwargs):
    result = train_cell(
        cell(
            task=task,
            task_name=task,
            task_kwargs=kwargs,
            mechanism_name=mechanism,
            mechanism_kwargs=mech_kwargs,
        )
    )
    assert result.status == "done" and 0 <= result.metrics["test_acc"] <= 1
    assert result.metrics["params"] > 0 and result.environment["torch"]


def test_schedule_warms_up_then_decays():
    t = TrainingSettings(steps=100, warmup_steps=10)
    assert lr_factor(0, t) == 0.1 and lr_factor(9, t) == 1.0
    assert lr_factor(55, t) == pytest.approx(0.5) and lr_factor(100, t) == pytest.approx(0.0)
    assert lr_factor(60, t.model_copy(update={"schedule": "constant"})) == 1.0


def test_seq2seq_is_teacher_forced_and_scored_on_the_next_target():
    task = build_task("arithmetic", max_digits=1)
    x, y = task.generate(4, torch.Generator().manual_seed(0))
    seen = {}

    class Echo(torch.nn.Module):
        def forward(self, src, decoder_in, targets):
            seen.update(src=src, decoder_in=decoder_in, targets=targets)
            return torch.zeros(*targets.shape, task.vocab_size), torch.zeros(())

    _, _, scored = forward(Echo(), task, x, y)
    assert torch.equal(seen["src"], x) and torch.equal(scored, y[:, 1:])
    assert torch.equal(seen["targets"], y[:, 1:])
    assert seen["decoder_in"][:, 0].eq(task.start_token).all()
    padded = y[:, :-1] == IGNORE_INDEX
    assert seen["decoder_in"][padded].eq(task.pad_token).all()
    assert torch.equal(seen["decoder_in"][~padded], y[:, :-1][~padded])


@pytest.mark.slow  # 300 steps each (about 60 s together): `make test-slow`
@pytest.mark.parametrize(
    ("task", "kwargs", "metric", "floor"),
    [
        # 100 distinct sums of two digits: most test sums were seen; exact = whole answer right
        ("arithmetic", dict(max_digits=1, n_train=100, n_validation=100, n_test=100), "exact", 0.5),
        ("relational_games", dict(problem="left_of", n_train=500, n_validation=100, n_test=100),
         "acc", 0.8),
    ],
)  # fmt: skip
def test_seq2seq_and_image_cells_learn(task, kwargs, metric, floor):
    training = dict(steps=300, eval_every=100, batch_size=32, lr=3e-3)
    result = train_cell(
        cell(task=task, task_name=task, task_kwargs=kwargs, size=dict(label="s", d_model=32,
             n_layers=1), training=training)
    )  # fmt: skip
    assert result.status == "done"
    assert result.metrics[f"test_{metric}"] > floor  # chance: ~0 (exact) and 0.5 (acc)


def test_keep_maps_records_the_trained_model_on_one_test_example_and_changes_nothing_else():
    plain, kept = train_cell(cell()), train_cell(cell(), keep_state=True, keep_maps=True)
    timing = {"wall_s", "step_ms"}
    assert plain.maps is None and kept.state is not None
    assert {k: v for k, v in kept.metrics.items() if k not in timing} == {
        k: v for k, v in plain.metrics.items() if k not in timing
    }
    assert kept.curve == plain.curve
    test = build_task("same_pair", n_train=256, n_validation=64, n_test=64).splits(0)["test"]
    record = kept.maps
    assert record["example"] == MAPS_EXAMPLE == 0 and "error" not in record
    assert record["labels"] == [str(int(t)) for t in test.inputs[0]]
    assert record["target"] == test.targets[0].tolist()
    (weights,) = [kinds["attention"] for kinds in record["maps"].values()]
    assert weights.shape == (1, 2, test.inputs.shape[1], test.inputs.shape[1])
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2, test.inputs.shape[1]))

    linear = train_cell(cell(mechanism_name="linear"), keep_maps=True)
    assert linear.status == "done" and linear.maps["maps"] == {}  # no weights to record
    wild = dict(steps=30, eval_every=10, batch_size=16, lr=1e30,
                warmup_steps=1, grad_clip=1e30)  # fmt: skip
    diverged = train_cell(cell(training=wild), keep_maps=True)
    assert diverged.status == "diverged" and diverged.maps is None


def test_patience_stops_once_the_validation_metric_stops_improving(tmp_path):
    # lr so small that the weights do not move: validation accuracy is the same at every
    # evaluation, so the first sets the best and `patience` more end the cell
    training = {"steps": 100, "eval_every": 5, "lr": 1e-12, "patience": 2}
    path = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training=training)
    (plateau,) = load_grid(path).cells
    result = train_cell(plateau)
    assert result.status == "done" and result.metrics["steps"] == 15
    assert [row[0] for row in result.curve] == [5, 10, 15]
    assert len({row[3] for row in result.curve}) == 1  # the plateau
    assert "test_acc" in result.metrics  # a cell stopped early is a finished cell
    off = train_cell(dataclasses.replace(plateau, training=dict(plateau.training, patience=0)))
    assert off.metrics["steps"] == 100  # patience 0: never stops early


def test_patience_counts_evaluations_since_the_best_not_since_the_first():
    # learning: accuracy improves now and then, and each improvement restarts the count
    t = dict(steps=60, eval_every=5, batch_size=16, lr=3e-3, warmup_steps=0)
    full = train_cell(cell(training=t))
    patience, best, stale, stop = 3, -1.0, 0, len(full.curve)
    for i, row in enumerate(full.curve):
        best, stale = (row[3], 0) if row[3] > best else (best, stale + 1)
        if stale >= patience:
            stop = i + 1
            break
    assert stop > patience + 1  # the case this test is for: the best moved after the first
    stopped = train_cell(cell(training=dict(t, patience=patience)))
    assert stopped.curve == full.curve[:stop] and stopped.metrics["steps"] == 5 * stop


def test_a_cell_of_epochs_trains_its_resolved_steps(tmp_path):
    path = tiny_grid(
        tmp_path, mechanisms=[STD], seeds=[0], training={"warmup_steps": 0}
    )  # n_train 128, batch_size 16
    path.write_text(path.read_text().replace("steps = 20", "epochs = 2"))
    (two_epochs,) = load_grid(path).cells
    assert two_epochs.training.steps == 2 * 8
    result = train_cell(two_epochs)
    assert result.metrics["steps"] == 16 and [row[0] for row in result.curve] == [10, 16]


def test_the_environment_records_the_device_and_dtype_trained_on():
    plain = train_cell(cell(training=dict(cell().training, steps=5)))
    assert plain.environment["device"] == "cpu" and plain.environment["dtype"] == "float32"


def test_bf16_on_the_cpu_trains_under_autocast_and_keeps_float32_weights():
    t = dict(steps=30, eval_every=10, batch_size=16, precision="bf16")
    result = train_cell(cell(training=t), keep_state=True, keep_maps=True)
    assert result.status == "done" and result.environment["dtype"] == "bfloat16"
    assert result.environment["device"] == "cpu"
    assert all(v.dtype == torch.float32 for v in result.state.values() if v.is_floating_point())
    (weights,) = [kinds["attention"] for kinds in result.maps["maps"].values()]
    assert weights.dtype == torch.float32 and weights.device.type == "cpu"
    eager = train_cell(cell())  # bf16 rounds, but trains the same model to about the same loss
    assert result.curve[-1][2] == pytest.approx(eager.curve[-1][2], abs=0.05)


def test_compile_trains_to_the_eager_metrics():
    # inductor on the CPU: up to 40 s for one tiny cell (its training and evaluation graphs)
    t = dict(steps=20, eval_every=10, batch_size=16)
    small = dict(n_train=128, n_validation=32, n_test=32)
    eager = train_cell(cell(task_kwargs=small, training=t))
    compiled = train_cell(cell(task_kwargs=small, training=dict(t, compile=True)), keep_state=True)
    assert compiled.status == "done"
    assert [row[0] for row in compiled.curve] == [row[0] for row in eager.curve]
    for got, want in zip(compiled.curve, eager.curve, strict=True):
        assert got[1:] == pytest.approx(want[1:], abs=1e-4)
    for name in ("test_loss", "test_acc", "val_loss", "val_acc"):
        assert compiled.metrics[name] == pytest.approx(eager.metrics[name], abs=1e-4), name
    assert not any(k.startswith("_orig_mod") for k in compiled.state)  # the model's own keys


def test_betas_reach_the_optimizer_and_grad_clip_0_does_not_clip(monkeypatch):
    made, clipped = [], []
    adamw, clip = torch.optim.AdamW, torch.nn.utils.clip_grad_norm_

    def spy_adamw(params, **kwargs):
        made.append(kwargs)
        return adamw(params, **kwargs)

    def spy_clip(params, bound, *args, **kwargs):
        clipped.append(bound)
        return clip(params, bound, *args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", spy_adamw)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy_clip)
    training = dict(steps=3, eval_every=3, batch_size=8)
    train_cell(cell(training=dict(training, betas=[0.5, 0.75], grad_clip=0.0)))
    assert made[-1]["betas"] == (0.5, 0.75) and clipped == []
    train_cell(cell(training=dict(training, grad_clip=2.0)))  # defaults: (0.9, 0.999), clipped
    assert made[-1]["betas"] == (0.9, 0.999) and clipped == [2.0] * 3


def test_every_test_split_of_the_task_is_evaluated():
    games = cell(
        task="games",
        task_name="relational_games",
        task_kwargs=dict(problem="same", cell_size=5, n_train=32, n_validation=16, n_test=16),
        training=dict(steps=2, eval_every=2, batch_size=8),
    )
    metrics = train_cell(games).metrics
    for split in ("test", "test_id", "test_ood"):
        assert 0 <= metrics[f"{split}_acc"] <= 1 and metrics[f"{split}_loss"] > 0


def test_a_last_update_that_makes_the_weights_nan_is_diverged_not_done(tmp_path):
    """The loss is checked before each update: with one step at lr 1e30 the only update makes
    the weights NaN, and the validation and test metrics come out NaN (accuracy 0.5, the
    argmax of NaN logits). Such a cell is diverged, and the store refuses it as done."""
    wild = {"steps": 1, "eval_every": 1, "lr": 1e30, "warmup_steps": 0, "grad_clip": 0.0}
    path = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0], training=wild)
    (nan_cell,) = load_grid(path).cells
    result = train_cell(nan_cell)
    assert result.status == "diverged" and result.metrics["diverged_at"] == 1
    assert not any(key.startswith("test") for key in result.metrics)
    assert run_grid(load_grid(path), workers=1, out=io.StringIO())["diverged"] == 1
    (row,) = ResultsStore(load_grid(path).store, readonly=True).rows()
    assert row["status"] == "diverged"
    store = ResultsStore(tmp_path / "guard.sqlite")
    key = store.claim(nan_cell.config())
    with pytest.raises(ValueError, match="val_loss are not finite; a result is done only"):
        store.finish(key, "done", {"val_loss": float("nan"), "val_acc": 0.5})


def test_a_language_model_cell_records_the_loss_floor_of_its_own_splits():
    """A finished cell of a task that knows its floor records it (the report reads it there):
    the mean of the task's best losses on the very validation and test splits of its seed."""
    grammar = {"length": 8, "n_train": 32, "n_validation": 8, "n_test": 8}
    done = train_cell(
        cell(task_name="grammar", task_kwargs=grammar, training=dict(steps=2, eval_every=2))
    )
    task = build_task("grammar", **grammar)
    splits = task.splits(0)  # the cell's seed
    for split in ("validation", "test"):
        expected = float(task.best_losses(*splits[split][:]).mean())
        assert done.metrics[f"loss_floor_{split}"] == expected > 0
    plain = train_cell(cell(training=dict(steps=2, eval_every=2)))
    assert not [name for name in plain.metrics if name.startswith("loss_floor")]
