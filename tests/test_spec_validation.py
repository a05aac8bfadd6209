"""Every bad grid input is refused by `load_grid` (or the CLI parser) before any work, with a
one-line SpecError naming the file, the key, the value and the valid range or choices."""

import subprocess
import sys

import pytest
import torch
from grids import SAME_PAIR, STD, assert_refused, tiny_grid

from ablations.cli import main
from ablations.grid.spec import SpecError, load_grid

GRID = """\
name = "v"
seeds = [0, 1]
store = "out/v.sqlite"
checkpoints = false

[[tasks]]
label = "pairs"
name = "same_pair"
kwargs = { n_train = 64 }

[[sizes]]
label = "xs"
d_model = 16
n_layers = 1
dff = 32
dropout = 0.0

[[mechanisms]]
label = "std"
name = "standard"
kwargs = { n_heads = 2 }

[training]
steps = 20
batch_size = 8
lr = 1e-3
weight_decay = 0.01
warmup_steps = 2
schedule = "cosine"
grad_clip = 1.0
eval_every = 10
early_stop_target = 0.0
patience = 0
device = "auto"
precision = "float32"
compile = false

[resources]
num_cpus = 1
num_gpus = 0

[grid]
exclude = []
include = [{ task = "pairs", size = "xs", mechanism = "std", seed = 5 }]
"""
REL = '[[mechanisms]]\nlabel = "{label}"\nname = "relational"\nkwargs = {{ n_heads = {heads} }}\n\n'
INCLUDE = 'include = [{ task = "pairs", size = "xs", mechanism = "std", seed = 5 }]'


def write(tmp_path, text=GRID, name="grid.toml"):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def mutate(old: str, new: str) -> str:
    assert GRID.count(old) == 1, old
    return GRID.replace(old, new)


