"""Training one cell: deterministic on CPU, early stop, divergence, both task kinds."""

import dataclasses

import pytest
import torch

from ablations.spec import TRAINING_DEFAULTS, Cell
from ablations.tasks import IGNORE_INDEX, build_task
from ablations.train import MAPS_EXAMPLE, forward, lr_factor, train_cell


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
        training=dict(TRAINING_DEFAULTS, steps=30, eval_every=10, batch_size=16),
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
                TRAINING_DEFAULTS,
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
        TRAINING_DEFAULTS,
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
    t = dict(TRAINING_DEFAULTS, steps=100, warmup_steps=10)
    assert lr_factor(0, t) == 0.1 and lr_factor(9, t) == 1.0
    assert lr_factor(55, t) == pytest.approx(0.5) and lr_factor(100, t) == pytest.approx(0.0)
    assert lr_factor(60, dict(t, schedule="constant")) == 1.0


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
    training = dict(TRAINING_DEFAULTS, steps=300, eval_every=100, batch_size=32, lr=3e-3)
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
    wild = dict(TRAINING_DEFAULTS, steps=30, eval_every=10, batch_size=16, lr=1e30,
                warmup_steps=1, grad_clip=1e30)  # fmt: skip
    diverged = train_cell(cell(training=wild), keep_maps=True)
    assert diverged.status == "diverged" and diverged.maps is None
