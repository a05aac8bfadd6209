"""Sweeps over any key: [sweep] and per-task / per-mechanism sweeps and overrides, model options,
include/exclude over swept keys, --set on list entries, and what they key in the store."""

import pytest
import torch
from grids import REL, SAME_PAIR, STD, XS, assert_refused, tiny_grid

from ablations.grid.cell_model import build_cell_model
from ablations.grid.spec import SpecError, load_grid
from ablations.results.store import ResultsStore
from ablations.run.status import grid_status
from ablations.tasks import build_task
from attn_zoo.models.positional import RotaryPositions

SWEEP = """
[sweep]
training.lr = [1e-3, 3e-3]
model.pos_enc = ["learned", "rope"]
"""


def grid(tmp_path, extra: str = "", **kwargs):
    """The tiny grid (std and rel, seeds 0 and 1) with `extra` TOML appended."""
    path = tiny_grid(tmp_path, **kwargs)
    path.write_text(path.read_text() + extra)
    return path


def test_a_sweep_crosses_every_swept_value_with_the_other_axes(tmp_path):
    cells = load_grid(grid(tmp_path, SWEEP)).cells
    assert len(cells) == 2 * 2 * 2 * 2  # mechanisms x lr x pos_enc x seeds
    assert len({c.key for c in cells}) == len(cells)
    labels = {tuple(c.labels.items()) for c in cells}
    assert (
        ("task", "same_pair"), ("size", "xs"), ("mechanism", "rel"), ("training.lr", 3e-3),
        ("model.pos_enc", "rope"), ("seed", 1),
    ) in labels  # fmt: skip
    for cell in cells:
        assert cell.training.lr == cell.labels["training.lr"]
        assert cell.size["pos_enc"] == cell.labels["model.pos_enc"]


def test_a_swept_value_equal_to_the_grid_setting_keeps_the_cell_key(tmp_path):
    plain = {c.labels["mechanism"]: c.key for c in load_grid(grid(tmp_path)).cells}
    swept = load_grid(grid(tmp_path, "[sweep]\ntraining.lr = [1e-3, 1e-2]\n")).cells
    same = [c for c in swept if c.training.lr == 1e-3]
    assert {c.key for c in same} == {c.key for c in load_grid(grid(tmp_path)).cells}
    assert plain  # and the others are new cells
    assert not {c.key for c in swept if c.training.lr == 1e-2} & set(plain.values())


def test_a_store_written_without_sweeps_serves_the_cells_a_sweep_shares(tmp_path):
    store = ResultsStore(tmp_path / "tiny.sqlite")
    for cell in load_grid(grid(tmp_path)).cells:  # as an earlier run finished them
        key = store.claim(cell.config())
        store.finish(key, "done", {"steps": 20, "test_acc": 0.5}, [], {})
    status = grid_status(load_grid(grid(tmp_path, "[sweep]\ntraining.lr = [1e-3, 1e-2]\n")))
    assert list(status.columns[:6]) == ["key", "task", "size", "mechanism", "training.lr", "seed"]
    by_lr = status.groupby("training.lr").status.agg(set).to_dict()
    assert by_lr == {1e-3: {"done"}, 1e-2: {"todo"}}


def test_a_mechanism_sweep_replaces_the_grid_sweep_of_its_key_and_beats_fixed_values(tmp_path):
    rel = {**REL, "training": {"lr": 5e-3, "batch_size": 8}, "sweep": {"training": {"lr": [1e-2]}}}
    path = grid(tmp_path, "[sweep]\ntraining.lr = [1e-3, 3e-3]\n", mechanisms=[STD, rel])
    cells = load_grid(path).cells
    lrs = {m: sorted({c.training.lr for c in cells if c.mechanism == m}) for m in ("std", "rel")}
    assert lrs == {"std": [1e-3, 3e-3], "rel": [1e-2]}
    assert {c.training.batch_size for c in cells if c.mechanism == "rel"} == {8}
    assert {c.training.batch_size for c in cells if c.mechanism == "std"} == {16}


