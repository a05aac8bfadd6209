"""Small grid specs for the runner's tests: one tiny task and size, cells that train in seconds.

    path = tiny_grid(tmp_path)                                   # 2 mechanisms x 2 seeds
    path = tiny_grid(tmp_path, seeds=[0], mechanisms=[STD, with_heads(STD, "std4", 4)],
                     training={"steps": 400, "eval_every": 5})
    spec = load_grid(path)

Each argument replaces that part of the spec whole, except `training`, whose keys update
`TRAINING` (the other keys keep their values). The store is tmp_path/<name>.sqlite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablations.grid.spec import SpecError, load_grid

SAME_PAIR = {"name": "same_pair", "kwargs": {"n_train": 128, "n_validation": 32, "n_test": 32}}
# A slow task: a minute a cell at 300 steps, so a run can be stopped while it trains.
MQAR_LONG = {
    "name": "mqar",
    "kwargs": {"seq_len": 1024, "num_kv_pairs": 4, "n_train": 256, "n_validation": 32,
               "n_test": 32},
}  # fmt: skip
XS = {"label": "xs", "d_model": 16, "n_layers": 1}
STD = {"label": "std", "name": "standard", "kwargs": {"n_heads": 2}}
REL = {
    "label": "rel",
    "name": "relational",
    "kwargs": {"n_heads": 2, "symbol_retrieval": "positional_symbols",
               "symbol_retrieval_kwargs": {"max_length": 4}},
}  # fmt: skip
TRAINING = {"steps": 20, "eval_every": 10, "batch_size": 16}


def with_heads(mechanism: dict, label: str, n_heads: int) -> dict:
    """`mechanism` under another label, with `n_heads` heads."""
    return {**mechanism, "label": label, "kwargs": {**mechanism["kwargs"], "n_heads": n_heads}}


def small(task: dict, n_train: int, n_evaluate: int) -> dict:
    """`task` with `n_train` training and `n_evaluate` validation and test examples."""
    sizes = {"n_train": n_train, "n_validation": n_evaluate, "n_test": n_evaluate}
    return {**task, "kwargs": {**task["kwargs"], **sizes}}


def tiny_grid(
    tmp_path: Path,
    *,
    name: str = "tiny",
    seeds: list[int] = (0, 1),
    tasks: list[dict] = (SAME_PAIR,),
    sizes: list[dict] = (XS,),
    mechanisms: list[dict] = (STD, REL),
    training: dict | None = None,
    checkpoints: bool | None = None,
    file: str = "grid.toml",
) -> Path:
    """Write the grid spec (TOML) to tmp_path/`file` and return its path."""
    lines = [
        f"name = {_value(name)}",
        f"seeds = {_value(list(seeds))}",
        f"store = {_value(str(tmp_path / f'{name}.sqlite'))}",
    ]
    if checkpoints is not None:
        lines.append(f"checkpoints = {_value(checkpoints)}")
    for table, entries in (("tasks", tasks), ("sizes", sizes), ("mechanisms", mechanisms)):
        for entry in entries:
            lines += ["", f"[[{table}]]", *(f"{k} = {_value(v)}" for k, v in entry.items())]
    lines += ["", "[training]"]
    lines += [f"{k} = {_value(v)}" for k, v in {**TRAINING, **(training or {})}.items()]
    path = tmp_path / file
    path.write_text("\n".join(lines) + "\n")
    return path


def _value(value: object) -> str:
    """`value` as TOML: a table inline, strings `_string`, numbers as JSON writes them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return _string(value) if isinstance(value, str) else json.dumps(value)


def _string(text: str) -> str:
    """`text` as a TOML basic string: printable ASCII as is, every other character escaped
    (\\uXXXX, or \\UXXXXXXXX beyond U+FFFF: JSON's surrogate pairs are not valid TOML)."""

    def escape(c: str) -> str:
        if c in '"\\':
            return "\\" + c
        if " " <= c <= "~":
            return c
        return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"

    return '"' + "".join(escape(c) for c in text) + '"'


def assert_refused(path: Path, fragments: list[str], overrides: list[str] | None = None) -> None:
    """Loading the grid at `path` (with `overrides`) raises a one-line SpecError that starts
    with the path and contains every fragment."""
    with pytest.raises(SpecError) as err:
        load_grid(path, overrides)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    for fragment in fragments:
        assert fragment in message
