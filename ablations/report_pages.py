"""Report pages: plots and a list of blocks written as markdown and as one self-contained HTML
page, shared by the grid reports (ablations.report) and the benchmark reports (attn_zoo.bench).

A block is a tuple: ("h1" | "h2", text), ("p", text), ("ul", [items]),
("table", header, rows) with each row a list of (text, bold) cells, or ("img", file, alt) with
`file` a PNG in the report's folder (linked from the markdown, embedded in the HTML).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from html import escape
from pathlib import Path

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


def file_name(kind: str, name: str) -> str:
    """The PNG name of a plot: '<kind>_<name>.png', characters other than [A-Za-z0-9_-] as _."""
    return f"{kind}_{re.sub(r'[^A-Za-z0-9_-]', '_', str(name))}.png"


def _markdown_cell(text: str) -> str:
    return escape(str(text), quote=False).replace("|", "\\|")


def to_markdown(blocks: list[tuple]) -> str:
    """The blocks as markdown: images link to the PNGs beside it, bold cells in **."""
    parts = []
    for kind, *content in blocks:
        if kind in ("h1", "h2"):
            parts.append("#" * int(kind[1]) + " " + content[0])
        elif kind == "p":
            parts.append(content[0])
        elif kind == "ul":
            parts.append("\n".join(f"- {item}" for item in content[0]))
        elif kind == "img":
            parts.append(f"![{content[1]}]({content[0]})")
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
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{escape(i)}</li>" for i in content[0]) + "</ul>")
        elif kind == "img":
            data = base64.b64encode((folder / content[0]).read_bytes()).decode()
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
    (folder / "report.md").write_text(to_markdown(blocks), encoding="utf-8")
    (folder / "index.html").write_text(to_html(blocks, folder), encoding="utf-8")