def test_steps_and_epochs_are_one_setting_across_levels(tmp_path):
    rel = {**REL, "training": {"epochs": 2, "warmup_steps": 1}}  # the grid says steps = 20
    cells = load_grid(grid(tmp_path, mechanisms=[STD, rel], seeds=[0])).cells
    by = {c.mechanism: c.config()["training"] for c in cells}  # as each is keyed
    assert by["std"]["steps"] == 20 and "epochs" not in by["std"]
    assert by["rel"]["epochs"] == 2 and by["rel"]["steps"] == 2 * 128 // 16  # n_train 128
    swept = grid(
        tmp_path,
        "[sweep]\ntraining.epochs = [1, 3]\n",
        seeds=[0],
        file="e.toml",
        training={"warmup_steps": 0},
    )
    assert sorted({c.training.steps for c in load_grid(swept).cells}) == [8, 24]


def test_a_task_kwarg_sweep_resolves_epochs_per_training_set_size(tmp_path):
    path = grid(tmp_path, "[sweep]\ntask_kwargs.n_train = [64, 256]\n", seeds=[0],
                training={"epochs": 1, "warmup_steps": 0})  # fmt: skip
    path.write_text(path.read_text().replace("steps = 20\n", ""))
    cells = load_grid(path).cells
    assert {(c.task_kwargs["n_train"], c.training.steps) for c in cells} == {(64, 4), (256, 16)}


def test_model_options_reach_the_model(tmp_path):
    path = grid(tmp_path, '[model]\npos_enc = "rope"\nactivation = "swiglu"\nbias = false\n')
    cell = load_grid(path).cells[0]
    assert {"pos_enc": "rope", "activation": "swiglu", "bias": False}.items() <= cell.size.items()
    model = build_cell_model(cell, build_task(cell.task_name, **cell.task_kwargs))
    assert any(isinstance(m, RotaryPositions) for m in model.modules())
    assert model.config.activation == "swiglu" and model.config.bias is False


def test_a_size_or_mechanism_sets_model_options_for_its_own_cells(tmp_path):
    xs = {"label": "xs", "d_model": 16, "n_layers": 1, "norm_type": "rmsnorm"}
    rel = {**REL, "model": {"norm_first": False}}
    cells = load_grid(grid(tmp_path, sizes=[xs], mechanisms=[STD, rel], seeds=[0])).cells
    by = {c.mechanism: c.size for c in cells}
    assert by["std"]["norm_type"] == by["rel"]["norm_type"] == "rmsnorm"
    assert by["rel"]["norm_first"] is False and "norm_first" not in by["std"]


def test_an_option_the_tasks_model_does_not_take_is_refused_at_load(tmp_path):
    lm = {"name": "grammar", "kwargs": {"n_train": 64, "n_validation": 16, "n_test": 16}}
    path = grid(tmp_path, '[model]\npool = "first"\n', tasks=[lm], mechanisms=[STD])
    with pytest.raises(SpecError, match=r"model of task 'grammar'.*pool.*language_model"):
        load_grid(path)


def test_include_and_exclude_name_swept_keys(tmp_path):
    rules = """
[grid]
exclude = [{ mechanism = "std", training.lr = 3e-3 }]
include = [{ task = "same_pair", size = "xs", mechanism = "std", seed = 7, training.lr = 1e-2 }]
"""
    cells = load_grid(grid(tmp_path, "[sweep]\ntraining.lr = [1e-3, 3e-3]\n" + rules)).cells
    std = sorted((c.training.lr, c.seed) for c in cells if c.mechanism == "std")
    assert std == [(1e-3, 0), (1e-3, 1), (1e-2, 7)]
    assert len([c for c in cells if c.mechanism == "rel"]) == 4
    included = next(c for c in cells if c.seed == 7)
    assert included.labels["training.lr"] == 1e-2


