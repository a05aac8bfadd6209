"""A hostile review's grid findings, refused at load: a warmup as long as a cell's training
(or a stage of it), which would never let it train at the lr it records, and labels that read
the same (Unicode normal forms, whitespace), which would give a report two rows of one name."""

import unicodedata

import pytest
from grids import SAME_PAIR, STD, XS, assert_refused, tiny_grid

from ablations.grid.cell import Cell
from ablations.grid.spec import load_grid
from ablations.run.train import lr_factor

LINEAR = {"label": "lin", "name": "linear", "kwargs": {"n_heads": 2}}
TEACHER_SIZE = {**XS, "teacher": "teacher", "from_scratch": True}  # refused before it is read


@pytest.mark.parametrize(
    ("grid", "overrides", "fragments"),
    [
        (dict(training={"steps": 20, "warmup_steps": 20}), [],
         ["training.warmup_steps = 20 (set in [training]", "not below the 20 steps of "
          "training.steps = 20", "would reach training.lr = 0.001 only at its last step",
          "Valid: training.warmup_steps < 20 (0: no warmup)"]),
        (dict(training={"steps": 20, "warmup_steps": 30}), [],
         ["training.warmup_steps = 30", "would never reach training.lr"]),
        (dict(training={"steps": 100, "warmup_steps": 30}), ["training.steps=30"],
         ["training.warmup_steps = 30", "the 30 steps of training.steps = 30"]),
        (dict(tasks=[{**SAME_PAIR, "training": {"steps": 10}}],
              training={"steps": 100, "warmup_steps": 15}), [],
         ["warmup_steps = 15", "the 10 steps of training.steps = 10", "task 'same_pair'"]),
        (dict(mechanisms=[{**STD, "sweep": {"training": {"warmup_steps": [2, 20]}}}]), [],
         ["training.warmup_steps = 20 (swept)", "mechanism 'std'", "training.warmup_steps 20"]),
        (dict(tasks=[{**SAME_PAIR, "training": {"epochs": 1}}], training={"warmup_steps": 8}),
         [], ["warmup_steps = 8 (set in", "the 8 steps of training.epochs = 1 (8 steps an "
              "epoch)"]),  # 128 examples, batches of 16
        (dict(tasks=[{**SAME_PAIR, "training": {"epochs": 2}}]), [],
         ["warmup_steps = 50 (unset: its default, 50 where training.steps > 50 or epochs are set",
          "the 16 steps of training.epochs = 2 (8 steps an epoch)"]),
        (dict(sizes=[{**TEACHER_SIZE, "transfer_steps": 10}], mechanisms=[LINEAR],
              training={"steps": 40, "warmup_steps": 12}), [],
         ["warmup_steps = 12", "the 10 steps of model.transfer_steps = 10 (attention transfer)"]),
        (dict(sizes=[{**TEACHER_SIZE, "transfer_steps": 30}], mechanisms=[LINEAR],
              training={"steps": 40, "warmup_steps": 12}), [],
         ["the 10 steps of training.steps = 40 less model.transfer_steps = 30 (finetune 'all')"]),
    ],
    ids=["equal", "longer", "set", "task", "swept", "epochs", "epochs-unset", "transfer",
         "finetune"],
)  # fmt: skip
def test_a_warmup_not_shorter_than_training_is_refused(tmp_path, grid, overrides, fragments):
    path = tiny_grid(tmp_path, seeds=[0], **{"mechanisms": [STD], **grid})
    assert_refused(path, fragments, overrides)


@pytest.mark.parametrize("steps", [1, 5, 20, 50, 51, 60, 500])
def test_an_unset_warmup_ends_before_training_does(tmp_path, steps):
    (cell,) = load_grid(
        tiny_grid(tmp_path, seeds=[0], mechanisms=[STD], training={"steps": steps})
    ).cells
    training = cell.training
    factors = [lr_factor(step, training) for step in range(steps)]
    assert max(factors) == 1.0 and (steps == 1 or factors.index(1.0) < steps - 1)
    assert training.warmup_steps == (50 if steps > 50 else steps // 10)


def test_a_warmup_of_one_step_is_none_and_accepted(tmp_path):
    (cell,) = load_grid(
        tiny_grid(tmp_path, seeds=[0], mechanisms=[STD], training={"steps": 1, "warmup_steps": 1})
    ).cells
    assert lr_factor(0, cell.training) == 1.0


def test_an_unset_warmup_keys_a_cell_as_the_default_50_did():
    def cell(**training) -> Cell:
        return Cell("g", "t", "same_pair", {}, dict(XS), "m", "standard", {}, training, 0)

    assert cell(steps=60).key == cell(steps=60, warmup_steps=50).key
    assert cell().key == cell(warmup_steps=50).key


NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
ENTRIES = {  # two entries of each kind, labelled `a` and `b`
    "tasks": lambda a, b: [{**SAME_PAIR, "label": a}, {**SAME_PAIR, "label": b}],
    "sizes": lambda a, b: [{**XS, "label": a}, {**XS, "label": b, "d_model": 32}],
    "mechanisms": lambda a, b: [{**STD, "label": a}, {**LINEAR, "label": b}],
}


@pytest.mark.parametrize("kind", ENTRIES)
def test_labels_that_differ_only_in_unicode_normal_form_are_refused(tmp_path, kind):
    assert NFC != NFD
    path = tiny_grid(tmp_path, **{kind: ENTRIES[kind](NFC, NFD)})
    assert_refused(path, [f"{kind}[1].label = {NFD!r} repeats {kind}[0].label = {NFC!r}",
                          r"Unicode NFKC ('cafe\u0301' and 'caf\xe9')"])  # fmt: skip


@pytest.mark.parametrize("kind", ENTRIES)
def test_a_full_width_label_is_the_same_label(tmp_path, kind):
    """The sixth pass: "std" and "ｓtd" (a full-width s, the same under NFKC) were two rows
    that read alike."""
    path = tiny_grid(tmp_path, **{kind: ENTRIES[kind]("std", "\uff53td")})
    assert_refused(path, [f"{kind}[1].label = '\uff53td' repeats {kind}[0].label = 'std'"])


@pytest.mark.parametrize("kind", ENTRIES)
@pytest.mark.parametrize("label", ["std\u200b", "s\u200dtd", "std\x07"])
def test_labels_with_invisible_characters_are_refused(tmp_path, kind, label):
    """The sixth pass: "std\u200b" (a zero-width space) read as "std" in the report."""
    path = tiny_grid(tmp_path, **{kind: ENTRIES[kind]("std", label)})
    assert_refused(path, [f"{kind}[1].label = {label!r} must be a non-empty str without "
                          "leading or trailing whitespace or invisible"])  # fmt: skip


@pytest.mark.parametrize("kind", ENTRIES)
@pytest.mark.parametrize("label", ["std ", " std", "std\t", "std\u00a0"])
def test_labels_with_whitespace_around_them_are_refused(tmp_path, kind, label):
    path = tiny_grid(tmp_path, **{kind: ENTRIES[kind]("std", label)})
    assert_refused(path, [f"{kind}[1].label = {label!r} must be a non-empty str without "
                          "leading or trailing whitespace"])  # fmt: skip
