"""The checks a grid file gets across its fields, before anything is built or written (its
schema, ablations/grid/schema.py, types each table): every error a one-line `SpecError` naming
the file, the key, the bad value and the valid range or choices. Then each task is built with
its kwargs and each (mechanism, size) pair as one attention layer, so a bad kwarg value is
refused too, blamed on the task or the mechanism it belongs to (`check_builds`)."""

from __future__ import annotations

import difflib
import json
import sys
import unicodedata
from functools import cache
from types import UnionType
from typing import Annotated, Union, get_args, get_origin, get_type_hints

import torch
from confusable_homoglyphs.confusables import confusables_data
from pydantic import BaseModel, TypeAdapter, ValidationError, create_model

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - Python 3.10
    pass

from ablations.grid.cell import (
    LABEL_KEYS,
    Cell,
)
from ablations.grid.cell_model import build_cell_model
from ablations.grid.devices import DEVICES, device_problem, precision_problem
from ablations.grid.references import REFERENCES
from ablations.grid.schema import (
    INVISIBLE,
    SECTIONS,
    SEED_RANGE,
    GridFile,
    GridRules,
    MechanismEntry,
    Seed,
    Selection,
    SizeEntry,
    Sweep,
    TaskEntry,
    TrainingSettings,
    Valid,
    higher_is_better,
)
from ablations.grid.teacher import has_teacher, stage_steps
from ablations.labels import short_label
from ablations.tasks import build_task, task_arguments
from ablations.tasks.registry import locate_files
from attn_zoo.mechanisms.registry import MECHANISMS
from attn_zoo.models.block import build_attention


class SpecError(ValueError):
    """A grid spec that cannot run, with the file, key, value and valid choices."""


def _fail(path, key, value, valid, what: str = "") -> SpecError:
    valid = [str(v) for v in valid]
    close = difflib.get_close_matches(str(value), valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    alike = [v for v in valid if isinstance(value, str) and skeleton(v) == skeleton(value)]
    if alike:  # a label that reads as a valid one: say how it differs ("relаtional", Cyrillic а)
        hint = (
            f" It reads as {ascii(alike[0])} but is {ascii(value)}, which differs from it in "
            f"{differing_characters(alike[0], value)}."
        )
    return SpecError(
        f"{path}: {key} = {escaped(value)} is not valid{what}.{hint} Valid: {', '.join(valid)}"
    )


def escaped(value: object) -> str:
    """repr(`value`) with the characters that render as nothing or blank escaped too (repr
    escapes the control and format ones, not U+3164 or U+2800: schema.INVISIBLE)."""
    return INVISIBLE.sub(lambda char: ascii(char[0])[1:-1], repr(value))


def check_keys(path, where, table: dict, valid, what: str = "") -> None:
    for key in table:
        if key not in valid:
            raise _fail(path, f"{where}{key} (key)", key, valid, what)


def one_line_error(err: Exception) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())


def annotation_parts(annotation: object) -> tuple[object, list[Valid]]:
    """The type under `Annotated` and `X | None`, and the `Valid`s annotating it."""
    valids = []
    while True:
        if get_origin(annotation) is Annotated:
            annotation, *meta = get_args(annotation)
            valids += [m for m in meta if isinstance(m, Valid)]
        elif get_origin(annotation) in (Union, UnionType) and type(None) in get_args(annotation):
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation, valids


def _where(loc: tuple, root: type[BaseModel] = None) -> tuple[str, list[str], Valid | None]:
    """For an error's location in `root` (default `GridFile`): its key as the file writes it
    ("tasks[0].name"; a union member's tag left out), the keys its table may hold, and its
    `Valid`."""
    node, key, keys = root or GridFile, "", []
    for part in loc:
        base, _ = annotation_parts(node)
        if isinstance(base, type) and issubclass(base, BaseModel) and part in base.model_fields:
            keys, node = list(base.model_fields), get_type_hints(base, include_extras=True)[part]
            key += f".{part}" if key else part
        elif isinstance(part, int) and get_origin(base) is list:
            node, key = get_args(base)[0], f"{key}[{part}]"
        elif isinstance(part, str) and get_origin(base) is dict:
            node, key = get_args(base)[1], f"{key}.{part}"
        else:  # the tag of a union member (int or float)
            break
    base, valids = annotation_parts(node)
    if isinstance(base, type) and issubclass(base, BaseModel):
        keys = list(base.model_fields)
    return key, keys, (valids[0] if valids else None)