def test_an_include_leaving_out_a_swept_key_takes_each_of_its_values(tmp_path):
    rules = '[grid]\ninclude = [{ task = "same_pair", size = "xs", mechanism = "rel", seed = 9 }]\n'
    cells = load_grid(grid(tmp_path, "[sweep]\ntraining.lr = [1e-3, 3e-3]\n" + rules)).cells
    assert sorted(c.training.lr for c in cells if c.seed == 9) == [1e-3, 3e-3]


def test_set_addresses_list_entries_and_swept_keys(tmp_path):
    path = grid(tmp_path, SWEEP)
    spec = load_grid(path, ["mechanisms[0].kwargs.n_heads=4", "sweep.training.lr=[1e-2]",
                            "sweep.model.pos_enc=['rope']"])  # fmt: skip
    cells = spec.cells
    assert {c.mechanism_kwargs["n_heads"] for c in cells if c.mechanism == "std"} == {4}
    assert {(c.training.lr, c.size["pos_enc"]) for c in cells} == {(1e-2, "rope")}
    spec = load_grid(path, ["tasks[0].kwargs.n_train=96"])
    assert {c.task_kwargs["n_train"] for c in spec.cells} == {96}


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["mechanisms[2].kwargs.n_heads=4"], ["mechanisms[2] does not exist", "has 2 entries"]),
        (["seeds[0].x=1"], ["seeds[0] is not a table"]),
        (["mechanisms.0.kwargs=1"], ["mechanisms is not a table"]),
        (["tasks[x].name=a"], ["'tasks[x]' is not a key"]),
    ],
)
def test_set_on_a_missing_entry_names_it(tmp_path, overrides, fragments):
    path = grid(tmp_path)
    with pytest.raises(SpecError) as err:
        load_grid(path, overrides)
    for fragment in fragments:
        assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("override", "where", "hint"),
    [
        ("mechanisms[0].training.lr=3e-3", "[sweep]", "mechanisms[0].sweep.training.lr=[3e-3]"),
        ("training.lr=3e-3", "[sweep]", "sweep.training.lr=[3e-3]"),
        ("mechanisms[1].model.pos_enc=rope", "[sweep]", "mechanisms[1].sweep.model.pos_enc=[rope]"),
    ],
)
def test_a_set_that_a_sweep_overrides_is_refused_with_the_set_that_works(
    tmp_path, override, where, hint
):
    """`ablate best` prints such lines for a second-stage grid: the grid's [sweep] of the same
    key used to win silently, every cell at the swept values."""
    path = grid(tmp_path, SWEEP)
    with pytest.raises(SpecError) as err:
        load_grid(path, [override])
    assert f"--set {override} is overridden where {where} sweeps" in str(err.value)
    assert f"--set '{hint}'" in str(err.value)
    if override.startswith("mechanisms[0]"):  # the hint does what the line meant
        cells = load_grid(path, [hint.replace("=[3e-3]", "=[0.003]")]).cells
        assert {c.training.lr for c in cells if c.mechanism == "std"} == {3e-3}
        assert {c.training.lr for c in cells if c.mechanism == "rel"} == {1e-3, 3e-3}


def test_a_set_inside_a_swept_table_is_refused(tmp_path):
    """The hostile pass: a window --set inside a mask_mod table that a sweep replaces whole
    was dropped (every cell at the swept tables)."""
    masks = '[{ name = "sliding_window", window = 2 }, { name = "sliding_window", window = 3 }]'
    path = grid(tmp_path, f"[sweep]\nmechanism_kwargs.mask_mod = {masks}\n")
    override = "mechanisms[0].kwargs.mask_mod.window=64"
    with pytest.raises(SpecError) as err:
        load_grid(path, [override])
    assert f"--set {override} (inside mechanisms[0].kwargs.mask_mod) is overridden" in str(
        err.value
    )
    assert "mechanisms[0].sweep.mechanism_kwargs.mask_mod=[{window = 64, ...}]" in str(err.value)