# (id, old text, new text, --set overrides, fragments the message must contain besides the file)
DEFECTS = [
    # training: every key of TRAINING_DEFAULTS, its range and type (a bool is not an int)
    ("steps-0", "steps = 20", "steps = 0", [], ["training.steps = 0", "int >= 1"]),
    ("steps-negative", "steps = 20", "steps = -5", [], ["training.steps = -5", "int >= 1"]),
    ("steps-bool", "steps = 20", "steps = true", [], ["training.steps = True", "int >= 1"]),
    ("steps-float", "steps = 20", "steps = 2.5", [], ["training.steps = 2.5", "int >= 1"]),
    ("batch_size-0", "batch_size = 8", "batch_size = 0", [], ["training.batch_size = 0", ">= 1"]),
    ("batch_size-neg", "batch_size = 8", "batch_size = -8", [], ["batch_size = -8", "int >= 1"]),
    ("eval_every-0", "eval_every = 10", "eval_every = 0", [], ["training.eval_every = 0", ">= 1"]),
    ("lr-negative", "lr = 1e-3", "lr = -1e-3", [], ["training.lr = -0.001", "finite float > 0"]),
    ("lr-zero", "lr = 1e-3", "lr = 0.0", [], ["training.lr = 0.0", "finite float > 0"]),
    ("lr-nan", "lr = 1e-3", "lr = nan", [], ["training.lr = nan", "finite float > 0"]),
    ("lr-inf", "lr = 1e-3", "lr = inf", [], ["training.lr = inf", "finite float > 0"]),
    ("lr-string", "lr = 1e-3", 'lr = "fast"', [], ["training.lr = 'fast'", "float > 0"]),
    ("wd-negative", "weight_decay = 0.01", "weight_decay = -0.1", [], ["weight_decay", ">= 0"]),
    ("wd-nan", "weight_decay = 0.01", "weight_decay = nan", [], ["weight_decay = nan", ">= 0"]),
    ("warmup-neg", "warmup_steps = 2", "warmup_steps = -1", [], ["warmup_steps = -1", "int >= 0"]),
    ("betas-one", "compile = false", "betas = [0.9]", [], ["training.betas = [0.9]", "two"]),
    ("betas-1", "compile = false", "betas = [0.9, 1.0]", [], ["training.betas[1] = 1.0", "[0, 1)"]),
    ("betas-str", "compile = false", 'betas = "adam"', [], ["training.betas = 'adam'", "[0, 1)"]),
    ("grad_clip-neg", "grad_clip = 1.0", "grad_clip = -1", [], ["training.grad_clip = -1", ">= 0"]),
    ("target-1.5", "early_stop_target = 0.0", "early_stop_target = 1.5", [], ["= 1.5", "[0, 1]"]),
    (
        "schedule",
        'schedule = "cosine"',
        'schedule = "linear"',
        [],
        ["training.schedule = 'linear'", "cosine, constant"],
    ),
    ("schedule-int", 'schedule = "cosine"', "schedule = 1", [], ["schedule = 1", "cosine"]),
    ("training-table", "", "", ["training=5"], ["training = 5", "must be a table"]),
    # training: the keys added after the first stores
    ("epochs-0", "steps = 20", "epochs = 0", [], ["training.epochs = 0", "int >= 1"]),
    ("epochs-float", "steps = 20", "epochs = 1.5", [], ["epochs = 1.5", "ceil(n_train / b"]),
    (
        "epochs-and-steps",
        "steps = 20",
        "steps = 20\nepochs = 2",
        [],
        ["training.epochs = 2 and training.steps = 20 are both set", "exactly one"],
    ),
    ("epochs-set", "", "", ["training.epochs=3"], ["training.epochs = 3 and", "exactly one"]),
    ("patience-neg", "patience = 0", "patience = -1", [], ["training.patience = -1", "int >= 0"]),
    ("patience-float", "patience = 0", "patience = 2.0", [], ["patience = 2.0", "0: never"]),
    ("device-name", 'device = "auto"', 'device = "gpu"', [], ["device = 'gpu'", '"cuda:N"']),
    ("device-index", 'device = "auto"', 'device = "cuda:-1"', [], ["= 'cuda:-1'", "N an int"]),
    ("device-int", 'device = "auto"', "device = 0", [], ["training.device = 0", '"auto", "cpu"']),
    (
        "device-mps-here",
        'device = "auto"',
        'device = "mps"',
        [],
        ["training.device = 'mps' is not available", "torch.backends.mps.is_available() is False"],
    ),
    (
        "device-cuda-here",
        'device = "auto"',
        'device = "cuda"',
        [],
        ["training.device = 'cuda' is not available", "torch.cuda.is_available() is False"],
    ),
    (
        "device-cuda-index-here",
        'device = "auto"',
        'device = "cuda:3"',
        [],
        ["training.device = 'cuda:3' is not available", "torch.cuda"],
    ),
    (
        "precision",
        'precision = "float32"',
        'precision = "fp16"',
        [],
        ["training.precision = 'fp16'", "Valid: float32, bf16"],
    ),
    ("compile-str", "compile = false", 'compile = "yes"', [], ["training.compile = 'yes'", "bool"]),
    # resources: what a Ray task asks for
    ("num_cpus-0", "num_cpus = 1", "num_cpus = 0", [], ["resources.num_cpus = 0", "> 0"]),
    (
        "num_cpus-1.5",
        "num_cpus = 1",
        "num_cpus = 1.5",
        [],
        ["resources.num_cpus = 1.5", "a fraction below 1 or a whole number"],
    ),
    ("num_gpus-neg", "num_gpus = 0", "num_gpus = -1", [], ["resources.num_gpus = -1", ">= 0"]),
    ("num_gpus-str", "num_gpus = 0", 'num_gpus = "1"', [], ["resources.num_gpus = '1'", ">= 0"]),
    (
        "resources-key",
        "num_gpus = 0",
        "num_gpu = 1",
        [],
        ["resources.num_gpu (key)", "num_cpus, num_gpus"],
    ),
    ("resources-table", "", "", ["resources=2"], ["resources = 2", "must be a table"]),
    # sizes
    ("d_model-neg", "d_model = 16", "d_model = -16", [], ["sizes[0].d_model = -16", "int >= 1"]),
    ("d_model-str", "d_model = 16", 'd_model = "16"', [], ["sizes[0].d_model = '16'", ">= 1"]),
    ("n_layers-0", "n_layers = 1", "n_layers = 0", [], ["sizes[0].n_layers = 0", "int >= 1"]),
    ("dff-0", "dff = 32", "dff = 0", [], ["sizes[0].dff = 0", "int >= 1"]),
    ("dropout-1", "dropout = 0.0", "dropout = 1.0", [], ["sizes[0].dropout = 1.0", "[0, 1)"]),
    ("dropout-neg", "dropout = 0.0", "dropout = -0.5", [], ["sizes[0].dropout = -0.5", "[0, 1)"]),
    ("size-label", 'label = "xs"', "label = 3", [], ["sizes[0].label = 3", "non-empty str"]),
    # top level
    ("store-int", 'store = "out/v.sqlite"', "store = 5", [], ["store = 5", "non-empty str"]),
    ("store-empty", 'store = "out/v.sqlite"', 'store = ""', [], ["store = ''", "non-empty str"]),
    ("name-int", 'name = "v"', "name = 5", [], ["name = 5", "file-name-safe str"]),
    (
        "name-path",
        'name = "v"',
        'name = "../../../victim"',
        [],
        ["name = '../../../victim'", "file-name-safe"],
    ),
    ("name-hidden", 'name = "v"', 'name = ".v"', [], ["name = '.v'", "not starting with '.'"]),
    ("checkpoints", "checkpoints = false", 'checkpoints = "yes"', [], ["checkpoints", "bool"]),
    ("seeds-dup", "seeds = [0, 1]", "seeds = [0, 0]", [], ["seeds[1] = 0", "distinct"]),
    ("seeds-str", "seeds = [0, 1]", 'seeds = [0, "1"]', [], ["seeds[1] = '1'", "int in [0"]),
    ("seeds-neg", "seeds = [0, 1]", "seeds = [-1]", [], ["seeds[0] = -1", "int in [0, 2**63)"]),
    ("seeds-empty", "seeds = [0, 1]", "seeds = []", [], ["seeds = []", "non-empty list"]),
    ("seeds-int", "seeds = [0, 1]", "seeds = 3", [], ["seeds = 3", "non-empty list"]),
    # empty grids
    ("no-tasks", "", "", ["tasks=[]"], ["tasks = []", "non-empty list"]),
    ("no-sizes", "", "", ["sizes=[]"], ["sizes = []", "non-empty list"]),
    ("no-mechanisms", "", "", ["mechanisms=[]"], ["mechanisms = []", "non-empty list"]),
    (
        "all-excluded",
        "exclude = []\n" + INCLUDE,
        'exclude = [{ mechanism = "std" }]',
        [],
        ["grid.exclude = [{'mechanism': 'std'}]", "at least one cell"],
    ),
    ("empty-exclude-rule", "exclude = []", "exclude = [{}]", [], ["grid.exclude[0]", "task, size"]),
    # entries of tasks, sizes and mechanisms
    ("task-entry", "", "", ["tasks=[1]"], ["tasks[0] = 1", "must be a table"]),
    ("task-name-int", 'name = "same_pair"', "name = 1", [], ["tasks[0].name = 1", "same_pair"]),
    ("mechanism-no-name", 'name = "standard"\n', "", [], ["mechanisms[0] is missing 'name'"]),
    ("size-no-d_model", "d_model = 16\n", "", [], ["sizes[0] is missing 'd_model'"]),
    # duplicate labels
    (
        "duplicate-label",
        "[training]",
        REL.format(label="std", heads=2) + "[training]",
        [],
        ["mechanisms[1].label = 'std'", "unique"],
    ),
    # [grid] include / exclude entries
    ("include-seed-str", "seed = 5 }", 'seed = "5" }', [], ["grid.include[0].seed = '5'", "int"]),
    (
        "include-seed-bool",
        "seed = 5 }",
        "seed = true }",
        [],
        ["grid.include[0].seed = True", "int"],
    ),
    (
        "include-key",
        "seed = 5 }",
        "seed = 5, colour = 1 }",
        [],
        ["grid.include[0].colour (key)", "task, size, mechanism, seed"],
    ),
    (
        "include-label",
        'mechanism = "std", seed = 5',
        'mechanism = "sdt", seed = 5',
        [],
        ["grid.include[0].mechanism = 'sdt'", "Valid: std"],
    ),
    (
        "include-missing-axis",
        'size = "xs", ',
        "",
        [],
        ["grid.include[0] = {", "must name all of task, size, mechanism, seed"],
    ),
    ("include-entry", INCLUDE, "include = [1]", [], ["grid.include[0] = 1", "table"]),
    ("exclude-str", "exclude = []", 'exclude = "std"', [], ["grid.exclude = 'std'", "list"]),
    (
        "exclude-seed",
        "exclude = []",
        "exclude = [{ seed = 9 }]",
        [],
        ["grid.exclude[0].seed = 9", "Valid: 0, 1"],
    ),
    (
        "exclude-label-type",
        "exclude = []",
        "exclude = [{ task = 1 }]",
        [],
        ["grid.exclude[0].task = 1", "Valid: pairs"],
    ),
    # mechanism kwargs: by name, then built with the size
    (
        "mechanism-kwarg-name",
        "n_heads = 2",
        "n_head = 2",
        [],
        ["mechanisms[0].kwargs.n_head (key)", "mechanism 'std'", "n_heads"],
    ),
    (
        "mechanism-kwarg-type",
        "n_heads = 2",
        'n_heads = "two"',
        [],
        ["mechanism 'std'", "'n_heads': 'two'", "size 'xs'"],
    ),
    (
        "mechanism-kwarg-value",
        "n_heads = 2",
        "n_heads = 3",
        [],
        ["mechanism 'std'", "'n_heads': 3", "divisible"],
    ),
    (
        "mechanism-kwargs-type",
        "kwargs = { n_heads = 2 }",
        "kwargs = 2",
        [],
        ["mechanisms[0].kwargs"],
    ),
]


