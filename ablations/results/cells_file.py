"""A report's cells.csv (and the curves.csv beside it) read back as the cells of a results
store, so that a report can be rebuilt from the files a report commits (the stores are not):

    cells = CellsFile("reports/demo/cells.csv")     # attn-zoo report reports/demo/cells.csv
    write_report(cells, "reports/demo_again", selection=load_grid(grid).selection)

`CellsFile` reads like a read-only `ResultsStore`: `path`, `rows()` (key, status, config,
metrics, environment, error, started, finished, curve) and `curves()`, None where no
curves.csv lies beside it (the report then leaves out what needs curves: learning curves and
steps to target), and `attention`: the attention-map blocks of the report beside it and the
PNG files they name (its attention.json: a report from a cells.csv cannot draw maps, so it
carries these over), None without one; `axes()`: the grids' axes the provenance.json beside it
records (results/axes.py; {} for a report written before it did).
Every value comes back as the store held it: a text as written
(ablations.labels.csv_text's leading "'" taken off), whole numbers as ints, other numbers
as floats, True and False as bools, lists as lists, an environment's tables (data, plugins) as
dicts, a config's keys sorted at every level and an empty config cell as the empty text where
that makes the config hash to the row's key (a CSV cell cannot tell "" from missing); a
done cell's metrics named in the `non_finite` column as NaN where the file leaves them empty (a
CSV cell cannot tell NaN from missing). Labels (grid, task, task_name, size, mechanism,
mechanism_name), keys, statuses and errors stay texts.

Columns: key, status, error, started, finished, non_finite, "metrics.<name>",
"environment.<name>" and the config named as `cells_table` names it ("training.lr", "size",
"model.d_model", ...). Files written before that (every column of the config behind
"config.", the size as "config.size.label", no environment) are read too: there pandas wrote
whole numbers of a column with gaps as floats ("4.0"), read back as ints, and the environment
is the one the report.md beside the file shows (`recorded_environment`); so is the environment
of finished cells without one in a file that merges such rows with newer ones.
"""

from __future__ import annotations

import ast
import html
import itertools
import json
import re
from pathlib import Path

import pandas as pd

from ablations.results.axes import GridAxes, axes_from_json
from ablations.results.frames import FRAME_COLUMNS
from ablations.results.store import CURVE_COLUMNS, CURVE_FIELDS, FINISHED, config_key

OLD_PREFIX = "config."  # the config columns of files written before flat_config's names
TEXTS = {("grid",), ("task",), ("task_name",), ("size", "label"), ("mechanism",),
         ("mechanism_name",)}  # fmt: skip
TABLES = ("task_kwargs", "size", "mechanism_kwargs", "training")  # a Cell's dict fields
ATTENTION_FILE = "attention.json"  # a report's attention-map blocks (ablations.report.build)
MAP_FILE = re.compile(r"attention_[A-Za-z0-9_-]+\.png")  # report_pages.label_file_name's
EMPTY_CELLS_TRIED = 10  # a row's empty config cells tried as "" (2**10 configs at most)
WHOLE = re.compile(r"[-+]?\d+")
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?inf|nan")
ENVIRONMENT_LINE = re.compile(  # as report.md shows it; a rebuild's note on where it came from
    r"^- Environment: (?:.*?for the \d+ cells without one in cells\.csv: )?(.+?)"
    r"(?: \(as the report\.md beside .+ recorded it\))?$",
    re.MULTILINE,
)


def lacks_environment(row: dict) -> bool:
    """Whether `row` (a store row) is a finished cell without the environment it ran in (cells
    that never ran have none to lack)."""
    return row["status"] in FINISHED and not row["environment"]


def _path(column: str, old: bool) -> tuple[str, ...]:
    """Where a config column sits in a cell's nested config: ("task_kwargs", "n_train");
    the size's label and model options are in "size" ("size", "model.d_model")."""
    if old:
        return tuple(column.removeprefix(OLD_PREFIX).split("."))
    if column == "size":
        return ("size", "label")
    section, _, rest = column.partition(".")
    return ("size", *rest.split(".")) if section == "model" else tuple(column.split("."))


def _value(text: str) -> object:
    """A value from its CSV text: None for ''; see the module."""
    if text == "":
        return None
    if text.startswith("'"):  # csv_text's guard before a text a spreadsheet would run
        return text[1:]
    if WHOLE.fullmatch(text):
        return int(text)
    if NUMBER.fullmatch(text):
        return float(text)
    if text in ("True", "False"):
        return text == "True"
    if text.startswith("[") and text.endswith("]"):
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text
    return text