@pytest.mark.parametrize(
    ("entry", "override", "where"),
    [
        ({"tasks": {"training": {"steps": 7}}}, "training.steps=5",
         "tasks[0].training sets steps = 7"),
        ({"tasks": {"training": {"epochs": 1}}}, "training.steps=5",
         "tasks[0].training sets epochs = 1"),
        ({"tasks": {"model": {"pos_enc": "rope"}}}, "model.pos_enc=learned",
         'tasks[0].model sets pos_enc = "rope"'),
        ({"sizes": {"pos_enc": "rope"}}, "model.pos_enc=learned", 'sizes[0] sets pos_enc = "rope"'),
        ({"mechanisms": {"training": {"lr": 0.01}}}, "tasks[0].training.lr=0.5",
         "mechanisms[0].training sets lr = 0.01"),
    ],
)  # fmt: skip
def test_a_set_that_a_more_specific_table_overrides_is_refused(tmp_path, entry, override, where):
    """The hostile pass: on demo.toml, --set training.steps=50 left mqar's 600 steps (its task
    entry's training table) in place; the --set it names sets both."""
    ((table, fields),) = entry.items()
    default = {"tasks": SAME_PAIR, "sizes": XS, "mechanisms": STD}[table]
    path = tiny_grid(tmp_path, **{table: [{**default, **fields}]})
    with pytest.raises(SpecError) as err:
        load_grid(path, [override])
    assert f"--set {override} is overridden where {where}" in str(err.value)
    if "epochs" in where:
        assert "steps and epochs are one setting: change tasks[0].training.epochs" in str(err.value)
        return
    working = str(err.value).split("add --set '")[1].rstrip("'")
    load_grid(path, [override, working])  # both: no error


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ("sweep.training.lr=[1e-2, 3e-2]", "tasks[0].sweep sweeps training.lr"),
        ("sweep.training={lr = [1e-2]}", "tasks[0].sweep sweeps training.lr"),
        ("tasks[0].sweep.training.lr=[1e-2]", "mechanisms[0].sweep sweeps training.lr"),
    ],
)
def test_a_set_of_a_sweep_that_a_more_specific_sweep_replaces_is_refused(tmp_path, override, where):
    """The hostile pass: --set 'sweep.training.lr=[...]' on a grid whose task sweeps lr ran
    the task's own rates; the --set it names sweeps both."""
    task = {**SAME_PAIR, "sweep": {"training": {"lr": [3e-3]}}}
    mechanism = {**STD, "sweep": {"training": {"lr": [1e-3]}}}
    mechanisms = [mechanism] if override.startswith("tasks") else [STD]
    path = tiny_grid(tmp_path, tasks=[task], mechanisms=mechanisms)
    with pytest.raises(SpecError) as err:
        load_grid(path, [override])
    assert f"--set {override} is overridden where {where}" in str(err.value)
    working = str(err.value).split("add --set '")[1].rstrip("'")
    lrs = {c.training.lr for c in load_grid(path, [override, working]).cells}
    assert lrs == {1e-2, 3e-2} if "3e-2" in override else lrs == {1e-2}