# A grid file's `imports` alone, validated before the rest (as GridFile types it)
IMPORTS = create_model(
    "Imports", imports=(get_type_hints(GridFile, include_extras=True)["imports"], [])
)


VALUE_CHARS = 120  # the most of a refused value an error shows


def spec_error(
    path, err: ValidationError, root: type[BaseModel] | None = None, key: str | None = None
) -> SpecError:
    """The first error of validating against `root` (default `GridFile`) as a one-line
    SpecError naming the key (or `key`, for a value validated alone), the value and what it
    may be."""
    error = err.errors()[0]
    loc, value = error["loc"], error["input"]
    if error["type"] == "extra_forbidden":
        parent, keys, _ = _where(loc[:-1], root)
        return _fail(path, f"{parent + '.' if parent else ''}{loc[-1]} (key)", loc[-1], keys)
    if error["type"] == "missing":
        parent = _where(loc[:-1], root)[0]
        return SpecError(f"{path}: {parent + ' is ' if parent else ''}missing {loc[-1]!r}")
    where, _, valid = _where(loc, root)
    where = key or where
    shown = short_label(escaped(value), VALUE_CHARS)  # a 100,000-character label: its start
    if error["type"] in ("model_type", "dict_type"):
        return SpecError(f"{path}: {where} = {shown} must be a table, e.g. {{ key = value }}")
    if valid is not None and valid.choices:
        return _fail(path, where, value, valid.options())
    text = valid.text if valid is not None else error["msg"]
    return SpecError(f"{path}: {where} = {shown} must be {text}")


MAX_DEPTH = 32  # tables and lists in a grid file or a --set value nest at most this deep


def check_depth(path, what: str, value: object, depth: int = 0) -> None:
    """SpecError when `value` nests tables or lists more than `MAX_DEPTH` deep."""
    if depth > MAX_DEPTH:
        raise SpecError(f"{path}: {what} nests tables or lists more than {MAX_DEPTH} deep")
    children = value.values() if isinstance(value, dict) else value
    if isinstance(value, dict | list):
        for child in children:
            check_depth(path, what, child, depth + 1)


def step_name(steps: list[str | int]) -> str:
    return "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps).lstrip(".")


def check_seeds(path, seeds: list[int]) -> None:
    first: dict[int, int] = {}
    for i, seed in enumerate(seeds):
        if seed in first:
            raise SpecError(
                f"{path}: seeds[{i}] = {seed!r} repeats seeds[{first[seed]}]; seeds must be "
                f"distinct (got {seeds})"
            )
        first[seed] = i


def _kwarg_names(entry: TaskEntry) -> list[str] | None:
    """The kwargs a task or mechanism entry may set (None: any)."""
    if not isinstance(entry, MechanismEntry):
        return task_arguments(entry.name)
    if entry.name in REFERENCES:
        return list(REFERENCES[entry.name].kwargs)
    valid = MECHANISMS.kwargs(entry.name)
    if valid is None:
        return None
    return [k for k in valid if k not in ("d_model", "backend")]  # the model fills them in


def check_setting(path, where: str, key: str, value: object, at: str | None = None) -> None:
    """A swept or rule key ("training.lr", written at `where`) and one value of it (written at
    `at`, default `where`): the section and key must exist, a training or model value be valid
    for its key (kwargs are checked by building)."""
    section, _, name = key.partition(".")
    if section not in SECTIONS or not name:
        raise _fail(path, f"{where} (key)", key, [*LABEL_KEYS, *(f"{s}.<key>" for s in SECTIONS)])
    table = SECTIONS[section]
    if table is None:
        return
    if name not in table.model_fields:
        raise _fail(path, f"{where} (key)", name, table.model_fields)
    try:
        table.model_validate({name: value})
    except ValidationError as err:
        raise spec_error(path, err, table, at or where) from None


