"""Offline tasks for the ablation runner (synthetic, and the relations-game files shipped in
ablations/data): `build_task(name, ...).splits(seed)`.

Importing this package registers every task below; see `registry` for the API.
"""

from . import (
    arithmetic,
    contains_set,
    copying,
    count_compare,
    grammar,
    match_pattern,
    mqar,
    relational_games,
    relations_game_files,
    same_pair,
    shakespeare,
    sorting,
)
from .registry import (
    IGNORE_INDEX,
    KINDS,
    Split,
    Task,
    build_task,
    list_tasks,
    register_task,
    task_arguments,
)

__all__ = [
    "IGNORE_INDEX",
    "KINDS",
    "Split",
    "Task",
    "arithmetic",
    "build_task",
    "contains_set",
    "copying",
    "count_compare",
    "grammar",
    "list_tasks",
    "match_pattern",
    "mqar",
    "register_task",
    "relational_games",
    "relations_game_files",
    "same_pair",
    "shakespeare",
    "sorting",
    "task_arguments",
]
