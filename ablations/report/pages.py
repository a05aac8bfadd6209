"""Report pages: plots, and a page model written as markdown and as one self-contained HTML page
through two Jinja2 templates (templates/report.md.j2, templates/report.html.j2), shared by the
grid reports (ablations.report.build) and the benchmark reports (ablations.bench).

A `Page` has a title, the `question` it answers, header facts (a bullet list), an intro
paragraph, the researcher's `note` and `Section`s, shown in that order but for the note, which
follows the open sections and precedes the `details` ones (collapsed in index.html); a section
has a heading and parts, in order: `Paragraph`, `Bullets`, `Table`
(a DataFrame of the cells' texts and a boolean DataFrame of the cells shown in bold) and
`Image` (a PNG in the report's folder: linked from the markdown, embedded in the HTML).

Every text is plain text, shown as written on both pages: the HTML template autoescapes it, and the
markdown template's filter writes it on one line (newlines become spaces), the HTML special
characters (& < >) as entities and a backslash before every character markdown would read as code,
emphasis, a link or image, a table cell or a bare URL (`_markdown_text`): a label like
'![x](http://evil.example/t.png)' is shown as written, never as a remote image or link. The `note`
is the one text whose markdown is intended: report.md keeps its markdown and its lines, with only &
< > escaped (so raw HTML tags show as text); index.html renders it (`note_html`: CommonMark without
raw HTML or images, links only to the report's own files). CSVs: `write_csv` (no text cell read as a
formula). Plots: `plot_text`, `plot_title` and `short_label` (no label widens a figure without
bound).

File names: `file_name` for names the code chose (bench suites), `label_file_name` for labels
a user wrote (tasks, families, cells): a slug and a hash of the exact label, so two labels never
share a file and no name can leave the folder; `path_in` checks a name lies in its folder.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import tempfile
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from html import escape
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote

import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined
from markdown_it import MarkdownIt
from markupsafe import Markup
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ablations.labels import CONTROL, csv_text, short_label, visible


def label_colours(labels: Iterable[str]) -> dict[str, tuple]:
    """A fixed colour per label, each its own: the sorted labels take tab10's colours in
    turn, and where they are more, those of tab20, tab20b and tab20c (60 in all; beyond,
    they repeat)."""
    names = sorted(set(labels))
    palettes = ["tab10"] if len(names) <= 10 else ["tab20", "tab20b", "tab20c"]
    colours = [colour for palette in palettes for colour in colormaps[palette].colors]
    return {label: colours[i % len(colours)] for i, label in enumerate(names)}


def new_figure() -> tuple[Figure, Axes]:
    """A figure of one plot, drawn by the Agg backend (no pyplot state)."""
    figure = Figure(figsize=(6.4, 4.2), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


INSIDE_LEGEND = 8  # legends of up to this many entries sit inside the plot
LEGEND_ROW_INCHES = 0.2  # the height one row of an outside legend adds to its figure


def legend(figure: Figure, ax: Axes, outside: bool = False) -> None:
    """The legend of `figure`'s plots: inside `ax` for up to INSIDE_LEGEND entries (unless
    `outside`), else below the plots (two columns where they fit the figure's width, else one,
    the figure widened to hold it), the figure taller by its rows, so that the plots keep their
    size however many entries there are."""
    entries = sum(len(axes.get_legend_handles_labels()[1]) for axes in figure.axes)
    if entries <= INSIDE_LEGEND and not outside:
        ax.legend(fontsize="small")
        return
    width, height = figure.get_size_inches()
    for columns in (2, 1):
        figure.set_size_inches(width, height + LEGEND_ROW_INCHES * -(-entries // columns))
        box = figure.legend(fontsize="small", loc="outside lower center", ncols=columns)
        needed = box.get_window_extent(figure.canvas.get_renderer()).width / figure.dpi
        if needed <= width or columns == 1:
            break
        box.remove()
    figure.set_size_inches(max(width, needed + 0.2), figure.get_size_inches()[1])


TITLE_WIDTH = 70  # characters of a plot title per line: about the width of the default figure
PLOT_CHARS = 3 * TITLE_WIDTH  # at most this many characters of any text in a plot
TITLE_LABEL = 2 * TITLE_WIDTH  # at most this many characters of a label in a plot's title


def plot_text(text: object) -> str:
    """`text` (a label) for a matplotlib title or legend: at most PLOT_CHARS characters
    (`short_label`: a 10,000-character label would widen its figure to tens of thousands of
    pixels), control characters (tabs, line breaks: no glyph) as spaces, its dollar signs shown
    as written, never parsed as mathtext (where a label like '$\\foo$' would fail the drawing)."""
    text = CONTROL.sub(" ", short_label(text, PLOT_CHARS))
    return text.replace("$", r"\$")


def plot_title(text: object) -> str:
    """`text` for a plot title (`plot_text`), wrapped into lines of at most TITLE_WIDTH
    characters where it can be (at spaces), so that a long setting is not cut off."""
    return textwrap.fill(plot_text(text), TITLE_WIDTH)


SAFE_NAME = re.compile(r"[A-Za-z0-9_-]+")
SLUG_LENGTH = 40  # at most this many characters of the label in a file name
HASH_LENGTH = 8  # hex digits of the label's SHA-256 in a file name


def file_name(kind: str, name: str) -> str:
    """The PNG name of a plot of a name the code chose: '<kind>_<name>.png'; both must be
    [A-Za-z0-9_-]+ (ValueError otherwise: a user's label takes `label_file_name`)."""
    for part in (kind, name):
        if not SAFE_NAME.fullmatch(str(part)):
            raise ValueError(f"{part!r} is not a file name of [A-Za-z0-9_-]: use label_file_name")
    return f"{kind}_{name}.png"


def label_file_name(kind: str, label: str | Sequence[str], suffix: str = ".png") -> str:
    """The file name of a plot of a user's `label` (or of labels, e.g. task, size, mechanism):
    '<kind>_<slug>_<hash><suffix>', e.g. 'curves_pairs-v64_3fa2c1d0.png' for 'pairs v64'.
    <slug>: the label's runs of [A-Za-z0-9_-] joined by '-' (labels' slugs joined by '_'; at
    most 40 characters, left out when empty); <hash>: the first 8 hex digits of the SHA-256 of
    the exact label (of the JSON list of labels), so labels differing only in punctuation or
    case get different files. The name never holds a path separator or '..'."""
    if not SAFE_NAME.fullmatch(kind) or not re.fullmatch(r"(\.[A-Za-z0-9]+)?", suffix):
        raise ValueError(f"bad kind {kind!r} or suffix {suffix!r}")
    parts = [label] if isinstance(label, str) else [str(part) for part in label]
    exact = label if isinstance(label, str) else json.dumps(parts)
    slugs = (re.sub(r"[^A-Za-z0-9_-]+", "-", part).strip("-_") for part in parts)
    slug = "_".join(filter(None, slugs))[:SLUG_LENGTH].strip("-_")
    digest = hashlib.sha256(exact.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_LENGTH]
    return f"{kind}_{slug}_{digest}{suffix}" if slug else f"{kind}_{digest}{suffix}"


def path_in(folder: Path, name: str) -> Path:
    """The path of file `name` directly inside `folder`, resolved; ValueError when `name` is
    not a plain file name or the path would resolve outside `folder` (e.g. through a link)."""
    root = Path(folder).resolve()
    path = (root / name).resolve()
    if name in ("", ".", "..") or Path(name).name != name or path.parent != root:
        raise ValueError(f"refusing to write {name!r}: not a file name inside {root}")
    return path


def generated_now() -> str:
    """The local date and time a page is written, as its "Generated" line shows it."""
    return f"{datetime.now().astimezone():%Y-%m-%d %H:%M %Z}"


def writable_folder(option: str, folder: str | Path) -> Path:
    """`folder`, created if missing, once a file could be made in it; ValueError naming the
    option and the folder otherwise: a report's folder is checked before anything is measured."""
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as err:
        raise ValueError(
            f"{option} {folder}: cannot write files there ({err.strerror or err})"
        ) from None
    return path


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    """Write `frame` (no index) to the CSV file `path`, its texts and headers through
    `csv_text`: a label like '=HYPERLINK(...)' is shown as text, never run."""
    texts = frame.rename(columns=csv_text)
    for column in texts.columns:
        if pd.api.types.is_object_dtype(texts[column]):  # kept as objects: map would make 1 1.0
            values = [csv_text(value) for value in texts[column]]  # beside a missing value
            texts[column] = pd.Series(values, index=texts.index, dtype=object)
        elif not pd.api.types.is_numeric_dtype(texts[column]):
            texts[column] = texts[column].map(csv_text)
    texts.to_csv(path, index=False)


@dataclass(frozen=True)
class Paragraph:
    """A paragraph of plain text."""

    text: str
    kind: ClassVar[str] = "paragraph"


@dataclass(frozen=True)
class Bullets:
    """A bullet list of plain texts."""

    items: list[str]
    kind: ClassVar[str] = "bullets"


@dataclass(frozen=True)
class Image:
    """A PNG in the report's folder, by file name, and its alt text."""

    file: str
    alt: str
    kind: ClassVar[str] = "image"


@dataclass(frozen=True, eq=False)
class Table:
    """A table: `data` holds each cell's text (its columns are the header), `bold` (a boolean
    DataFrame of the same shape and columns; default: none) marks the cells shown in bold."""

    data: pd.DataFrame
    bold: pd.DataFrame | None = None
    kind: ClassVar[str] = "table"

    def __post_init__(self) -> None:
        if self.bold is None:
            mask = pd.DataFrame(False, index=self.data.index, columns=self.data.columns)
            object.__setattr__(self, "bold", mask)
        if self.bold.shape != self.data.shape or not self.bold.columns.equals(self.data.columns):
            raise ValueError("a table's bold mask must have its data's shape and columns")
        if not all(map(pd.api.types.is_bool_dtype, self.bold.dtypes)):
            raise ValueError("a table's bold mask must be boolean")

    @property
    def header(self) -> list[str]:
        return [str(column) for column in self.data.columns]

    @property
    def rows(self) -> list[list[tuple[str, bool]]]:
        """Each row's cells as (text, bold)."""
        return [
            [(str(text), bool(bold)) for text, bold in zip(texts, marks, strict=True)]
            for texts, marks in zip(self.data.to_numpy(), self.bold.to_numpy(), strict=True)
        ]


Part = Paragraph | Bullets | Table | Image


@dataclass
class Section:
    """A section of a page: a heading (level 2) and its parts, in order; a `details` section
    is one of the page's details, shown after the note, collapsed in index.html (<details>)."""

    heading: str
    parts: list[Part] = field(default_factory=list)
    details: bool = False


@dataclass
class Page:
    """A report page, in the order shown: its title (level 1 heading), the `question` it
    answers, facts (a bullet list), an intro paragraph, the sections that are not `details`,
    the researcher's note (markdown, see the module), then the `details` sections."""

    title: str
    facts: list[str] = field(default_factory=list)
    intro: str = ""
    note: str | None = None
    sections: list[Section] = field(default_factory=list)
    question: str | None = None

    @property
    def ordered(self) -> list[Section]:
        """The sections as shown: the open ones, then the details (each in its order)."""
        return sorted(self.sections, key=lambda section: section.details)


MARKDOWN_SPECIAL = re.compile(
    r"[\\`*\[\]|~]"  # code, emphasis, links and images, table cells, strikethrough
    r"|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])"  # emphasis (an underscore inside a word is none)
    r"|:(?=//)|(?<=www)\."  # the bare URLs a code host links (http://..., www.…)
)


def _markdown_text(text: object) -> str:
    """Plain text for markdown, shown as written: one line; a backslash before each character
    that markdown would read as code, emphasis, a link or image (every [ and ]), a table cell
    or a bare URL; & < > as HTML entities (no HTML, no <autolink>)."""
    line = " ".join(visible(text).splitlines())
    return escape(MARKDOWN_SPECIAL.sub(lambda match: "\\" + match[0], line), quote=False)


def _markdown_note(text: object) -> str:
    """A researcher's markdown note: its markdown and lines kept, raw HTML escaped."""
    return escape("\n".join(visible(text).splitlines()).strip("\n"), quote=False)


def note_html(text: object, folder: Path) -> Markup:
    """A researcher's note (markdown: bold, lists, links) as HTML for index.html: CommonMark
    (markdown-it-py) with no raw HTML (shown as text) and no images; a link only to a file of
    the report's `folder` (e.g. selection.csv), any other link's markdown shown as text."""

    def in_folder(url: str) -> bool:
        try:
            return path_in(folder, unquote(url)).is_file()
        except ValueError:
            return False

    markdown = MarkdownIt("commonmark", {"html": False}).disable("image")
    markdown.validateLink = in_folder
    return Markup(markdown.render("\n".join(visible(text).splitlines())))


def _html_value(value: object) -> object:
    """A value of the HTML page as shown: `visible`; markup made by the template (a macro's
    output, whose values were shown so already) as it is."""
    return value if isinstance(value, Markup) else visible(value)


@cache
def _templates(kind: str) -> Environment:
    """The Jinja2 environment of the "md" or "html" template: HTML autoescaped, every value
    `visible`; markdown through the filters md (plain text) and md_note (see the module)."""
    environment = Environment(
        finalize=_html_value if kind == "html" else None,
        loader=PackageLoader("ablations.report", "templates"),
        autoescape=kind == "html",
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.filters.update(
        md=_markdown_text,
        md_note=_markdown_note,
    )
    return environment


def render_markdown(page: Page) -> str:
    """The page as markdown: images link to the PNGs beside it, bold cells in **."""
    return _templates("md").get_template("report.md.j2").render(page=page)


def render_html(page: Page, folder: Path) -> str:
    """The page as one HTML page, the PNGs from `folder` embedded as base64 data URIs."""

    def embed(name: str) -> str:
        data = base64.b64encode(path_in(folder, name).read_bytes()).decode()
        return f"data:image/png;base64,{data}"

    return (
        _templates("html")
        .get_template("report.html.j2")
        .render(page=page, embed=embed, note=lambda text: note_html(text, folder))
    )


def write_pages(page: Page, folder: Path) -> None:
    """Write the page to `folder` as report.md and index.html (its PNGs already there)."""
    path_in(folder, "report.md").write_text(render_markdown(page), encoding="utf-8")
    path_in(folder, "index.html").write_text(render_html(page, folder), encoding="utf-8")