def check_sweep(path, where: str, sweep: Sweep, entries: list[TaskEntry]) -> None:
    """Each swept key exists (a kwarg: for every entry of `entries` of its kind), and its
    values are valid and distinct."""
    for key, values in flat_sweep(sweep).items():
        section, _, name = key.partition(".")
        at = f"{where}.{key}"
        for i, value in enumerate(values):
            check_setting(path, at, key, value, f"{at}[{i}]")
            if any(same_value(value, other) for other in values[:i]):
                raise SpecError(
                    f"{path}: {at}[{i}] = {value!r} repeats a value of {at} = {values!r}; "
                    f"a swept key's values must be distinct"
                )
        kind = {"task_kwargs": TaskEntry, "mechanism_kwargs": MechanismEntry}.get(section)
        for entry in entries:
            if kind is not None and type(entry) is kind:
                valid = _kwarg_names(entry)
                if valid is not None and name not in valid:
                    what = f" for {'mechanism' if kind is MechanismEntry else 'task'} "
                    raise _fail(path, f"{at} (key)", name, valid, what + repr(entry.label))


def check_entries(path, key: str, entries: list[TaskEntry | SizeEntry]) -> None:
    """Labels (defaulting to the name) unique, also in Unicode NFKC normal form (a "café" of
    one code point and one of two read the same, as do "std" and its full-width "ｓtd"), and
    of distinct confusable skeletons (`skeleton`: "relational" and "relаtional" with a
    Cyrillic а); kwargs keys of tasks and mechanisms known; their training (steps or epochs)
    and sweeps valid."""
    taken: dict[str, tuple[int, str]] = {}  # skeleton -> (index, label as written)
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if isinstance(entry, TaskEntry):
            entry.label = entry.label or entry.name
            valid = _kwarg_names(entry)
            kind = "mechanism" if isinstance(entry, MechanismEntry) else "task"
            if valid is not None:
                what = f" for {kind} {entry.label!r}"
                check_keys(path, f"{where}.kwargs.", entry.kwargs, valid, what)
            check_length(path, f"{where}.training", entry.training)
            check_sweep(path, f"{where}.sweep", entry.sweep, [entry])
        alike = skeleton(entry.label)
        if alike in taken:
            first, label = taken[alike]
            if unicodedata.normalize("NFKC", label) != unicodedata.normalize("NFKC", entry.label):
                raise SpecError(
                    f"{path}: {where}.label = {ascii(entry.label)} and {key}[{first}].label = "
                    f"{ascii(label)} read alike (one Unicode TR39 confusable skeleton; they "
                    f"differ in {differing_characters(entry.label, label)}): the report's "
                    f"rows would not tell them apart; rename one"
                )
            how = "" if label == entry.label else (
                f" = {label!r}, the same text in Unicode NFKC ({ascii(entry.label)} and "
                f"{ascii(label)})"
            )  # fmt: skip
            raise SpecError(
                f"{path}: {where}.label = {entry.label!r} repeats {key}[{first}].label{how}; "
                f"labels must be unique within {key} (a label defaults to the name)"
            )
        taken[alike] = (i, entry.label)


BIDI_MARKS = str.maketrans("", "", "\u200e\u200f")  # confusable_homoglyphs' data wraps
# right-to-left glyphs in them


@cache
def _homoglyphs() -> dict[str, set[str]]:
    """{glyph: the glyphs Unicode's confusables.txt maps it to or to it}, from the data of
    confusable_homoglyphs (its right-to-left glyphs unwrapped)."""
    glyphs: dict[str, set[str]] = {}
    for glyph, entries in confusables_data.items():
        near = {entry["c"].translate(BIDI_MARKS) for entry in entries}
        glyphs.setdefault(glyph.translate(BIDI_MARKS), set()).update(near)
    return glyphs


@cache
def _prototype(char: str) -> str:
    """The prototype of `char` (Unicode TR39): the glyphs that read as one form a star in
    `_homoglyphs`, a prototype with the glyphs mapped to it (each one character); its
    prototype where that is a sequence ("m" -> "rn"), each of its characters' own, else its
    least glyph (which one does not matter: every glyph of the star maps to it)."""
    glyphs = _homoglyphs()
    near = glyphs.get(char, set())
    star = {char} | near | {glyph for other in near for glyph in glyphs.get(other, ())}
    sequences = [glyph for glyph in star if len(glyph) > 1]
    if sequences:
        return "".join(_prototype(c) for c in sequences[0])
    return min(star)


