"""The grid file's schema: each table a strict pydantic model whose fields carry their type,
default and range (`Valid`, which error messages quote).

    GridFile.model_validate(tomllib.loads(text))   # ablations.grid.spec.load_grid does this, then
                                                   # the checks across fields and the expansion

`GridFile` and its tables (`TaskEntry`, `SizeEntry`, `MechanismEntry`, `ModelOptions`,
`TrainingSettings`, `Sweep`, `Resources`, `Resume`, `GridRules`, `Selection`, `Tracking`,
`Search`) refuse unknown keys, wrong types (a bool is not an int; an int is a float) and values
out of range. Names are checked against the registries (tasks, mechanisms and reference models,
norms, positions, symbol retrievers). Each default is written once, here (a cell's training
settings are a `TrainingSettings`). What the keys mean: docs/grids.md; every key:
docs/grid_reference.md, generated from these models.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import regex
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)

from ablations.grid.devices import DEVICES, RESOURCE_DEFAULTS, is_device_name
from ablations.grid.references import REFERENCES
from ablations.grid.teacher import FINETUNE
from ablations.results.tracking import BACKENDS, URI_FORMS, is_tracking_uri
from ablations.tasks import list_tasks
from attn_zoo.mechanisms.registry import list_mechanisms
from attn_zoo.models.feedforward import FF_ACTIVATIONS
from attn_zoo.models.norms import NORMS
from attn_zoo.models.positional import POSITIONAL
from attn_zoo.symbols import list_symbol_retrievers

RESUME_DEFAULTS = {"every_minutes": 5.0, "every_steps": 0}  # a grid's [resume] table


@dataclass(frozen=True)
class Valid:
    """What a field of the spec may be, as its error messages say: `text` ("int >= 1"), or
    one of `choices` (a tuple, or a function giving them, e.g. the registered task names)."""

    text: str = ""
    choices: tuple | Callable[[], list[str]] = ()

    def options(self) -> list[str]:
        return list(self.choices() if callable(self.choices) else self.choices)


def _checked(ok: Callable[[object], bool]) -> AfterValidator:
    def check(value):
        try:
            good = ok(value)
        except (OverflowError, TypeError):  # e.g. math.isfinite of an int beyond floats
            good = False
        if not good:
            raise ValueError("out of range")
        return value

    return AfterValidator(check)


# Strict: a bool is not an int, "16" not an int, 2.0 not an int; a float field takes an int as
# given (it keys a cell as the file wrote it).
Number = StrictInt | StrictFloat


def rule(kind: object, valid: str, ok: Callable[[object], bool] = lambda value: True) -> object:
    """A field type: `kind` with `ok(value)` true; `valid` says what it may be in messages."""
    return Annotated[kind, _checked(ok), Valid(valid)]


def choice(choices: tuple | Callable[[], list[str]]) -> object:
    """A field type: a str, one of `choices` (a tuple, or a function giving them)."""
    valid = Valid(choices=choices)
    return Annotated[StrictStr, _checked(lambda v: v in valid.options()), valid]


def whole(low: int, valid: str = "", high: int | None = None) -> object:
    """An int >= `low` and <= `high` (default: below 2**31, beyond any run on one machine)."""
    text = f"int >= {low} and <= {high:,}" if high else f"int >= {low} (below 2**31)"
    return rule(StrictInt, valid or text, lambda v: low <= v <= (high or 2**31 - 1))


WIDTH = 2**16  # d_model and dff: a 65,536-wide layer already holds billions of weights


def finite(valid: str, ok: Callable[[float], bool]) -> object:
    return rule(Number, f"a finite float {valid}", lambda v: math.isfinite(v) and ok(v))


def resource(valid: str, ok: Callable[[float], bool]) -> object:
    return finite(
        f"{valid}: a fraction below 1 or a whole number",
        lambda v: ok(v) and (v < 1 or float(v).is_integer()),
    )


# The characters that render as nothing or as blank space: control and format characters (a
# zero-width space U+200B), the Unicode property Default_Ignorable_Code_Point (the Hangul
# fillers U+3164 and U+115F, the combining grapheme joiner U+034F, the variation selectors
# U+FE0F and U+E0100), and two blank glyphs no property names, the Braille blank U+2800 and the
# musical null notehead U+1D159
INVISIBLE = regex.compile(r"[\p{Cc}\p{Cf}\p{Default_Ignorable_Code_Point}\u2800\U0001D159]")
# A label names a row of the report: no whitespace around it and no invisible character in
# it, which would read the same ("std", "std " and "std\u200b", "std\u3164"); labels of one
# kind also differ after Unicode NFKC normalisation and in their confusable skeletons,
# "relational" and one with a Cyrillic "а" (ablations/grid/validate.py: check_entries)
Label = rule(
    StrictStr,
    "a non-empty str without leading or trailing whitespace or invisible (format or control) "
    "characters or blank ones (Default_Ignorable_Code_Point, U+2800)",
    lambda v: v != "" and v == v.strip() and INVISIBLE.search(v) is None,
)
# A grid name names files (results/<name>.sqlite, reports/<name>/): no path, no hidden file
Name = rule(
    StrictStr,
    "a file-name-safe str: letters, digits, '_', '-', '.', not starting with '.'",
    lambda v: re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", v) is not None,
)
SEED_RANGE = "int in [0, 2**63)"
Seed = rule(StrictInt, SEED_RANGE, lambda v: 0 <= v < 2**63)
Kwargs = Annotated[dict[str, Any], Valid("a table, e.g. { key = value }")]
SCHEDULES = ("cosine", "constant")
PRECISIONS = ("float32", "bf16")
Betas = Annotated[
    list[finite("in [0, 1) (one of AdamW's betas)", lambda v: 0 <= v < 1)],
    Field(min_length=2, max_length=2),
    Valid("two finite floats in [0, 1): AdamW's [beta1, beta2], e.g. [0.9, 0.99]"),
]


def tables(entry: type, valid: str = "a non-empty list of tables", min_length: int = 1) -> object:
    return Annotated[list[entry], Field(min_length=min_length), Valid(valid)]


class Table(BaseModel):
    """A table of the grid file: its keys typed, no other key."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ModelOptions(Table):
    """[model], and the options of a [[sizes]] entry or of a task's or mechanism's `model`:
    `BlockConfig` settings and the model's own (pos_enc, pool, final_norm: only where the task
    kind's model takes them, ablations.grid.cell_model), or a teacher to swap and distil
    (teacher, from_scratch, transfer_steps, finetune, lora_rank: ablations.grid.teacher).
    Unset: the model's default. A cell holds the options set."""

    dff: whole(1, high=WIDTH) | None = None
    dropout: finite("in [0, 1)", lambda v: 0 <= v < 1) | None = None
    activation: choice(FF_ACTIVATIONS) | None = None
    norm_type: choice(NORMS.names) | None = None
    norm_first: rule(StrictBool, "a bool (true: pre-norm, false: post-norm)") | None = None
    bias: rule(StrictBool, "a bool (biases in the feed-forward)") | None = None
    attention_residual: (
        rule(StrictBool, "a bool (false: attention's output replaces the stream, no skip)") | None
    ) = None
    pos_enc: choice(POSITIONAL.names) | None = None
    pool: choice(("mean", "first", "flatten", "cls")) | None = None
    final_norm: rule(StrictBool, "a bool (false: no norm before a vision model's head)") | None = (
        None
    )
    symbol_retrieval: choice(list_symbol_retrievers) | None = None
    symbol_retrieval_kwargs: Kwargs = {}
    shared_symbol_retriever: rule(StrictBool, "a bool (false: a retriever per layer)") | None = None
    teacher: (
        rule(
            StrictStr,
            "a non-empty str: a save_pretrained folder (llama, mistral or qwen2), relative to "
            "the grid file's folder",
            bool,
        )
        | None
    ) = None
    from_scratch: (
        rule(StrictBool, "a bool (true: the teacher's architecture with fresh weights)") | None
    ) = None
    transfer_steps: (
        whole(0, "int >= 0 (steps of attention transfer, counted in training.steps; unset: 0)")
        | None
    ) = None
    finetune: choice(FINETUNE) | None = None  # default "all"
    lora_rank: (
        whole(
            1,
            "int >= 1 (the rank of finetune 'lora' adapters), at most min(d_in, d_out) of "
            "each projection they adapt",
        )
        | None
    ) = None


