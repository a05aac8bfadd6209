"""Grid vs search: the cost of bracketing each mechanism's learning rate, and the rate chosen.

    python reports/search_vs_grid/compare.py    # writes reports/search_vs_grid/comparison.csv

Reads only committed CSVs: the grid's cells and choices (`make demo-lr-check`: 5 rates x 6
seeds, reports/demo_lr_check/cells.csv, selection.csv) and the search's cells
(ablations/grids/demo_lr_check_search.toml and its mqar half, demo_lr_check_search_mqar.toml:
5 trials on seed 0 with median pruning, exported by `attn-zoo report` to
reports/demo_lr_check_search/cells.csv and reports/demo_lr_check_search_mqar/cells.csv). One
row per (task, n_train, mechanism) of the search, then a total row:

- grid_cells, grid_steps, grid_wall_s: the grid's cells on seed 0 (the seed the search trains
  on), the steps they trained and the sum of their `wall_s`; grid_cells_all_seeds and
  grid_wall_s_all_seeds: the whole grid, 6 seeds.
- search_cells (trials: done, pruned, failed), search_steps, search_wall_s: the same for the
  search's trials; search_wall_s_at_grid_pace: its steps at the grid's seconds per step
  (the mean `step_ms` of the grid's seed-0 cells of the row): the two ran at other times, on
  a machine shared with other jobs, so steps are the like-for-like cost and this column the
  time they would have taken at the grid's pace.
- grid_lr_seed0 (val_acc), grid_lr (its [selection] on the mean over 6 seeds: selection.csv),
  search_lr (val_acc): the chosen rates; search_lr_nearest_grid_rate: the grid's rate
  nearest the search's in log scale; search_matches_grid_lr: whether that is grid_lr;
  grid_lr_seed0_matches_grid_lr: whether the grid's own seed-0 choice is (how far one seed
  goes); in the total row, how many rows match. grid_val_acc_seed0, search_val_acc: the best
  validation accuracy each found on seed 0.
"""

import math
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
REPORTS = HERE.parent
KEYS = ["task", "task_kwargs.n_train", "mechanism"]
SUMMED = (  # the columns the total row adds up
    "grid_cells", "grid_steps", "grid_wall_s", "grid_cells_all_seeds", "grid_wall_s_all_seeds",
    "search_cells", "search_done", "search_pruned", "search_failed", "search_steps",
    "search_wall_s", "search_wall_s_at_grid_pace", "search_matches_grid_lr",
    "grid_lr_seed0_matches_grid_lr",
)  # fmt: skip


def main() -> None:
    grid = pd.read_csv(REPORTS / "demo_lr_check" / "cells.csv")  # written when config columns
    grid.columns = grid.columns.str.removeprefix("config.")  # were prefixed: "config.task"
    chosen = pd.read_csv(REPORTS / "demo_lr_check" / "selection.csv")
    search = pd.concat(
        pd.read_csv(REPORTS / name / "cells.csv")
        for name in ("demo_lr_check_search", "demo_lr_check_search_mqar")
    )
    rates = sorted(grid["training.lr"].unique())
    rows = []
    for (task, n_train, mechanism), trials in search.groupby(KEYS, sort=False):
        like = grid[
            (grid["task"] == task)
            & (grid["task_kwargs.n_train"] == n_train)
            & (grid["mechanism"] == mechanism)
        ]
        seed0 = like[like["seed"] == 0]
        done = trials[trials.status == "done"]
        best = done.loc[done["metrics.val_acc"].idxmax()]
        pace = seed0["metrics.step_ms"].mean() / 1e3
        row = chosen[
            (chosen.task == task)
            & (chosen["task_kwargs.n_train"] == n_train)
            & (chosen.mechanism == mechanism)
        ].iloc[0]
        search_lr = best["training.lr"]
        nearest = min(rates, key=lambda rate: abs(math.log(rate / search_lr)))
        grid_lr = float(row.best.removeprefix("training.lr="))
        grid_lr_seed0 = seed0.loc[seed0["metrics.val_acc"].idxmax(), "training.lr"]
        rows.append({
            "task": task, "n_train": n_train, "mechanism": mechanism,
            "grid_cells": len(seed0), "grid_steps": int(seed0["metrics.steps"].sum()),
            "grid_wall_s": seed0["metrics.wall_s"].sum(),
            "grid_cells_all_seeds": len(like),
            "grid_wall_s_all_seeds": like["metrics.wall_s"].sum(),
            "search_cells": len(trials), "search_done": len(done),
            "search_pruned": int((trials.status == "pruned").sum()),
            "search_failed": int((trials.status == "failed").sum()),
            "search_steps": int(trials["metrics.steps"].sum()),
            "search_wall_s": trials["metrics.wall_s"].sum(),
            "search_wall_s_at_grid_pace": trials["metrics.steps"].sum() * pace,
            "grid_lr_seed0": grid_lr_seed0,
            "grid_lr": grid_lr,
            "search_lr": search_lr,
            "search_lr_nearest_grid_rate": nearest,
            "search_matches_grid_lr": nearest == grid_lr,
            "grid_lr_seed0_matches_grid_lr": grid_lr_seed0 == grid_lr,
            "grid_val_acc_seed0": seed0["metrics.val_acc"].max(),
            "search_val_acc": best["metrics.val_acc"],
        })  # fmt: skip
    table = pd.DataFrame(rows)
    total = {"task": "total", **table[list(SUMMED)].sum().to_dict()}
    table = pd.concat([table, pd.DataFrame([total])], ignore_index=True)
    table.to_csv(HERE / "comparison.csv", index=False, float_format="%.6g")


if __name__ == "__main__":
    main()