# refused because this machine has no CUDA: skipped where it has
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@pytest.mark.parametrize(
    ("old", "new", "overrides", "fragments"),
    [
        pytest.param(*case[1:], id=case[0], marks=[NO_CUDA] if "cuda-" in case[0] else [])
        for case in DEFECTS
    ],
)
def test_each_defect_is_refused_naming_file_key_value_and_range(
    tmp_path, old, new, overrides, fragments
):
    assert_refused(write(tmp_path, mutate(old, new) if old else GRID), fragments, overrides)


@pytest.mark.parametrize(
    ("new", "fragments"),
    [
        ("n_train = -1", ["task 'pairs'", "'n_train': -1", "n_train must be >= 1"]),
        ('n_train = "many"', ["task 'pairs'", "'n_train': 'many'"]),
        ("n_trian = 64", ["tasks[0].kwargs.n_trian (key)", "task 'pairs'", "n_train"]),
    ],
)
def test_a_bad_task_kwarg_is_blamed_on_the_task_not_the_mechanism(tmp_path, new, fragments):
    path = write(tmp_path, mutate("n_train = 64", new))
    with pytest.raises(SpecError) as err:
        load_grid(path)
    message = str(err.value)
    assert str(path) in message and "mechanism" not in message
    for fragment in fragments:
        assert fragment in message