def skeleton(label: str) -> str:
    """The confusable skeleton of `label` (Unicode TR39, after NFKC): the characters that render
    as nothing or blank dropped (schema.INVISIBLE: TR39 drops Default_Ignorable_Code_Point),
    each other mapped to its prototype (`_prototype`); two labels that read alike
    ("relational" and "relаtional" with a Cyrillic а, "d32xl" and "d32x1", "std" and
    "std\\u3164") have one."""
    visible = INVISIBLE.sub("", unicodedata.normalize("NFKC", label))
    return "".join(_prototype(c) for c in visible)


def differing_characters(a: str, b: str) -> str:
    """The characters where `a` and `b` differ (difflib's opcodes: those outside their common
    blocks), escaped and named: "'a' LATIN SMALL LETTER A, '\\u0430' CYRILLIC SMALL LETTER A"."""
    opcodes = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    chars = dict.fromkeys(
        c for tag, i, j, k, m in opcodes if tag != "equal" for c in a[i:j] + b[k:m]
    )
    return ", ".join(f"{ascii(c)} {unicodedata.name(c, f'U+{ord(c):04X}')}" for c in chars)


def check_length(path, where: str, training: TrainingSettings) -> None:
    given = training.model_dump(exclude_unset=True)
    if "epochs" in given and "steps" in given:
        raise SpecError(
            f"{path}: {where}.epochs = {given['epochs']!r} and {where}.steps = "
            f"{given['steps']!r} are both set; set exactly one of them (an epoch is "
            f"ceil(n_train / batch_size) steps)"
        )


def _stages(cell: Cell) -> list[tuple[int, str]]:
    """The steps of each stage `cell` trains in, each warming up anew (ablations/run/train.py:
    stage_lr_factor; a teacher's cell: attention transfer, then finetuning:
    ablations/grid/teacher.py's stage_steps), and what sets them."""
    training = cell.training
    steps = f"training.steps = {training.steps}"
    if training.epochs is not None:
        per_epoch = training.steps // training.epochs
        steps = f"training.epochs = {training.epochs} ({per_epoch} steps an epoch)"
    stages, first = [], 1
    for name, last in stage_steps(cell.size, training.steps):
        if name == "transfer":
            what = f"model.transfer_steps = {last} (attention transfer)"
        else:
            what = f"{steps} less model.transfer_steps = {first - 1}" if first > 1 else steps
            what += f" (finetune {name!r})" if has_teacher(cell.size) else ""
        stages.append((last - first + 1, what))
        first = last + 1
    return [(length, what) for length, what in stages if length >= 1]


def check_warmup(path, cells: list[Cell]) -> None:
    """Each cell's warmup ends before its training does: training.warmup_steps below the
    steps of each stage it trains in (`_stages`), else its lr reaches training.lr only at the
    last step, or never (ablations/run/train.py: lr_factor). A warmup of 1 step is none: its
    one step is at the full lr."""
    for cell in cells:
        warmup = cell.training.warmup_steps
        if "training.warmup_steps" in cell.swept:
            origin = "swept"
        elif "warmup_steps" in cell.training.model_fields_set:
            origin = "set in [training], the task's or mechanism's training, or by --set"
        else:
            origin = (
                "unset: its default, 50 where training.steps > 50 or epochs are set, else "
                "steps // 10, for the whole training"
            )
        for length, what in _stages(cell):
            if warmup > 1 and warmup >= length:
                lr = f"training.lr = {cell.training.lr:g}"
                when = f"reach {lr} only at its last step" if warmup == length else (
                    f"never reach {lr}"
                )  # fmt: skip
                where = ", ".join(f"{key} {value!r}" for key, value in cell.labels.items())
                raise SpecError(
                    f"{path}: training.warmup_steps = {warmup} ({origin}) is not below the "
                    f"{length} steps of {what} in the cell of {where}: its lr would {when}. "
                    f"Valid: training.warmup_steps < {length} (0: no warmup), or more steps"
                )