class SizeEntry(ModelOptions):
    """A [[sizes]] entry: a model size, and any model option."""

    label: Label
    d_model: whole(1, high=WIDTH)
    n_layers: whole(1, high=1024)


WARMUP = 50  # training.warmup_steps where unset and training.steps > 50


def default_warmup(settings: dict) -> int:
    """training.warmup_steps where unset, from the settings validated before it: 50 where
    steps > 50, else a tenth of the steps (as 50 is of the default 500), so that the lr
    reaches training.lr before the last step. 50, not a tenth, beyond 50 steps keeps the keys
    of the cells of every grid that left it unset (ablations/grid/cell.py keys a cell by its
    resolved settings). Where epochs are set, steps are their default 500 here: 50, and
    ablations/grid/validate.py's check_warmup refuses it where the epochs' steps are no more,
    as it refuses any warmup as long as a stage of a teacher's cell."""
    steps = settings["steps"]
    return WARMUP if steps > WARMUP else steps // 10


class TrainingSettings(Table):
    """[training]: every training key with its range and default (the only source of them).
    Frozen: a cell's settings (`Cell.training`) are read as attributes, `cell.training.lr`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    steps: whole(1) = 500  # or epochs: exactly one of the two
    epochs: whole(1, "int >= 1 (an epoch: ceil(n_train / batch_size) steps)") | None = None
    batch_size: whole(1, high=2**20) = 64
    lr: finite("> 0 and < 3.4e38 (a float32)", lambda v: 0 < v < 3.4e38) = 1e-3
    weight_decay: finite(">= 0", lambda v: v >= 0) = 0.01
    betas: Betas = [0.9, 0.999]  # AdamW's (beta1, beta2)
    warmup_steps: whole(
        0,
        "int >= 0, below each cell's steps (each stage's, with a teacher; 1 is no warmup); "
        "unset: 50 where steps > 50 (or epochs are set), else steps // 10",
    ) = Field(default_factory=default_warmup)
    schedule: choice(SCHEDULES) = "cosine"
    grad_clip: finite(">= 0 (the gradient-norm bound; 0: no clipping)", lambda v: v >= 0) = 1.0
    eval_every: whole(1) = 50
    early_stop_target: finite("in [0, 1] (0: never stop early)", lambda v: 0 <= v <= 1) = 0.0
    patience: whole(
        0,
        "int >= 0 (evaluations without improvement of the validation metric before "
        "stopping; 0: never)",
    ) = 0
    device: rule(StrictStr, DEVICES, is_device_name) = "auto"
    precision: choice(PRECISIONS) = "float32"
    compile: rule(StrictBool, "a bool (true: train the torch.compile'd model)") = False
    label_smoothing: finite(  # of the training loss only; evaluation losses are plain
        "in [0, 1) (of the training loss; evaluation losses are plain)", lambda v: 0 <= v < 1
    ) = 0.0


Values = Annotated[list[Any], Field(min_length=1), Valid("a non-empty list of values")]


class Sweep(Table):
    """[sweep] (or an entry's `sweep`): axes of the grid, each a key and its values; a key is
    a [training] or [model] key, or a task's or mechanism's kwarg."""

    training: dict[str, Values] = {}
    model: dict[str, Values] = {}
    task_kwargs: dict[str, Values] = {}
    mechanism_kwargs: dict[str, Values] = {}


class TaskEntry(Table):
    """A [[tasks]] entry: a registered task, its kwargs, its label (default: the name), and
    training settings, model options and sweeps for its cells only."""

    name: choice(list_tasks)
    label: Label | None = None
    kwargs: Kwargs = {}
    training: TrainingSettings = TrainingSettings()
    model: ModelOptions = ModelOptions()
    sweep: Sweep = Sweep()


def mechanism_names() -> list[str]:
    """What a [[mechanisms]] entry may name: a registered mechanism or a reference model."""
    return [*list_mechanisms(), *REFERENCES]


class MechanismEntry(TaskEntry):
    """A [[mechanisms]] entry: a registered mechanism, its kwargs (the model fills d_model and
    backend), its label, and its own training settings, model options and sweeps; or a
    reference model (ablations.grid.references: "dual_attention.VisionTransformer", ...) and its
    kwargs."""

    name: choice(mechanism_names)


class Resources(Table):
    """[resources]: what each Ray task of a cell asks for, num_cpus also every cell's torch
    threads under any executor (no part of any cell)."""

    num_cpus: resource("> 0", lambda v: v > 0) = RESOURCE_DEFAULTS["num_cpus"]
    num_gpus: resource(">= 0", lambda v: v >= 0) = RESOURCE_DEFAULTS["num_gpus"]


class Resume(Table):
    """[resume]: how often each cell takes a resume checkpoint, kept beside the store while it
    trains, so that a cell interrupted mid-way trains on from there (ablations.run.resume). No part
    of any cell: it changes no result."""

    every_minutes: finite(
        ">= 0 (minutes of training between two checkpoints; 0: not by time)", lambda v: v >= 0
    ) = RESUME_DEFAULTS["every_minutes"]
    every_steps: whole(0, "int >= 0 (steps between two checkpoints; 0: not by steps)") = (
        RESUME_DEFAULTS["every_steps"]
    )


class GridRules(Table):
    """[grid]: cells taken out of the product and cells added to it (checked against the
    grid's labels and swept keys by `load_grid`)."""

    exclude: tables(Kwargs, "a list of tables", 0) = []
    include: tables(Kwargs, "a list of tables", 0) = []


SELECTION_METRICS = ("val_acc", "val_loss")  # chosen on: the highest accuracy, lowest loss
# A test metric: test_acc, test_exact, test_loss, test_bits (sequence tasks), test_recovered
# (a teacher's cells: ablations.grid.teacher), or those of a task's other test splits
# ("test_<what>_acc": relational_games' test_id_acc, test_ood_acc)
REPORTED = (
    'a test metric or a list of them: "test_acc", "test_exact", "test_loss", "test_bits", '
    '"test_recovered" (cells with a model.teacher), or "test_<split>_acc" (and _exact, _loss, '
    '_bits) of a task with more test splits, e.g. "test_ood_acc"'
)
Reported = rule(
    StrictStr,
    REPORTED,
    lambda v: re.fullmatch(r"test(_[A-Za-z0-9]+)*_(acc|exact|loss|bits)|test_recovered", v),
)


class Selection(Table):
    """[selection]: the report compares each mechanism at its best setting (per task and size)
    of the axes `over` (default: every swept key), chosen on `metric` (its mean over seeds),
    reporting `reported` there (one test metric or a list); `compare` names [a, b] mechanism
    pairs whose paired difference (a - b, seed by seed, each at its own best setting) the
    report gives; `equivalence_margin` (in the reported metrics' units; optional) lets it call
    a difference "equivalent within ±margin" (ablations.report.selection.verdicts);
    `effect_of_interest` (same units; optional: the smallest difference that matters, e.g. a
    paper's gap) makes a comparison whose detectable effect is larger read "underpowered"."""

    over: Annotated[list[StrictStr], Valid('a list of swept keys, e.g. ["training.lr"]')] = []
    metric: choice(SELECTION_METRICS) = "val_acc"
    reported: Annotated[
        Reported | Annotated[list[Reported], Field(min_length=1)], Valid(REPORTED)
    ] = "test_acc"
    compare: Annotated[
        list[Annotated[list[StrictStr], Field(min_length=2, max_length=2)]],
        Valid('a list of [mechanism, mechanism] label pairs, e.g. [["relational", "standard"]]'),
    ] = []
    equivalence_margin: (
        finite("> 0, in the reported metrics' units, e.g. 0.02 (test accuracy)", lambda v: v > 0)
        | None
    ) = None
    effect_of_interest: (
        finite("> 0, in the reported metrics' units, e.g. 0.05 (test accuracy)", lambda v: v > 0)
        | None
    ) = None

    @property
    def reported_metrics(self) -> list[str]:
        return [self.reported] if isinstance(self.reported, str) else list(self.reported)


REFERENCE_CSV = (
    "a CSV file (lines starting with '#' are comments) with the columns `task` (a task label "
    "of the grid: its rows are drawn on that task's panel), `model` (one curve per model), the "
    "headline figure's axis named as the swept key's last part (`n_train` for "
    "task_kwargs.n_train; `size` for the model sizes' labels; none where the figure is per "
    "task) and the value `column`"
)


class ReferenceCurve(Table):
    """An entry of [report]'s `reference_curves`: `file` (a path relative to the grid file's
    folder; a CSV of the columns that key names), its curves drawn dashed on the report's
    headline figure, each labelled "`label`: <model>", the figure's caption naming the
    `source`; `column`: its CSV column of values (default: "<first reported metric>_mean")."""

    file: rule(StrictStr, "a non-empty str (a path, relative to the grid file's folder)", bool)
    label: Label
    source: Label
    column: Label | None = None


class ReportSettings(Table):
    """[report]: what a report of the grid leads with: `question` (one sentence; default: one
    read from the [selection]), `reference_curves`, published curves (e.g. a paper's) drawn
    dashed beside the mechanisms on the headline figure (ablations/report/headline.py), and
    `unclean`: why the committed report's cells are not all from one clean commit (e.g. "GPU
    cells, not rerun on the CPU"), shown in the report's header line on its code when they are
    not (ablations/report/provenance.py: `code_line`)."""

    question: Label | None = None
    unclean: Label | None = None
    reference_curves: Annotated[
        list[ReferenceCurve],
        Valid(
            'a list of tables, e.g. [{ file = "paper.csv", label = "paper", source = "Smith '
            '2024, fig. 2" }]: ' + REFERENCE_CSV
        ),
    ] = []


Backends = Annotated[
    list[choice(tuple(BACKENDS))],
    Field(min_length=1),
    Valid(f'a non-empty list of tracking backends ({", ".join(BACKENDS)}), e.g. ["mlflow"]'),
]
TrackingUri = rule(StrictStr, f"{URI_FORMS}; a path relative to the grid file's folder",
                   is_tracking_uri)  # fmt: skip


class Tracking(Table):
    """[tracking]: each finished cell copied to experiment trackers (ablations.results.tracking):
    `backends` (their names), `uri` (where they write; default: a "tracking" folder beside
    the store). No part of any cell."""

    backends: Backends
    uri: TrackingUri | None = None


SAMPLERS = ("tpe", "random")
DIRECTIONS = ("maximize", "minimize")
PRUNERS = ("none", "median", "successive_halving")
PRUNER_KEYS = {  # the [search] keys that set each pruner (Optuna's MedianPruner, ...)
    "median": ("warmup_steps", "prune_after_trials"),
    "successive_halving": ("min_resource", "reduction_factor"),
}


class Search(Table):
    """[search]: instead of the product of swept values, `trials` settings of the keys of
    `space` per (task, size, mechanism, other swept values), chosen one after another by an
    Optuna `sampler` on the validation `metric` of the trials before, all on `seed`, a
    `pruner` stopping a trial early on its validation curve (ablations.run.search; each
    distribution of `space`, and that the pruner keys set belong to `pruner`, is checked by
    `load_grid`)."""

    trials: whole(1, "int >= 1 (settings tried per task, size, mechanism)")
    space: Annotated[
        dict[str, Kwargs],
        Field(min_length=1),
        Valid(
            "a non-empty table of swept keys and their distributions, e.g. "
            '{ "training.lr" = { low = 1e-4, high = 3e-2, log = true } }'
        ),
    ]
    sampler: choice(SAMPLERS) = "tpe"
    metric: choice(SELECTION_METRICS) = "val_acc"
    direction: choice(DIRECTIONS) | None = None  # default: maximize an accuracy, minimize a loss
    seed: Seed | None = None  # default: the grid's first seed
    startup_trials: whole(1, "int >= 1 (random trials before TPE models the others)") | None = (
        None  # default: a quarter of the trials, at least 2 and at most 10
    )
    pruner: choice(PRUNERS) = "none"  # stops a trial early on its validation curve
    # median: a trial stops at an evaluation where its metric is worse than the median of the
    # completed trials' at that step, from `warmup_steps` on (default 0), once
    # `prune_after_trials` trials completed (default: startup_trials)
    warmup_steps: whole(0, "int >= 0 (median: no trial is pruned before this step)") | None = None
    prune_after_trials: (
        whole(0, "int >= 0 (median: trials completed before any is pruned)") | None
    ) = None
    # successive_halving: rungs at min_resource x reduction_factor**k steps (default: the first
    # evaluation, and 4), where a trial goes on only in the best 1/reduction_factor so far
    min_resource: whole(1, "int >= 1 (successive_halving: steps of the first rung)") | None = None
    reduction_factor: (
        whole(2, "int >= 2 (successive_halving: 1 in this many trials goes on at a rung)") | None
    ) = None


class GridFile(Table):
    """A grid file as written: the typed schema `load_grid` validates it with."""

    name: Name
    imports: Annotated[
        list[Label],
        Valid('a list of modules or .py files, e.g. ["my_attention"] (ablations.grid.plugins)'),
    ] = []
    seeds: tables(Seed, f"a non-empty list of distinct ints ({SEED_RANGE})") = [0]
    store: (
        rule(StrictStr, "a non-empty str (a path, relative to the grid file's folder)", bool) | None
    ) = None
    checkpoints: rule(StrictBool, "a bool") = False
    tasks: tables(TaskEntry)
    sizes: tables(SizeEntry)
    mechanisms: tables(MechanismEntry)
    training: TrainingSettings = TrainingSettings()
    model: ModelOptions = ModelOptions()
    sweep: Sweep = Sweep()
    selection: Selection | None = None
    report: Annotated[
        ReportSettings,
        Valid(
            "a table: [report]: `question` (a sentence the report leads with; default: read "
            "from the [selection]) and `reference_curves`, a list of tables { file (relative "
            "to the grid file), label, source, column (the value column; default: "
            '"<first reported metric>_mean") }, each file ' + REFERENCE_CSV
        ),
    ] = ReportSettings()
    resources: Resources = Resources()
    resume: Resume = Resume()
    grid: GridRules = GridRules()
    tracking: Tracking | None = None
    search: Search | None = None


# The sections of a swept key ("training.lr"): the table whose field it is (None: a kwarg,
# checked by building the task or mechanism)
SECTIONS: dict[str, type[Table] | None] = {
    "training": TrainingSettings,
    "model": ModelOptions,
    "task_kwargs": None,
    "mechanism_kwargs": None,
}


def higher_is_better(metric: str) -> bool:
    """Whether a larger `metric` is better: accuracies ("val_acc", "test_id_acc", "test_exact"),
    the fraction of a teacher recovered ("test_recovered"), not losses ("val_loss",
    "test_loss", "test_bits")."""
    return not metric.endswith(("loss", "bits"))