def test_a_valid_grid_loads_every_setting_unchanged(tmp_path):
    spec = load_grid(write(tmp_path))
    cells = spec.cells
    assert [(c.task, c.size["label"], c.mechanism, c.seed) for c in cells] == [
        ("pairs", "xs", "std", 0),
        ("pairs", "xs", "std", 1),
        ("pairs", "xs", "std", 5),
    ]
    assert cells[0].config() == {
        "grid": "v",
        "task": "pairs",
        "task_name": "same_pair",
        "task_kwargs": {"n_train": 64},
        "size": {"label": "xs", "d_model": 16, "n_layers": 1, "dff": 32, "dropout": 0.0},
        "mechanism": "std",
        "mechanism_name": "standard",
        "mechanism_kwargs": {"n_heads": 2},
        "training": {
            "steps": 20,
            "batch_size": 8,
            "lr": 1e-3,
            "weight_decay": 0.01,
            "warmup_steps": 2,
            "schedule": "cosine",
            "grad_clip": 1.0,
            "eval_every": 10,
            "early_stop_target": 0.0,
        },
        "seed": 0,
    }  # the added keys (patience, device, precision, compile) at their defaults: not keyed
    assert spec.resources == {"num_cpus": 1, "num_gpus": 0}  # resources: no part of a cell
    # an int where a float is expected is accepted as given (it keys the cell as before)
    assert load_grid(write(tmp_path, mutate("lr = 1e-3", "lr = 1"))).training.lr == 1