def test_a_set_no_sweep_reaches_applies(tmp_path):
    path = grid(tmp_path, '[sweep]\nmodel.pos_enc = ["learned", "rope"]\n')
    cells = load_grid(path, ["mechanisms[0].training.lr=3e-3"]).cells
    assert {c.training.lr for c in cells if c.mechanism == "std"} == {3e-3}


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        ("[sweep]\ntraining.lrr = [1e-3]\n", ["sweep.training.lrr (key)", "Did you mean 'lr'"]),
        ("[sweep]\ntraining.lr = [1e-3, -1.0]\n", ["sweep.training.lr[1] = -1.0", "float > 0"]),
        ("[sweep]\ntraining.lr = [1e-3, 1e-3]\n", ["sweep.training.lr[1] = 0.001", "distinct"]),
        ("[sweep]\ntraining.lr = []\n", ["sweep.training.lr = []", "non-empty list"]),
        ("[sweep]\ntraining.lr = 1e-3\n", ["sweep.training.lr = 0.001", "non-empty list"]),
        ("[sweep]\nmodel.pos_enc = ['rop']\n", ["sweep.model.pos_enc[0] = 'rop'", "'rope'"]),
        ("[sweep]\nmodel.d_model = [8]\n", ["sweep.model.d_model (key)", "pos_enc"]),
        ("[sweep]\noptim.lr = [1]\n", ["sweep.optim (key)", "training"]),
        ("[sweep]\nmechanism_kwargs.n_head = [2]\n",
         ["sweep.mechanism_kwargs.n_head (key)", "mechanism 'std'", "n_heads"]),
        ("[sweep]\nmechanism_kwargs.n_heads = [2, 3]\n", ["mechanism 'std'", "divisible"]),
        ("[model]\nnorm_type = 'batchnorm'\n", ["model.norm_type = 'batchnorm'", "rmsnorm"]),
        ("[model]\nbias = 1\n", ["model.bias = 1", "a bool"]),
        ("[sweep]\nmodel.attention_residual = [true, 0]\n",
         ["sweep.model.attention_residual", "= 0", "a bool (false: attention's output"]),
        ("[model]\nactivation = 'gelux'\n", ["model.activation = 'gelux'", "'gelu'", "swiglu"]),
        ("[selection]\nover = ['training.lr']\n", ["selection.over[0] = 'training.lr'"]),
        ("[sweep]\ntraining.lr = [1e-3, 1e-2]\n"
         "[selection]\nover = ['training.lr', 'training.lr']\n",
         ["selection.over[1] = 'training.lr' repeats selection.over[0]"]),
        ("[sweep]\ntraining.lr = [1e-3]\n[selection]\ncompare = [['rel', 'sdt']]\n",
         ["selection.compare[0][1] = 'sdt'", "Did you mean 'std'"]),
        ("[selection]\ncompare = [['rel', 'rel']]\n", ["compares a mechanism with itself"]),
        ("[selection]\nmetric = 'test_acc'\n", ["selection.metric = 'test_acc'", "val_acc"]),
        ("[selection]\nreported = 'val_acc'\n", ["selection.reported = 'val_acc'", "test_ood_acc"]),
        ("[selection]\nreported = ['test_acc', 'test_ood']\n",
         ["selection.reported", "'test_ood'", "a test metric or a list of them"]),
        ("[selection]\nreported = []\n", ["selection.reported = []"]),
        ("[grid]\nexclude = [{ training.lr = 5e-3 }]\n", ["grid.exclude[0]", "matches no cell"]),
        ("[grid]\nexclude = [{ training.lr = -1 }]\n", ["grid.exclude[0].training.lr = -1"]),
    ],
)  # fmt: skip
def test_bad_sweeps_options_and_selections_are_refused_naming_key_and_value(
    tmp_path, extra, fragments
):
    assert_refused(grid(tmp_path, extra), fragments)


def test_entry_training_with_steps_and_epochs_is_refused(tmp_path):
    rel = {**REL, "training": {"epochs": 2, "steps": 5}}
    with pytest.raises(SpecError, match=r"mechanisms\[1\]\.training\.epochs = 2 and "):
        load_grid(grid(tmp_path, mechanisms=[STD, rel]))


def test_loading_a_sweep_grid_builds_each_model_once_and_leaves_the_rng(tmp_path):
    path = grid(tmp_path, SWEEP, tasks=[SAME_PAIR])
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    load_grid(path)
    assert torch.equal(torch.rand(2), expected)