def _recorded(text: str) -> object:
    """An environment's value from its CSV text: as `_value`, and a table (data, plugins:
    "{'plug.py': '1a2b...'}") as a dict."""
    if text.startswith("{") and text.endswith("}"):
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text
    return _value(text)


def _nested(settings: dict[tuple[str, ...], object]) -> dict:
    """A cell's config from its settings {path: value} (`_path`), keys sorted at every level,
    each of `TABLES` there even when empty."""
    nested: dict = {name: {} for name in TABLES}
    for (*parents, name), value in settings.items():
        place = nested
        for parent in parents:
            place = place.setdefault(parent, {})
        place[name] = value
    return _sorted(nested)


def _keyed_config(
    settings: dict[tuple[str, ...], object], empty: list[tuple[str, ...]], key: str
) -> dict:
    """The config of a row with `settings` {path: value} and `empty` config cells, each of which
    is either a setting the cell lacks or an empty text ("" written as nothing: e.g.
    relations_game_files' ood_file = ""): the fewest of `empty` set to "" that make the config
    hash to the row's `key` (config_key), tried by count; where none do (or more than
    `EMPTY_CELLS_TRIED` are empty), the config without them, which hashes to another key (a
    setting lost or rounded: ablations/run/reproduce.py refuses to rerun it)."""
    counts = range(len(empty) + 1) if len(empty) <= EMPTY_CELLS_TRIED else range(1)
    for count in counts:
        for texts in itertools.combinations(empty, count):
            config = _nested({**settings, **dict.fromkeys(texts, "")})
            if config_key(config) == key:
                return config
    return _nested(settings)


def _sorted(table: dict) -> dict:
    """`table` with its keys sorted at every level, as the store holds a config."""
    return {k: _sorted(v) if isinstance(v, dict) else v for k, v in sorted(table.items())}


def _text(text: str) -> str | None:
    """A text column's value: as written, its guard "'" off; None for ''."""
    return (text[1:] if text.startswith("'") else text) if text else None