def check_training(path, cells: list[Cell]) -> None:
    """Each distinct training of the cells: device and precision usable on this machine."""
    for device, precision in dict.fromkeys(
        (cell.training.device, cell.training.precision) for cell in cells
    ):
        problem = device_problem(device)
        if problem:
            raise SpecError(
                f"{path}: training.device = {device!r} is not available on this machine: "
                f'{problem} (valid: {DEVICES}, where available; "auto" takes CUDA where a '
                "worker has it)"
            )
        problem = precision_problem(precision, device)
        if problem:
            raise SpecError(
                f"{path}: training.precision = {precision!r} cannot be used with "
                f"training.device = {device!r}: {problem} (valid there: float32)"
            )


def _flat_rule(rule: dict) -> dict:
    """An include or exclude table with swept keys as written (``training.lr = 1e-3`` is
    {"training": {"lr": 0.001}} in TOML) flattened to {"training.lr": 0.001}."""
    flat = {}
    for key, value in rule.items():
        if key in SECTIONS and isinstance(value, dict):
            flat.update({f"{key}.{name}": v for name, v in value.items()})
        else:
            flat[key] = value
    return flat


def check_grid_rules(path, grid: GridRules, valid: dict[str, list]) -> tuple[list, list]:
    """grid.exclude and grid.include: tables of axes (task, size, mechanism, seed, swept
    keys); include names task, size, mechanism and seed (swept keys it leaves out take every
    value). Labels must exist; an excluded seed must be one of the seeds, an included one any
    seed; a swept key's value must be valid for its key."""
    rules = {}
    for kind in ("exclude", "include"):
        rules[kind] = [_flat_rule(rule_) for rule_ in getattr(grid, kind)]
        for i, rule_ in enumerate(rules[kind]):
            where = f"grid.{kind}[{i}]"
            if not rule_:
                raise SpecError(
                    f"{path}: {where} = {{}} must name one or more of {', '.join(LABEL_KEYS)} or "
                    f"swept keys"
                )
            if kind == "include" and not set(LABEL_KEYS) <= set(rule_):
                raise SpecError(
                    f"{path}: {where} = {rule_!r} must name all of {', '.join(LABEL_KEYS)}"
                )
            for axis, value in rule_.items():
                if axis not in LABEL_KEYS:
                    check_setting(path, f"{where}.{axis}", axis, value)
                    continue
                if axis == "seed":
                    try:
                        TypeAdapter(Seed).validate_python(value, strict=True)
                    except ValidationError:
                        raise SpecError(
                            f"{path}: {where}.seed = {value!r} must be {SEED_RANGE}"
                        ) from None
                    if kind == "include":
                        continue
                if isinstance(value, bool) or value not in valid[axis]:
                    raise _fail(path, f"{where}.{axis}", value, valid[axis])
    return rules["exclude"], rules["include"]


def check_selection(path, selection: Selection | None, swept: list[str], mechanisms: list) -> None:
    """SpecError where `selection` names an axis not `swept` or one twice, a mechanism not of
    `mechanisms`, a mechanism compared with itself, a pair twice (either way round) or a
    reported metric twice: each comparison of each metric is one test of the report's Holm
    family, so a copy would weaken every verdict (ablations.report.selection.verdicts)."""
    if selection is None:
        return
    for i, key in enumerate(selection.over):
        if key not in swept:
            raise _fail(path, f"selection.over[{i}]", key, swept or ["(no swept key)"])
        if selection.over.index(key) != i:
            raise SpecError(
                f"{path}: selection.over[{i}] = {key!r} repeats "
                f"selection.over[{selection.over.index(key)}]: valid is each swept key once"
            )
    labels = [m.label for m in mechanisms]
    pairs: dict[frozenset, int] = {}
    for i, pair in enumerate(selection.compare):
        for j, label in enumerate(pair):
            if label not in labels:
                raise _fail(path, f"selection.compare[{i}][{j}]", label, labels)
        if pair[0] == pair[1]:
            raise SpecError(
                f"{path}: selection.compare[{i}] = {pair!r} compares a mechanism with itself"
            )
        first = pairs.setdefault(frozenset(pair), i)
        if first != i:
            raise SpecError(
                f"{path}: selection.compare[{i}] = {pair!r} compares the pair of "
                f"selection.compare[{first}] = {selection.compare[first]!r} again: valid is "
                "each pair once, either way round (each is one test of the report's family)"
            )
    reported = selection.reported_metrics
    for i, name in enumerate(reported):
        if reported.index(name) != i:
            raise SpecError(
                f"{path}: selection.reported[{i}] = {name!r} repeats "
                f"selection.reported[{reported.index(name)}]: valid is each metric once (each "
                "is one test per comparison in the report's family)"
            )
    losses = [name for name in selection.reported_metrics if not higher_is_better(name)]
    for key in ("equivalence_margin", "effect_of_interest"):
        value = getattr(selection, key)
        if value is not None and 0 < len(losses) < len(selection.reported_metrics):
            raise SpecError(
                f"{path}: selection.{key} = {value!r} is in the units of every reported "
                f"metric, and selection.reported = {selection.reported_metrics!r} mixes losses "
                f"({', '.join(losses)}) with accuracies: valid is a value with accuracies "
                "only or losses only"
            )


