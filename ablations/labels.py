"""A user's label as pages, plots and the terminal show it (no heavy imports: the live display
uses it too).

    visible("std\u202eevil")   -> "std<U+202E>evil"   (bidirectional controls as code points)
    short_label(text, 60)      -> at most 60 characters: start, "…#" and 6 hex of its SHA-256
    terminal_text("a\x1b[31m") -> "a\\x1b[31m"       (control characters as escapes; shortened)
    csv_text("=HYPERLINK(1)")  -> "'=HYPERLINK(1)"    (a CSV cell a spreadsheet shows as text)
"""

from __future__ import annotations

import hashlib
import re

LABEL_CHARS = 60  # at most this many characters of a user's label in a plot (short_label)
CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # characters a plot has no glyph for
# Unicode's bidirectional controls: U+202E in a label shows everything after it reversed
BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: object) -> str:
    """`text` with each bidirectional control character shown as its code point ('<U+202E>'),
    so that a label cannot reverse itself or what follows it (a hash suffix, the next cell)."""
    return BIDI.sub(lambda match: f"<U+{ord(match[0]):04X}>", str(text))


def short_label(text: object, limit: int = LABEL_CHARS) -> str:
    """`text` (`visible`), or where it is longer than `limit` characters, its start, '…#' and
    the first 6 hex digits of the SHA-256 of the exact text: `limit` characters, and labels
    that share a start stay apart."""
    shown = visible(text)
    if len(shown) <= limit:
        return shown
    digest = hashlib.sha256(str(text).encode("utf-8", "surrogatepass")).hexdigest()[:6]
    return f"{shown[: limit - 8]}…#{digest}"


def terminal_text(text: object, limit: int = LABEL_CHARS) -> str:
    """`text` for a terminal line: control characters as escapes ('\\x1b': an escape sequence
    cannot recolour or retitle the terminal, a NUL or a line break cannot cut the line),
    bidirectional controls `visible`, at most `limit` characters (`short_label`)."""
    escaped = CONTROL.sub(lambda match: f"\\x{ord(match[0]):02x}", str(text))
    return short_label(escaped, limit)


def one_line(err: BaseException, limit: int = 200) -> str:
    """'Type: first line of the message', at most `limit` characters."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what makes a spreadsheet read a formula


def csv_text(value: object) -> object:
    """`value` for a CSV cell: a text that a spreadsheet would read as a formula (starting with
    = + - @, a tab or a carriage return) behind a "'", and so a text starting with "'" (one
    "'" taken off gives the text back, as ablations.results.cells_file reads it), its line breaks as
    newlines (a bare carriage return would end the row); numbers, a lone '-' and texts of a
    number (e.g. '-0.5') as they are."""
    if not isinstance(value, str):
        return value
    text = value.replace("\r\n", "\n").replace("\r", "\n")
    if value.startswith("'"):
        return "'" + text
    if not value.startswith(FORMULA_START) or value == "-":
        return text
    try:
        float(value)
    except ValueError:
        return "'" + text
    return text
