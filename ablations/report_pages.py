"""Report pages: plots and a list of blocks written as markdown and as one self-contained HTML
page, shared by the grid reports (ablations.report) and the benchmark reports (attn_zoo.bench).

A block is a tuple: ("h1" | "h2", text), ("p", text), ("ul", [items]),
("table", header, rows) with each row a list of (text, bold) cells, ("img", file, alt) with
`file` a PNG in the report's folder (linked from the markdown, embedded in the HTML), or
("note", text): the researcher's own note.

Every text is plain text, shown as written on both pages: the HTML page escapes it, and the
markdown page escapes the HTML special characters (& < >) and backslashes, writes it on one line
(newlines become spaces) and, in table cells, escapes "|" (in image alt text, "[" and "]").
A "note" is the one block whose markdown is intended: report.md keeps its markdown and its
lines, with only & < > escaped (so raw HTML tags show as text); index.html shows it as escaped
text, one paragraph per blank-line-separated part.

File names: `file_name` for names the code chose (bench suites), `label_file_name` for labels
a user wrote (tasks, families, cells): a slug and a hash of the exact label, so two labels never
share a file and no name can leave the folder; `path_in` checks a name lies in its folder.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from urllib.parse import quote

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def label_colours(labels: Iterable[str], palette: str = "tab10") -> dict[str, tuple]:
    """A fixed colour per label: the sorted labels take the palette's colours in turn."""
    colours = colormaps[palette]
    return {label: colours(i % colours.N) for i, label in enumerate(sorted(set(labels)))}


def new_figure() -> tuple[Figure, Axes]:
    """A figure of one plot, drawn by the Agg backend (no pyplot state)."""
    figure = Figure(figsize=(6.4, 4.2), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def plot_text(text: object) -> str:
    """`text` (a label) for a matplotlib title or legend: its dollar signs shown as written,
    never parsed as mathtext (where a label like '$\\foo$' would fail the drawing)."""
    return str(text).replace("$", r"\$")


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


def _markdown_text(text: object) -> str:
    """Plain text for markdown: one line, backslashes and & < > escaped."""
    line = " ".join(str(text).splitlines())
    return escape(line.replace("\\", "\\\\"), quote=False)


def _markdown_cell(text: object) -> str:
    return _markdown_text(text).replace("|", "\\|")


def _markdown_alt(text: object) -> str:
    return _markdown_text(text).replace("[", "\\[").replace("]", "\\]")


def _markdown_note(text: object) -> str:
    """A researcher's markdown note: its markdown and lines kept, raw HTML escaped."""
    return escape("\n".join(str(text).splitlines()).strip("\n"), quote=False)


def to_markdown(blocks: list[tuple]) -> str:
    """The blocks as markdown: images link to the PNGs beside it, bold cells in **; texts
    escaped as the module says."""
    parts = []
    for kind, *content in blocks:
        if kind in ("h1", "h2"):
            parts.append("#" * int(kind[1]) + " " + _markdown_text(content[0]))
        elif kind == "p":
            parts.append(_markdown_text(content[0]))
        elif kind == "note":
            parts.append(_markdown_note(content[0]))
        elif kind == "ul":
            parts.append("\n".join(f"- {_markdown_text(item)}" for item in content[0]))
        elif kind == "img":
            parts.append(f"![{_markdown_alt(content[1])}]({quote(content[0])})")
        elif kind == "table":
            header, rows = content
            lines = ["| " + " | ".join(map(_markdown_cell, header)) + " |"]
            lines.append("|" + "---|" * len(header))
            for row in rows:
                cells = [f"**{_markdown_cell(t)}**" if b else _markdown_cell(t) for t, b in row]
                lines.append("| " + " | ".join(cells) + " |")
            parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


STYLE = (
    "body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse;margin:1em 0}"
    "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}th{background:#f3f3f3}"
    "img{max-width:100%}"
)
PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
{body}
</body>
</html>
"""


def to_html(blocks: list[tuple], folder: Path) -> str:
    """The blocks as one HTML page titled by the first block, the PNGs from `folder` embedded
    as base64 data URIs."""
    parts = []
    for kind, *content in blocks:
        if kind in ("h1", "h2"):
            parts.append(f"<{kind}>{escape(content[0])}</{kind}>")
        elif kind == "p":
            parts.append(f"<p>{escape(content[0])}</p>")
        elif kind == "note":
            paragraphs = re.split(r"\n\s*\n", "\n".join(str(content[0]).splitlines()).strip())
            parts += [f"<p>{escape(text)}</p>" for text in paragraphs if text]
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{escape(i)}</li>" for i in content[0]) + "</ul>")
        elif kind == "img":
            data = base64.b64encode(path_in(folder, content[0]).read_bytes()).decode()
            alt = escape(content[1])
            parts.append(f'<p><img src="data:image/png;base64,{data}" alt="{alt}"></p>')
        elif kind == "table":
            header, rows = content
            lines = ["<table>", "<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>"]
            for row in rows:
                cells = [f"<b>{escape(t)}</b>" if b else escape(t) for t, b in row]
                lines.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
            parts.append("\n".join(lines + ["</table>"]))
    return PAGE.format(title=escape(blocks[0][1]), style=STYLE, body="\n".join(parts))


def write_pages(blocks: list[tuple], folder: Path) -> None:
    """Write the blocks to `folder` as report.md and index.html (its PNGs already there)."""
    path_in(folder, "report.md").write_text(to_markdown(blocks), encoding="utf-8")
    path_in(folder, "index.html").write_text(to_html(blocks, folder), encoding="utf-8")