class CellsFile:
    """The cells of a report's cells.csv at `path` (and its curves.csv), read once, whole;
    FileNotFoundError without the file, ValueError for a file that is not a cells.csv (see
    the module)."""

    draws_maps = False  # results/axes.py's CellSource: the report's maps are carried over

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no cells.csv at {self.path}")
        try:
            table = pd.read_csv(self.path, dtype=str, keep_default_na=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
            raise ValueError(f"{self.path} is not a report's cells.csv: {err}") from None
        table.columns = [_text(str(c)) for c in table.columns]
        if not {"key", "status"} <= set(table.columns) or table.key.duplicated().any():
            raise ValueError(
                f"{self.path} is not a report's cells.csv: it needs the columns key and "
                f"status, one row per key (columns: {', '.join(table.columns[:8])}, ...)"
            )
        self._curves = self._read_curves(self.path.with_name("curves.csv"))
        self._rows = self._read_rows(table)
        self.attention = read_attention(self.path.with_name(ATTENTION_FILE))
        self._axes = read_axes(self.path.with_name("provenance.json"))
        self.recorded_environment = None
        report = self.path.with_name("report.md")
        if any(lacks_environment(row) for row in self._rows) and report.is_file():
            found = ENVIRONMENT_LINE.search(report.read_text(encoding="utf-8"))
            if found and found[1] != "not recorded":  # markdown's escapes and entities off
                self.recorded_environment = html.unescape(re.sub(r"\\(.)", r"\1", found[1]))

    def _read_rows(self, table: pd.DataFrame) -> list[dict]:
        old = any(column.startswith(OLD_PREFIX) for column in table.columns)
        known = {*FRAME_COLUMNS, "non_finite"}
        config = [c for c in table.columns
                  if c not in known and not c.startswith(("metrics.", "environment."))]  # fmt: skip
        paths = {column: _path(column, old) for column in config}
        for column in config if old else []:  # whole numbers with gaps, written as floats
            given = table[column][table[column] != ""]
            if len(given) < len(table) and given.str.fullmatch(r"[-+]?\d+\.0").all():
                table[column] = table[column].str.removesuffix(".0")
        points = {} if self._curves is None else {
            key: group[list(CURVE_FIELDS)].to_numpy().tolist()
            for key, group in self._curves.groupby("key", sort=False)
        }  # fmt: skip
        rows = []
        for record in table.to_dict("records"):
            row = {column: _text(record.get(column, "")) for column in ("key", "status", "error")}
            row.update({c: _value(record.get(c, "")) for c in ("started", "finished")})
            settings = {
                path: (_text if path in TEXTS else _value)(record[column])
                for column, path in paths.items()
            }
            given = {path: value for path, value in settings.items() if value is not None}
            empty = [path for path, value in settings.items() if value is None]
            config = _keyed_config(given, empty, row["key"] or "")
            non_finite = filter(None, record.get("non_finite", "").split(", "))
            metrics = {  # the non-finite ones in the store's order: NaN where written ''
                name: _value(record.get(f"metrics.{name}") or "nan") for name in non_finite
            }
            metrics |= {
                column.removeprefix("metrics."): _value(text)
                for column, text in record.items()
                if column.startswith("metrics.") and text != ""
            }
            environment = {
                column.removeprefix("environment."): _recorded(text)
                for column, text in record.items()
                if column.startswith("environment.") and text != ""
            }
            row.update(config=config, metrics=metrics, environment=environment or None,
                       curve=points.get(row["key"]))  # fmt: skip
            rows.append(row)
        return rows

    def _read_curves(self, path: Path) -> pd.DataFrame | None:
        if not path.is_file():
            return None
        curves = pd.read_csv(path, dtype={"key": str})  # floats read back exactly
        if list(curves.columns) != list(CURVE_COLUMNS):
            raise ValueError(
                f"{path} is not a report's curves.csv: its columns are "
                f"{', '.join(curves.columns)}, not {', '.join(CURVE_COLUMNS)}"
            )
        return curves.astype({"step": "int64", **dict.fromkeys(CURVE_FIELDS[1:], "float64")})

    def rows(self) -> list[dict]:
        """Every cell as `ResultsStore.rows()` gives it, in the file's order."""
        return self._rows

    def curves(self) -> pd.DataFrame | None:
        """The learning curves as `ResultsStore.curves()` gives them (from the curves.csv
        beside the file), or None without one."""
        return self._curves

    def axes(self) -> dict[str, GridAxes]:
        """The grids' axes as the provenance.json beside the file records them."""
        return self._axes


def read_axes(path: Path) -> dict[str, GridAxes]:
    """The grids' axes a report's provenance.json at `path` records ({} without the file or
    without its "axes": a report written before it recorded them); ValueError naming the file
    for one that is not a report's provenance."""
    if not path.is_file():
        return {}
    try:
        provenance = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a report's provenance.json: {err}") from None
    if not isinstance(provenance, dict):
        raise ValueError(f"{path} is not a report's provenance.json: not a JSON object")
    return axes_from_json(provenance.get("axes", {}), str(path))


def read_attention(path: Path) -> tuple[list[list], dict[str, bytes]] | None:
    """The attention-map blocks a report wrote to `path` (its attention.json, as
    ablations.report.attention_maps.attention_blocks gives them: ["h2", heading] first, then
    ["p", text], ["ul", [item, ...]] and ["img", file, alt], the file an attention_*.png of the
    folder) and the bytes of the named files beside it, read now (a report may replace their
    folder); a missing file (or a link) is left out of the bytes. None without attention.json;
    ValueError naming the file and the block for anything else."""
    if not path.is_file():
        return None
    if path.is_symlink():
        raise ValueError(f"{path} is a link: a report's attention.json is a file of its folder")
    try:
        blocks = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a report's attention.json: {err}") from None
    if not isinstance(blocks, list) or not blocks:
        raise ValueError(f"{path} is not a report's attention.json: a non-empty list of blocks")
    for index, block in enumerate(blocks):
        if not _valid_block(block, first=index == 0):
            raise ValueError(
                f"{path} is not a report's attention.json: block {index} is {block!r}; valid: "
                f'["h2", heading] first, then ["p", text], ["ul", [text, ...]] or ["img", '
                f'"attention_<name>.png", alt text]'
            )
    images = {name: path.with_name(name) for kind, name, *_ in blocks if kind == "img"}
    files = {
        name: image.read_bytes()
        for name, image in images.items()
        if image.is_file() and not image.is_symlink()
    }
    return blocks, files


def _valid_block(block: object, first: bool) -> bool:
    """Whether `block` is an attention.json block (see read_attention): the heading first and
    only there, texts as str, an image's file an attention map's name."""
    if not isinstance(block, list) or not block or (block[0] == "h2") != first:
        return False
    kind, *content = block
    texts = all(isinstance(text, str) for text in content)
    if kind in ("h2", "p"):
        return len(content) == 1 and texts
    if kind == "ul":
        items = content[0] if len(content) == 1 else None
        return isinstance(items, list) and all(isinstance(item, str) for item in items)
    return kind == "img" and len(content) == 2 and texts and bool(MAP_FILE.fullmatch(content[0]))
