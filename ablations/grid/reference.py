"""The grid file's reference, generated from its schema (ablations/grid/schema.py): a section
per table, each key with what it may be and its default, so that the documentation cannot
drift from what `load_grid` accepts.

    python -m ablations.grid.reference > docs/grid_reference.md     # make grid-reference

tests/test_docs.py checks that the committed page is the one this writes.
"""

from __future__ import annotations

import inspect
import sys
from typing import get_args, get_origin, get_type_hints

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ablations.grid.schema import (
    GridFile,
    GridRules,
    MechanismEntry,
    ModelOptions,
    ReferenceCurve,
    ReportSettings,
    Resources,
    Resume,
    Search,
    Selection,
    SizeEntry,
    Sweep,
    Table,
    TaskEntry,
    Tracking,
    TrainingSettings,
)
from ablations.grid.validate import annotation_parts

TABLES: list[tuple[str, type[Table]]] = [  # (heading, schema) in the order a grid file reads
    ("The top level", GridFile),
    ("[[tasks]]", TaskEntry),
    ("[[sizes]]", SizeEntry),
    ("[[mechanisms]]", MechanismEntry),
    ("[training]", TrainingSettings),
    ("[model]", ModelOptions),
    ("[sweep]", Sweep),
    ("[selection]", Selection),
    ("[resources]", Resources),
    ("[resume]", Resume),
    ("[grid]", GridRules),
    ("[tracking]", Tracking),
    ("[search]", Search),
    ("[report]", ReportSettings),
    ("[[report.reference_curves]]", ReferenceCurve),
]
HEADINGS = {schema: heading for heading, schema in TABLES}


def _valid(schema: type[Table], name: str) -> str:
    """What field `name` of `schema` may be: its `Valid` text, or its choices as they are
    registered now; a table: its heading."""
    annotation, valids = annotation_parts(get_type_hints(schema, include_extras=True)[name])
    if not valids and get_origin(annotation) is dict:  # keys and their values: the values'
        annotation, valids = annotation_parts(get_args(annotation)[1])
    if valids:
        return valids[0].text or "one of " + ", ".join(f"`{c}`" for c in valids[0].options())
    if inspect.isclass(annotation) and issubclass(annotation, Table):
        return f"a table: {HEADINGS.get(annotation, annotation.__name__)}"
    return str(annotation)


def _default(info: FieldInfo) -> str:
    """A field's default as a grid file would write it; "computed" where a function of the
    other settings gives it; "required" where it has none."""
    if info.default_factory is not None:
        return "computed (see valid values)"
    if info.default is PydanticUndefined:
        return "required"
    if isinstance(info.default, Table):
        return "(the table's defaults)"
    if info.default is None:
        return "unset"
    value = info.default
    text = str(value).lower() if isinstance(value, bool) else repr(value).replace("'", '"')
    return f"`{text}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def grid_reference() -> str:
    """The reference page (markdown): a section per table of the grid file."""
    lines = [
        "# Grid file reference",
        "",
        "Generated from the grid file's schema (`ablations/grid/schema.py`) by",
        "`python -m ablations.grid.reference` (`make grid-reference`); do not edit by hand.",
        "How grids, sweeps and reports work: [Grids and reports](grids.md).",
    ]
    for heading, schema in TABLES:
        lines += ["", f"## {heading}", "", " ".join(inspect.getdoc(schema).split()), ""]
        lines += ["| key | valid values | default |", "| --- | --- | --- |"]
        for name, info in schema.model_fields.items():
            lines.append(f"| `{name}` | {_cell(_valid(schema, name))} | {_cell(_default(info))} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(grid_reference())