def checked_task(path, label: str, name: str, kwargs: dict):
    """Task `name` built with `kwargs` (cheap: no data), a relative data file looked up beside
    the grid file at `path` first; SpecError blaming task `label`."""
    try:
        return build_task(name, **locate_files(name, kwargs, path.resolve().parent))
    except Exception as err:
        raise SpecError(
            f"{path}: task {label!r} (name {name!r}) cannot be built with kwargs {kwargs}: "
            f"{one_line_error(err)}"
        ) from err


def check_builds(path, cells: list[Cell]) -> None:
    """Build each task with its kwargs, each (mechanism, size) as one attention layer, then
    each distinct model (cheap: no data, no training), turning any exception into a SpecError
    blaming the task, the mechanism, or the model options; each cell's warmup first
    (`check_warmup`, cheap)."""
    check_warmup(path, cells)
    tasks, layers, models = {}, set(), set()
    with torch.random.fork_rng(devices=[]):  # leave the global RNG as it was
        for cell in cells:
            task_id = (cell.task, json.dumps(cell.task_kwargs, sort_keys=True, default=str))
            if task_id not in tasks:
                tasks[task_id] = checked_task(path, cell.task, cell.task_name, cell.task_kwargs)
                try:
                    tasks[task_id].check_size()
                except ValueError as err:
                    raise SpecError(
                        f"{path}: task {cell.task!r} (name {cell.task_name!r}) with kwargs "
                        f"{cell.task_kwargs}: {one_line_error(err)}"
                    ) from None
            layer = json.dumps([cell.mechanism_name, cell.mechanism_kwargs, cell.size],
                               sort_keys=True, default=str)  # fmt: skip
            if layer not in layers and cell.mechanism_name not in REFERENCES:
                layers.add(layer)
                try:
                    build_attention(
                        cell.mechanism_name,
                        cell.size["d_model"],
                        cell.mechanism_kwargs,
                        cell.size.get("dropout", 0.0),
                        "auto",
                    )
                except Exception as err:
                    raise SpecError(
                        f"{path}: mechanism {cell.mechanism!r} (name {cell.mechanism_name!r}) "
                        f"cannot be built with kwargs {cell.mechanism_kwargs} at size "
                        f"{cell.size['label']!r} (d_model {cell.size['d_model']}): "
                        f"{one_line_error(err)}"
                    ) from err
            model = f"{task_id}{layer}"
            if model not in models:
                models.add(model)
                try:
                    build_cell_model(cell, tasks[task_id])
                except Exception as err:
                    options = {k: v for k, v in cell.size.items() if k not in SIZE_FIELDS}
                    raise SpecError(
                        f"{path}: the model of task {cell.task!r}, size {cell.size['label']!r} "
                        f"and mechanism {cell.mechanism!r} cannot be built with model options "
                        f"{options}: {one_line_error(err)}"
                    ) from err


def flat_sweep(sweep: Sweep) -> dict[str, list]:
    """An entry's or the grid's sweep as {"section.key": values}."""
    return {
        f"{section}.{key}": values
        for section in SECTIONS
        for key, values in getattr(sweep, section).items()
    }


def same_value(a: object, b: object) -> bool:
    """Equal, with a bool never equal to an int (True == 1 in Python)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


SIZE_FIELDS = ("label", "d_model", "n_layers")
