"""Numbers in prose traced to committed data (tests/test_traceability.py runs it).

A number in a conclusion (ablations/grids/<grid>.conclusion.md) or in a row of a claims table
(the README's, one line per claim, and docs/claims.md's, with the outcomes) is traceable when
it appears, at the precision it is written, in

- a committed CSV of a grid the text belongs to or cites: reports/<grid>/*.csv, for a conclusion
  its own grid's, and those of every grid it names as `<grid>.toml`, `<grid>.conclusion.md` or
  `reports/<grid>/`; or a data CSV under ablations/data/ whose file name it names;
- the settings of such a grid's TOML, ablations/grids/<grid>.toml (its parsed values: lr 3e-2,
  1500 steps; not its comments);
- or an allowed phrase (ALLOWED: numbers that are not data, each with its reason).

Precision: "0.029" stands for any value v with |v - 0.029| <= 0.0005, "3e-2" for
|v - 0.03| <= 0.005, "333" for |v - 333| <= 0.5 (so "2,900" does not stand for 2916.7: write
"2,917"). A written sign ("+", "-" or U+2212) must match v's; an unsigned number
matches v or -v ("behind by 0.05"). An interval, "m [l, h]" or "[l, h]", must be found whole in
one CSV row. Not numbers: digits inside words or names (d64x2, H200, 36x36), versions with two
dots (0.0.7), code spans and link targets.

What it cannot see: whether a number is quoted for the right row or column, other than an
interval's numbers sharing a row; a two-decimal number among hundreds of values often appears by
chance.
"""

from __future__ import annotations

import csv
import math
import re
import sys
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent

# Numbers that are not data: the phrase that holds each one, and why it needs no source.
ALLOWED = {
    "95%": "the confidence level of every interval, a convention",
    "80% power": "the power of every minimum detectable effect (paired.csv's detectable)",
    "4 x 5 x 2": "a count of the pairs, sizes and test sets a text names beside it",
    "Wu et al. 2021": "a citation's year",
    "Fig. 3": "a figure number of the cited paper",
    "torch 2.11": "the version of the software that ran the grid (the report's header)",
    "wikitext-2": "a data set's name",
    "256-character windows, hidden size 256, 6 layers, label smoothing 0.1": (
        "the seed project's setting, quoted from its write-up: not this project's data"
    ),
}

_NUMBER = re.compile(
    r"(?<![\w.,])(?P<sign>[+\-\u2212])?(?P<body>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?"
    r"(?:e(?P<exp>[+\-\u2212]?\d+))?%?(?!\w|[.,]\d)"
)
_ANY = re.sub(r"\?P<\w+>", "", _NUMBER.pattern)  # the same, without group names
_INTERVAL = re.compile(rf"(?:{_ANY}\s*)?\[{_ANY},\s*{_ANY}\]")
_CODE = re.compile(r"`[^`]*`")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_CITED_GRID = re.compile(r"reports/([\w-]+)/|([\w-]+)\.toml|([\w-]+)\.conclusion\.md")


@dataclass(frozen=True)
class Number:
    """A number as written: its value, the half-width its precision allows, and its sign
    (None: unsigned)."""

    value: float
    tolerance: float
    sign: int | None

    @classmethod
    def parse(cls, text: str) -> Number:
        m = _NUMBER.fullmatch(text.strip())
        if m is None:
            raise ValueError(f"text={text!r} is not a number (e.g. '+0.029', '1,500', '3e-2')")
        exp = int((m["exp"] or "0").replace("\u2212", "-"))
        decimals = len(m["frac"] or ".") - 1
        value = float(f"{m['body'].replace(',', '')}{m['frac'] or ''}e{exp}")  # inf if huge
        sign = {None: None, "+": 1}.get(m["sign"], -1)
        return cls(value, float(f"5e{exp - decimals - 1}"), sign)

    def bounds(self) -> tuple[float, float]:
        """The range of |v| that, rounded to this number's precision, is this number."""
        slack = 1e-9 * max(1.0, self.value)  # float noise in the CSV's last digits
        return self.value - self.tolerance - slack, self.value + self.tolerance + slack


@dataclass(frozen=True)
class Untraceable:
    """A number (or interval) found in no source: where it is written."""

    path: Path
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def prose(line: str) -> str:
    """The line without code spans, link targets and allowed phrases: the text whose numbers
    must be traced."""
    line = _LINK_TARGET.sub("]", _CODE.sub(" ", line))
    for phrase in ALLOWED:
        line = line.replace(phrase, " ")
    return line


def groups(line: str) -> Iterator[str]:
    """The numbers of a line of prose, an interval ("m [l, h]" or "[l, h]") as one group."""
    rest = prose(line)
    for m in _INTERVAL.finditer(rest):
        yield m[0]
    for m in _NUMBER.finditer(_INTERVAL.sub(" ", rest)):
        yield m[0]


def numbers_of(group: str) -> list[Number]:
    """The numbers of a group from `groups`."""
    return [Number.parse(m[0]) for m in _NUMBER.finditer(group)]