def test_an_excluded_pair_that_cannot_be_built_is_not_built(tmp_path):
    text = mutate("[training]", REL.format(label="rel", heads=3) + "[training]")
    text = text.replace("exclude = []", 'exclude = [{ mechanism = "rel" }]')
    with pytest.raises(SpecError, match="mechanism 'rel'.*divisible"):
        load_grid(
            write(tmp_path, text.replace('exclude = [{ mechanism = "rel" }]', "exclude = []"))
        )
    assert {c.mechanism for c in load_grid(write(tmp_path, text)).cells} == {"std"}


def test_load_grid_leaves_the_global_rng_alone(tmp_path):
    path = write(tmp_path)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    load_grid(path)
    assert torch.equal(torch.rand(3), expected)


def test_a_relative_store_resolves_against_the_grid_folder(tmp_path, monkeypatch):
    path = write(tmp_path, name="grids/g.toml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_grid(path).store == tmp_path / "grids" / "out" / "v.sqlite"
    assert load_grid(path, ["store=other.sqlite"]).store == tmp_path / "grids" / "other.sqlite"
    default = load_grid(write(tmp_path, mutate('store = "out/v.sqlite"\n', ""), "grids/d.toml"))
    assert default.store == tmp_path / "grids" / "results" / "v.sqlite"
    absolute = tmp_path / "abs" / "a.sqlite"
    assert load_grid(path, [f'store="{absolute}"']).store == absolute
    monkeypatch.chdir(tmp_path)  # a relative grid path gives a store relative to the cwd
    assert load_grid("grids/g.toml").store.resolve() == tmp_path / "grids" / "out" / "v.sqlite"


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (["ablate", "run", "g.toml", "--workers", "0"], ["--workers", "'0'", "int >= 1"]),
        (["ablate", "run", "g.toml", "--workers", "-1"], ["--workers", "int >= 1"]),
        (["ablate", "run", "g.toml", "--workers", "two"], ["--workers", "'two'", "int >= 1"]),
        (["ablate", "run", "g.toml", "--interval", "0"], ["--interval", "float > 0"]),
        (["ablate", "run", "g.toml", "--interval", "nan"], ["--interval", "float > 0"]),
        (["report", "g.toml", "--target", "90"], ["--target", "float in [0, 1]"]),
        (["bench", "--repeats", "0"], ["--repeats", "int >= 1"]),
        (["bench", "--lengths", "256", "0"], ["--lengths", "int >= 1"]),
    ],
)
def test_cli_numbers_out_of_range_exit_2_naming_the_range(capsys, argv, fragments):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    for fragment in fragments:
        assert fragment in err


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("steps = 20", "steps = 0"),
        ("batch_size = 8", "batch_size = 0"),
        ("n_heads = 2", 'n_heads = "two"'),
        ("d_model = 16", "d_model = -16"),
        ("n_train = 64", "n_train = -1"),
        ("seeds = [0, 1]", "seeds = [0, 0]"),
    ],
)
def test_ablate_run_on_a_bad_grid_fails_in_one_line_and_creates_no_store(tmp_path, old, new):
    path = write(tmp_path, mutate(old, new))
    with pytest.raises(SystemExit) as exited:
        main(["ablate", "run", str(path)])
    message = exited.value.code
    assert isinstance(message, str) and message.startswith(f"error: {path}: ")  # exit status 1
    assert "\n" not in message and new.split(" = ")[0] in message
    assert not (tmp_path / "out").exists()


def test_ablate_run_exit_status_and_stderr_from_the_command_line(tmp_path):
    path = write(tmp_path, mutate("steps = 20", "steps = 0"))
    run = [sys.executable, "-m", "ablations.cli", "ablate", "run", str(path)]
    done = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"error: {path}: training.steps = 0 must be int >= 1 (below 2**31)\n"
    assert not (tmp_path / "out").exists() and not (tmp_path / "results").exists()


# Keys of the cells of tests/grids.py's tiny grid (20 steps, warmup unset: 2 since 2026-11-29,
# 50 before, longer than the training) without the added training keys (epochs, patience,
# device, precision, compile) and [resources].
TINY_KEYS = ["994bd82cb9d2b243", "7b6e31739905437a", "a00d1302f4815b23", "67d3d9df4ac327c3"]