def field_values(field: str) -> list[float]:
    """The numbers a CSV field or TOML string holds ("training.lr=0.03" holds 0.03)."""
    try:
        return [float(field)]
    except ValueError:
        return [n.value * (n.sign or 1) for n in numbers_of(field)]


def csv_rows(path: Path) -> Iterator[list[float]]:
    """Each data row of a CSV as the numbers its fields hold (lines starting with "#" are
    comments, as in ablations/data/relations_game/paper_curves.csv)."""
    with path.open(newline="") as f:
        rows = csv.reader(line for line in f if not line.startswith("#"))
        next(rows, None)  # the header
        for row in rows:
            yield [v for field in row for v in field_values(field)]


def toml_values(path: Path) -> list[float]:
    """Every number among a TOML file's values (in strings too), not in its comments."""

    def leaves(value: object) -> Iterator[float]:
        if isinstance(value, dict):
            value = list(value.values())
        if isinstance(value, list):
            for item in value:
                yield from leaves(item)
        elif isinstance(value, bool):
            return
        elif isinstance(value, int | float):
            yield float(value)
        elif isinstance(value, str):
            yield from field_values(value)

    return list(leaves(tomllib.loads(path.read_text())))


class Sources:
    """The rows a text's numbers may come from, their values sorted for lookup."""

    def __init__(self, rows: list[list[float]]):
        self.entries = sorted(
            (abs(v), v, i) for i, row in enumerate(rows) for v in row if math.isfinite(v)
        )
        self.keys = [entry[0] for entry in self.entries]

    @classmethod
    def of(cls, text: str, own: str | None = None, root: Path = ROOT) -> Sources:
        """The CSVs and TOMLs of the grid `own` and of the grids and data files `text` cites
        (see the module's docstring); a TOML is one row."""
        grids = {own} if own else set()
        grids |= {name for m in _CITED_GRID.finditer(text) for name in m.groups() if name}
        rows: list[list[float]] = []
        for grid in sorted(grids):
            for path in sorted((root / "reports" / grid).glob("*.csv")):
                rows.extend(csv_rows(path))
            toml = root / "ablations" / "grids" / f"{grid}.toml"
            if toml.is_file():
                rows.append(toml_values(toml))
        for path in sorted((root / "ablations" / "data").rglob("*.csv")):
            if path.name in text:
                rows.extend(csv_rows(path))
        return cls(rows)

    def rows_with(self, number: Number) -> set[int]:
        """The rows holding a value that `number` stands for."""
        low, high = number.bounds()
        entries = self.entries[bisect_left(self.keys, low) : bisect_right(self.keys, high)]
        return {i for _, v, i in entries if number.sign is None or v * number.sign >= 0}

    def holds(self, group: str) -> bool:
        """Whether one row holds every number of the group."""
        return bool(set.intersection(*(self.rows_with(n) for n in numbers_of(group))))


def untraceable(path: Path, lines: list[tuple[int, str]], sources: Sources) -> list[Untraceable]:
    """The groups of numbers in `lines` (line number, text) that no single row holds."""
    return [
        Untraceable(path, number, group)
        for number, line in lines
        for group in groups(line)
        if not sources.holds(group)
    ]


def check_conclusion(path: Path, root: Path = ROOT) -> list[Untraceable]:
    """Untraceable numbers of ablations/grids/<grid>.conclusion.md (its grid's data: reports/
    <grid>/*.csv and ablations/grids/<grid>.toml, and what it cites)."""
    text = path.read_text()
    grid = path.name.removesuffix(".conclusion.md")
    lines = list(enumerate(text.splitlines(), start=1))
    return untraceable(path.relative_to(root), lines, Sources.of(text, grid, root))


def claims_rows(page: str) -> list[tuple[int, str]]:
    """The rows (line number, text) of a page's claims table: the markdown table whose header
    row starts with "| claim |", without its header and separator."""
    lines = page.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("| claim |")]
    if len(starts) != 1:
        raise ValueError(f"the page has {len(starts)} tables headed '| claim |'; expected one")
    rows = []
    for i in range(starts[0] + 2, len(lines)):
        if not lines[i].startswith("|"):
            break
        rows.append((i + 1, lines[i]))
    return rows


def check_claims_table(path: Path, root: Path = ROOT) -> list[Untraceable]:
    """Untraceable numbers of the claims table of the page `path` (README.md, docs/claims.md),
    each row against what it cites (the reports it names, the grid TOMLs and conclusions)."""
    rows = claims_rows(path.read_text())
    if not rows:
        raise ValueError(f"the claims table of {path} has no rows")
    where = path.relative_to(root)
    return [
        finding
        for number, row in rows
        for finding in untraceable(where, [(number, row)], Sources.of(row, root=root))
    ]


def report(found: list[Untraceable]) -> str:
    """The failure message: one untraceable number a line, with its file and line."""
    return f"{len(found)} numbers in no committed source:\n" + "\n".join(map(str, found))