def test_added_keys_keep_the_cell_keys_of_existing_grids_unless_set_otherwise(tmp_path):
    assert [c.key for c in load_grid(tiny_grid(tmp_path)).cells] == TINY_KEYS
    defaults = {"patience": 0, "device": "auto", "precision": "float32", "compile": False}
    stated = tiny_grid(tmp_path, training=defaults, file="stated.toml")
    resources = ["resources.num_cpus=2", "resources.num_gpus=0.5"]
    assert [c.key for c in load_grid(stated, resources).cells] == TINY_KEYS
    for key, value in [("patience", 3), ("device", "cpu"), ("precision", "bf16"),
                       ("compile", True)]:  # fmt: skip
        cell = load_grid(stated, [f"training.{key}={_toml(value)}"]).cells[0]
        assert getattr(cell.training, key) == value and cell.key != TINY_KEYS[0], key
        assert cell.config()["training"][key] == value  # in the key: not its default


def test_epochs_resolve_to_steps_per_task_and_batch_size(tmp_path):
    tasks = [SAME_PAIR, {"name": "same_pair", "label": "default_size"}]  # n_train 128; 2000
    path = tiny_grid(
        tmp_path, tasks=tasks, mechanisms=[STD], seeds=[0], training={"warmup_steps": 0}
    )
    text = path.read_text().replace("steps = 20", "epochs = 3")
    spec = load_grid(write(tmp_path, text, "epochs.toml"), ["training.batch_size=30"])
    assert spec.training.epochs == 3
    small, large = spec.cells
    assert small.training.steps == 3 * 5 and large.training.steps == 3 * 67
    assert small.config()["training"]["epochs"] == 3  # in the key: the epochs and the steps
    assert small.config()["training"]["steps"] == 3 * 5
    assert load_grid(path).cells[0].training.steps == 20  # neither: steps as given


def _toml(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else repr(value)


@pytest.mark.parametrize(
    ("sweep", "override", "fragments"),
    [
        ("training.lr = [1e-3, 3e-3]", "training={ steps = 20, lr = 3e-3 }",
         ["(its training.lr = 0.003) is overridden where [sweep] sweeps training.lr",
          "--set 'sweep.training.lr=[0.003]'"]),
        ("mechanism_kwargs.n_heads = [1, 2]", "mechanisms[0].kwargs={ n_heads = 4 }",
         ["(its mechanisms[0].kwargs.n_heads = 4) is overridden where [sweep] sweeps "
          "mechanism_kwargs.n_heads", "--set 'mechanisms[0].sweep.mechanism_kwargs.n_heads=[4]'"]),
        ("model.dff = [32, 64]", "model={ dff = 128 }",
         ["(its model.dff = 128) is overridden", "--set 'sweep.model.dff=[128]'"]),
        ("model.dff = [32, 64]", "sizes[0].dff=128",
         ["--set sizes[0].dff=128 is overridden where [sweep] sweeps model.dff (over [32, 64])",
          "--set 'sweep.model.dff=[128]' (which sets it in every cell [sweep] reaches, not only "
          "sizes[0]'s)"]),
        ("model.dff = [32, 64]", 'sizes=[{ label = "xs", d_model = 16, n_layers = 1, dff = 8 }]',
         ["(its sizes[0].dff = 8) is overridden where [sweep] sweeps model.dff"]),
    ],
)  # fmt: skip
def test_a_set_of_a_whole_table_or_a_size_that_a_sweep_overrides_is_refused(
    tmp_path, sweep, override, fragments
):
    """The hostile pass: only --set keys of 2 and 4 parts were checked, so a whole table
    (training={...}, mechanisms[0].kwargs={...}, model={...}) or a size's field (sizes[0].dff)
    was silently replaced by a sweep of a key inside it."""
    path = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0])
    path.write_text(path.read_text() + f"\n[sweep]\n{sweep}\n")
    assert_refused(path, [f"--set {override}", *fragments], [override])


def test_the_set_a_refusal_suggests_runs_the_value_and_a_set_no_sweep_reaches_applies(tmp_path):
    path = tiny_grid(tmp_path, mechanisms=[STD], seeds=[0])
    path.write_text(path.read_text() + "\n[sweep]\nmodel.dff = [32, 64]\n")
    assert {c.size["dff"] for c in load_grid(path, ["sweep.model.dff=[128]"]).cells} == {128}
    cells = load_grid(path, ["training={ steps = 20, eval_every = 10, lr = 3e-3 }"]).cells
    assert {c.training.lr for c in cells} == {3e-3} and len(cells) == 2
