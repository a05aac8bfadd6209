"""A fair comparison of mechanisms: each at its best setting, with confidence intervals.

Read from the cells a store holds (`ResultsStore.to_dataframe()`), not from a grid file, so
that any store can be read, one written before sweeps existed included:

- `varying_settings(frame)`: the settings the cells vary in beyond task, size, mechanism and
  seed: the config keys taking more than one value among the cells of one (task, size,
  mechanism), named as a grid file sweeps them ("training.lr", "model.pos_enc",
  "task_kwargs.n_train", "mechanism_kwargs.n_heads"). A training key a cell leaves out holds its
  default; the steps that `epochs` resolve to are not a setting of theirs.
- `select(cells, over, metric, reported)`: per task, size, mechanism and the other axes, the
  setting of the axes `over` whose cells have the best mean `metric` over seeds (the highest
  accuracy, the lowest loss), among the eligible settings: every seed of the group run, done,
  with a finite `metric` (a NaN result is never chosen, nor a search's pruned trial); each
  other setting excluded with why (`setting_problems`: "training.lr=1e+30: 1 of 3 seeds
  diverged", "training.lr=1e-07: 1 of 1 seeds pruned at step 40"); at the chosen setting, the
  `reported` metric: mean and 95% confidence interval over seeds (Student's t, n - 1 degrees
  of freedom). A seed counts once: two cells of one setting and seed are refused
  (`repeated_seed`).
- `paired(cells, selected, a, b, reported, margin)`: mechanism a minus mechanism b, each at
  its own best setting, seed by seed over the seeds both finished: the mean difference, its 95%
  interval (a paired t interval), the two-sided paired t test's p-value and, with an
  equivalence `margin`, the two one-sided tests' (`t_test_p`, `tost_p`), per task, size and
  other axes; no test where a cell of either mechanism there has not finished (`incomplete`),
  nor where one has no eligible setting (a row all the same, with `why`).
- `verdicts(pairs, margin)`: over the family of every paired difference a report shows, the
  Holm-adjusted p-values (`holm`) and each difference's verdict at family-wise level `ALPHA`:
  "a ahead", "b ahead" (the better one in the reported metric: higher accuracy, lower loss),
  "equivalent within ±m" (only with a margin), "no clear difference", or "incomplete" where a
  cell of either mechanism is still running or not run (its best setting may change).

As in zoology, the setting is chosen on validation data and the test metric of the chosen
setting is reported; the interval covers seed-to-seed variation at that setting, not the
choice itself (with few settings and seeds the chosen setting's estimate is slightly
optimistic for every mechanism alike).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import optimize, stats

from ablations.grid.cell import DEFAULTS
from ablations.grid.schema import higher_is_better
from ablations.results.frames import is_missing

SECTIONS = ("training.", "model.", "task_kwargs.", "mechanism_kwargs.")  # of the swept keys
GROUP = ["task", "size", "mechanism"]
MECHANISM_KWARGS = "mechanism_kwargs."


def _t_parts(values: pd.Series) -> tuple[float, float, int]:
    """(mean, standard deviation s, n) of `values`, NaN dropped (s NaN for n < 2)."""
    values = values.dropna().astype(float)
    n = len(values)
    return (values.mean() if n else math.nan), values.std(ddof=1), n


def interval(values: pd.Series, level: float = 0.95) -> tuple[float, float, float, int]:
    """(mean, low, high, n) of `values` (NaN dropped): the `level` confidence interval of the
    mean by Student's t with n - 1 degrees of freedom; low = high = NaN for n < 2."""
    mean, s, n = _t_parts(values)
    if n < 2:
        return mean, math.nan, math.nan, n
    half = stats.t.ppf(0.5 + level / 2, n - 1) * s / math.sqrt(n)
    return mean, mean - half, mean + half, n


SAME = 1e-12  # values whose s is within SAME of their mean's magnitude (at least 1) are equal


def no_spread(s: float, mean: float) -> bool:
    """Whether values of standard deviation `s` and mean `mean` are all equal up to float
    rounding: s <= SAME * max(1, |mean|). Differences of k/1000 accuracies, 0.041 on every
    seed, have s 6e-17, not 0; rounding leaves about 1e-16 of the values, a spread over seeds
    far more. False for NaN (n < 2)."""
    return bool(s <= SAME * max(1.0, abs(mean)))


def t_test_p(values: pd.Series) -> float:
    """The two-sided p-value of Student's one-sample t test of mean 0 (for paired differences:
    the paired t test): t = mean / (s / sqrt(n)), n - 1 degrees of freedom, the t of
    `interval`'s interval (p < 1 - level exactly where that interval excludes 0). Equal values
    (`no_spread`): 0 for a nonzero mean, 1 for a zero one; NaN for n < 2."""
    mean, s, n = _t_parts(values)
    if n < 2:
        return math.nan
    if no_spread(s, mean):
        return 0.0 if mean != 0 else 1.0
    return float(2 * stats.t.sf(abs(mean) / (s / math.sqrt(n)), n - 1))


def tost_p(values: pd.Series, margin: float) -> float:
    """The p-value of the two one-sided t tests (TOST) that the mean lies within (-margin,
    margin): the larger of the one-sided p-values against mean <= -margin (t = (mean + margin)
    / se) and against mean >= margin (t = (mean - margin) / se), n - 1 degrees of freedom;
    p < alpha exactly where the 1 - 2 alpha interval (90% for alpha 0.05) lies inside
    (-margin, margin). Equal values (`no_spread`): 0 inside, 1 outside; NaN for n < 2."""
    mean, s, n = _t_parts(values)
    if n < 2:
        return math.nan
    if no_spread(s, mean):
        return 0.0 if abs(mean) < margin else 1.0
    se = s / math.sqrt(n)
    below = stats.t.sf((mean + margin) / se, n - 1)  # against mean <= -margin
    above = stats.t.cdf((mean - margin) / se, n - 1)  # against mean >= margin
    return float(max(below, above))


def holm(p_values: pd.Series) -> pd.Series:
    """Holm's step-down adjustment of a family of p-values (NaN: no test, not counted): with the
    m p-values sorted, p(1) <= ... <= p(m), the adjusted p(i) = max over j <= i of
    min(1, (m - j + 1) p(j)). Rejecting where the adjusted p < alpha makes the chance of any
    false rejection in the family at most alpha, whatever the dependence between the tests."""
    tested = p_values.dropna().sort_values(kind="stable")
    scaled = tested * (len(tested) - np.arange(len(tested)))
    return scaled.clip(upper=1.0).cummax().reindex(p_values.index)


def axis_columns(cells: pd.DataFrame) -> list[str]:
    """The setting columns of `cells` (ablations.report.tables.tidy_cells): named as a grid
    sweeps them, "<section>.<key>" (`SECTIONS`); no other column of its has a dot."""
    return [c for c in cells.columns if c.startswith(SECTIONS)]


def varying_settings(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per cell of `frame` (`ResultsStore.to_dataframe()`), one column per setting
    that varies within some (task, size label, mechanism) of the store, by their
    swept-key names; values as text ("default" for a model option or kwarg not set). A cell
    that counts `epochs` has its steps as "epochs": they follow from n_train."""
    settings, group = _all_settings(frame)
    if settings.empty:
        return settings
    varies = settings.groupby(group, dropna=False).nunique().max() > 1
    return settings.loc[:, varies[varies].index.tolist()]


def differing_settings(frame: pd.DataFrame) -> dict[str, list[str]]:
    """Per task label of `frame` (`ResultsStore.to_dataframe()`), the settings that differ
    between its mechanisms of one size but not within one mechanism (so not
    `varying_settings`: no table names them), each as 'training.lr: std 0.001, rel 0.003'
    (a mechanism's values joined by '/'); tasks without any left out. Training, model and
    task settings only (mechanism_kwargs define the mechanism). E.g. a mechanism entry with its
    own training or model options, or a grid edited between runs."""
    settings, group = _all_settings(frame)
    if settings.empty:
        return {}
    varying = set(varying_settings(frame).columns)
    found: dict[str, list[str]] = {}
    task, size, mechanism = group
    for (label, _), cells in settings.groupby([task, size], sort=False, dropna=False):
        for key in cells.columns:
            if key in varying or key.startswith(MECHANISM_KWARGS) or cells[key].nunique() < 2:
                continue  # a mechanism's own kwargs are what it is, not a setting of its run
            values = cells[key].groupby(mechanism.loc[cells.index], sort=False).unique()
            text = ", ".join(f"{m} {'/'.join(map(str, v))}" for m, v in values.items())
            if f"{key}: {text}" not in found.get(str(label), []):
                found.setdefault(str(label), []).append(f"{key}: {text}")
    return found


def _all_settings(frame: pd.DataFrame) -> tuple[pd.DataFrame, list[pd.Series]]:
    """Every setting of every cell of `frame` as text, one column per swept-key name (its
    column's; the training keys in TrainingSettings' order), and the cells' (task, size
    label, mechanism) columns."""
    if frame.empty:
        return pd.DataFrame(index=frame.index), []
    missing = pd.Series(math.nan, index=frame.index)
    defaults = {f"training.{k}": v for k, v in DEFAULTS.items()}
    columns = [c for c in frame.columns if c.startswith(SECTIONS)]
    at = next((i for i, c in enumerate(columns) if c in defaults), len(columns))
    columns = [*columns[:at], *defaults, *(c for c in columns[at:] if c not in defaults)]
    values = {}
    for column in columns:  # a training key a cell leaves out holds its default
        given = frame.get(column, missing)
        if column in defaults:
            given = [defaults[column] if is_missing(v) else v for v in given]
        values[column] = [_text(v) for v in given]
    settings = pd.DataFrame(values, index=frame.index)
    if "training.epochs" in frame:  # steps derived from epochs: not a setting of theirs
        settings.loc[frame["training.epochs"].notna(), "training.steps"] = "epochs"
    group = [frame.get(k, missing) for k in ("task", "size", "mechanism")]
    return settings, group


def _text(value: object) -> str:
    return "default" if is_missing(value) else str(value)


def setting_text(row: pd.Series, keys: list[str]) -> str:
    """'training.lr=0.001, model.pos_enc=rope' for the axes `keys` of a cell; '' for none."""
    return ", ".join(f"{key}={row[key]}" for key in keys)


def varying_per_task(cells: pd.DataFrame, keys: list[str]) -> dict[str, list[str]]:
    """Per task label of `cells`, the settings of `keys` taking more than one value among its
    cells (the others name no choice there: left out of its settings' texts)."""
    return {
        task: [key for key in keys if group[key].nunique(dropna=False) > 1]
        for task, group in cells.groupby("task", sort=False)
    }


def select(
    cells: pd.DataFrame, over: list[str], metric: str, reported: str, finite: tuple[str, ...] = ()
) -> pd.DataFrame:
    """The best setting of the axes `over` per (task, size, mechanism, other axes). `cells`: one
    row per cell with task, size, mechanism, seed, status, the axis columns and the metrics. A
    setting is eligible when every seed of its group has a cell at it, done, with a finite
    `metric` (and finite `finite` metrics: pass every reported metric, so that each gets the
    same settings); the chosen one has the best mean `metric` among them. Returns one row per
    group: its labels, `others` (the other axes' setting), `best` (the chosen setting of `over`;
    '-' for none), `candidates` (settings eligible), `settings` (settings tried), `excluded`
    (why the others are not eligible, e.g. "training.lr=1e+30: 1 of 3 seeds diverged"; '' for
    none), the chosen setting's mean `metric` (`chosen_on`), the `reported` metric's mean, low,
    high and n, its cells' `seeds` and `rows` (index labels of `cells`), `held` (the seeds the
    group holds a cell of, at any setting), `edge` (`sweep_edge`: where the choice lies on the
    edge of the sweep; '' where a setting tied with it does not), `tied` (the other eligible
    settings with the same mean `metric`, '; '-joined: the choice among them is the first tried,
    no better) and `unfinished` (the group's cells at any setting still running or not run: the
    choice may change). ValueError where `cells` holds two cells of one seed (`repeated_seed`).
    """
    repeated = repeated_seed(cells)
    if repeated:
        raise ValueError(f"select: two cells of one seed, {repeated}: a seed counts once")
    axes = axis_columns(cells)
    over = [key for key in over if key in axes]
    others = [key for key in axes if key not in over]
    sign = 1 if higher_is_better(metric) else -1
    rows = []
    shown = varying_per_task(cells, others)
    for labels, group in cells.groupby(GROUP + others, sort=False, dropna=False):
        best, best_score, scored, excluded = None, -math.inf, [], []
        per_setting = group.groupby(over, sort=False) if over else [((), group)]
        seeds = set(group.seed)
        tried = 0
        for _setting, runs in per_setting:
            tried += 1
            problems = setting_problems(runs, seeds, [metric, *finite])
            if problems:
                name = setting_text(runs.iloc[0], over)
                excluded.append(f"{name}: {problems}" if name else problems)
                continue
            score = sign * runs[metric].mean()
            scored.append((score, runs))
            if score > best_score:
                best, best_score = runs, score
        eligible = len(scored)
        ties = [runs for score, runs in scored
                if runs is not best and no_spread(abs(score - best_score), best_score)]  # fmt: skip
        row = dict(zip(GROUP + others, labels, strict=True))
        row["others"] = setting_text(pd.Series(row), shown[row["task"]])
        row.update(candidates=eligible, settings=tried, excluded="; ".join(excluded),
                   unfinished=int(group.status.isin(NOT_FINISHED).sum()),
                   held=tuple(sorted(seeds)))  # fmt: skip
        if best is None:
            missing = dict.fromkeys(("chosen_on", "mean", "low", "high"), math.nan)
            rows.append(row | missing | {"best": "-", "n": 0, "edge": "", "tied": ""})
            continue
        mean, low, high, n = interval(best[reported])
        inside = [runs for runs in ties if not sweep_edge(group, runs.iloc[0], over)]
        row.update(
            best=setting_text(best.iloc[0], over), chosen_on=sign * best_score, mean=mean,
            low=low, high=high, n=n, seeds=tuple(best.seed), rows=tuple(best.index),
            edge="" if inside else sweep_edge(group, best.iloc[0], over),
            tied="; ".join(setting_text(runs.iloc[0], over) for runs in ties),
        )  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


def repeated_seed(cells: pd.DataFrame) -> str:
    """The first task, size, mechanism, setting (of every `axis_columns` column) and seed that
    `cells` (one row per cell, as `select` takes them) holds more than one cell of, with those
    cells' keys (index labels without a `key` column): "task t, size s, mechanism a,
    training.lr=0.001, seed 0: cells 3f2a..., 9c1b..." (e.g. a grid's cells and those of a
    renamed copy of it in one store: the grid name keys a cell, but is no setting); '' where
    each seed has one cell."""
    place = [*GROUP, *axis_columns(cells), "seed"]
    twice = cells[cells.duplicated(place, keep=False)]
    if twice.empty:
        return ""
    _, same = next(iter(twice.groupby(place, sort=False, dropna=False)))
    first = same.iloc[0]
    where = [f"{key} {first[key]}" for key in GROUP] + [setting_text(first, axis_columns(cells))]
    names = same.key if "key" in same else same.index
    return (
        f"{', '.join(filter(None, where))}, seed {first.seed}: cells {', '.join(map(str, names))}"
    )


def sweep_edge(group: pd.DataFrame, chosen: pd.Series, over: list[str]) -> str:
    """Where the `chosen` setting lies on the edge of a numeric axis of `over` among the
    values `group` tried (two or more): "training.lr=0.03 the highest tried" (the best may lie
    beyond the sweep), '; '-joined; '' where none does."""
    edges = []
    for key in over:
        tried = pd.to_numeric(group[key], errors="coerce")
        value = pd.to_numeric(pd.Series([chosen[key]]), errors="coerce")[0]
        if tried.isna().any() or pd.isna(value) or tried.nunique() < 2:
            continue
        if value in (tried.min(), tried.max()):
            end = "highest" if value == tried.max() else "lowest"
            edges.append(f"{key}={chosen[key]} the {end} tried")
    return "; ".join(edges)


NOT_FINISHED = ("running", "todo")  # statuses whose cell may still finish
UNFINISHED = {
    "diverged": "diverged", "failed": "failed", "pruned": "pruned", "running": "unfinished",
    "todo": "not run",
}  # fmt: skip


def setting_problems(runs: pd.DataFrame, seeds: set, metrics: list[str]) -> str:
    """Why the cells `runs` of one setting are not eligible for selection, or '' where they
    are: of the group's `seeds`, how many have no cell at the setting ("not run"), are not done
    (diverged, failed, pruned by a search: at its `pruned_at` steps where `runs` has them,
    unfinished) or are done with a metric of `metrics` NaN or infinite, e.g. "1 of 3 seeds
    diverged, 1 of 3 seeds not run", "1 of 1 seeds pruned at step 40"."""
    counts = {"not run": len(seeds - set(runs.seed))}
    for status, count in runs.status.value_counts(sort=False).items():
        if status != "done":
            what = UNFINISHED.get(status, str(status))
            if status == "pruned" and "pruned_at" in runs:
                steps = sorted({int(s) for s in runs.pruned_at[runs.status == status].dropna()})
                what += f" at step{'s' * (len(steps) > 1)} {', '.join(map(str, steps))}"
            counts[what] = counts.get(what, 0) + count
    done = runs[runs.status == "done"]
    for name in metrics:
        values = pd.to_numeric(done.get(name, pd.Series(math.nan, done.index)), errors="coerce")
        counts[f"with a non-finite {name}"] = int((~values.map(math.isfinite)).sum())
    return ", ".join(
        f"{count} of {len(seeds)} seeds {what}" for what, count in counts.items() if count
    )


ALPHA = 0.05  # the family-wise error rate of a report's verdicts
POWER = 0.8  # the chance of detecting a difference the size of `detectable_effect`
PAIRED_COLUMNS = [
    "task", "size", "others", "a", "b", "mean", "low", "high", "n", "sd", "p", "tost_p",
    "reported", "incomplete", "why", "tied",
]  # fmt: skip


def detectable_effect(sd: float, n: int, level: float, power: float = POWER) -> float:
    """The minimum detectable effect of a two-sided paired t test at `level` over n seeds whose
    differences have standard deviation `sd`: the true mean difference δ > 0 it detects with
    probability `power`, P(|T| > t(1 − level/2, n−1)) = power for T noncentral t with n − 1
    degrees of freedom and noncentrality δ√n/sd (the spread observed standing in for the
    true one). NaN for n < 2; 0 for sd = 0."""
    if n < 2 or pd.isna(sd):
        return math.nan
    if sd == 0:
        return 0.0
    df, critical = n - 1, stats.t.ppf(1 - level / 2, n - 1)

    def shortfall(effect: float) -> float:
        shift = effect * math.sqrt(n) / sd
        below = stats.nct.sf(critical, df, -shift)  # P(T < -critical), by symmetry: the
        return stats.nct.sf(critical, df, shift) + below - power  # cdf's far tail gives NaN

    high = sd
    while shortfall(high) < 0:
        high *= 2
    return optimize.brentq(shortfall, 0.0, high, xtol=1e-12 * sd)


def paired(
    cells: pd.DataFrame,
    selected: pd.DataFrame,
    a: str,
    b: str,
    reported: str,
    margin: float | None = None,
) -> pd.DataFrame:
    """`a` minus `b` (mechanism labels), each at its best setting (`select`'s rows), seed by
    seed over the seeds both have: per task, size and other axes, the mean difference of
    `reported`, its 95% paired interval, n, the differences' standard deviation (`sd`), the
    paired t test's two-sided p-value (`t_test_p`)
    and, with an equivalence `margin` (in `reported`'s units), the TOST p-value (`tost_p`;
    NaN without), `reported` (the metric: which sign of the difference is better) and
    `incomplete`: where a cell of either mechanism there (at any setting) is still running or
    not run, e.g. "a: 2 cells running or not run", or one holds no cell of a seed the other
    holds in the task (a store whose grid's missing cells were not listed: "a: no cell of
    seed 2, which the other has (not run)"), and then no p-value (no test: its best setting
    may yet change); '' where both are complete; `tied`: where either mechanism's chosen
    setting ties with another (`select`'s `tied`: the first tried is taken, so the verdict may
    rest on that order), "a at training.lr=0.001 tied with training.lr=0.01"; `why` a row has
    no test (n < 2): ''
    where it has one, "b: no eligible setting (training.lr=0.001: 3 of 3 seeds diverged;
    ...)" (`select`'s `excluded`), "n < 2: no test", "no seed both finished". Where `selected`
    has no row of a or b there, no row. ValueError where the cells of a mechanism's chosen
    setting hold two cells of one seed (`repeated_seed`)."""
    rows = []
    for (task, size, others), group in selected.groupby(["task", "size", "others"], sort=False):
        by = {row.mechanism: row for row in group.itertuples()}
        if a not in by or b not in by:
            continue
        runs = {}
        for m in (a, b):
            chosen = cells.loc[list(by[m].rows if by[m].n else [])]
            repeated = repeated_seed(chosen)
            if repeated:
                raise ValueError(f"paired: two cells of one seed, {repeated}: a seed counts once")
            runs[m] = chosen.set_index("seed")[reported]
        both = runs[a].index.intersection(runs[b].index)
        differences = runs[a][both] - runs[b][both]
        mean, low, high, n = interval(differences)
        lacking = {m: sorted(set(by[o].held) - set(by[m].held)) for m, o in ((a, b), (b, a))}
        incomplete = "; ".join(
            [f"{m}: {by[m].unfinished} cells running or not run" for m in (a, b)
             if by[m].unfinished]
            + [f"{m}: no cell of seed {', '.join(map(str, lacking[m]))}, which the other has "
               "(not run)" for m in (a, b) if lacking[m]]
        )  # fmt: skip
        tested = not incomplete and margin is not None
        why = [f"{m}: no eligible setting ({by[m].excluded})" for m in (a, b) if not by[m].n]
        if not why and n < 2:
            why = ["n < 2: no test" if n else "no seed both finished"]
        rows.append({
            "task": task, "size": size, "others": others, "a": a, "b": b, "mean": mean,
            "low": low, "high": high, "n": n, "sd": _t_parts(differences)[1],
            "p": math.nan if incomplete else t_test_p(differences),
            "tost_p": tost_p(differences, margin) if tested else math.nan,
            "reported": reported, "incomplete": incomplete, "why": "; ".join(why),
            "tied": "; ".join(f"{m} at {by[m].best} tied with {by[m].tied}"
                              for m in (a, b) if getattr(by[m], "tied", "")),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=PAIRED_COLUMNS)


def verdicts(
    pairs: pd.DataFrame, margin: float | None = None, effect: float | None = None
) -> pd.DataFrame:
    """`pairs` (`paired`'s rows, one family: every difference a report shows, its index
    unique) with `p_holm` and `tost_p_holm` (`holm` over the family, each test apart), the
    `detectable` effect of each (`detectable_effect` at level ALPHA / m, m the family's tests:
    the strictest level Holm's procedure applies, so a difference that large is called with
    at least `POWER` chance) and a `verdict` at family-wise level `ALPHA`: "<a> ahead" or "<b>
    ahead" where p_holm < ALPHA (a where the mean a − b is better in the row's `reported`
    metric: above 0 for an accuracy, below 0 for a loss; ", by less than m" where the TOST
    also holds), else "equivalent within ±m" where tost_p_holm < ALPHA (only with a `margin`
    m), else "underpowered (detectable ±d > ±e of interest)" where the `effect` of interest e
    is below the detectable one d, else "no clear difference (detectable ±d)": no evidence of
    no difference; "incomplete (...)" where the row is `incomplete`; "-" where n < 2 (no
    test); where every seed gives the same difference (`no_spread`, up to float rounding: a
    ceiling, a discrete metric), "identical on every seed" or "<a> ahead on every seed by the
    same d" and a detectable effect of 0, never a p-value's verdict or a detectable ±0. A verdict
    of a row whose selection `tied` ends "; rests on a tie in the selection (...)"."""
    p_holm, tost_holm = holm(pairs.p), holm(pairs.tost_p)
    level = ALPHA / max(int(pairs.p.notna().sum()), 1)
    flat = [no_spread(row.sd, row.mean) for row in pairs.itertuples()]
    detectable = [
        0.0 if same else detectable_effect(row.sd, row.n, level)
        for row, same in zip(pairs.itertuples(), flat, strict=True)
    ]
    words = []
    for row, p, tost, d, same in zip(
        pairs.itertuples(), p_holm, tost_holm, detectable, flat, strict=True
    ):
        equivalent = margin is not None and tost < ALPHA  # False for NaN: no test
        if row.incomplete:
            words.append(f"incomplete ({row.incomplete}): no verdict yet")
        elif pd.isna(p):
            words.append("-")
        elif same:  # every seed the same difference: a t test has no spread to use
            a_better = row.mean > 0 if higher_is_better(row.reported) else row.mean < 0
            within = f", equivalent within ±{margin:g}" if equivalent else ""
            words.append(
                f"identical on every seed{within} (no spread: nothing to test)" if row.mean == 0
                else f"{row.a if a_better else row.b} ahead on every seed by the same "
                f"{abs(row.mean):.3g}{within} (no spread: the t test does not apply)"
            )  # fmt: skip
        elif p < ALPHA:
            a_better = row.mean > 0 if higher_is_better(row.reported) else row.mean < 0
            ahead = f"{row.a if a_better else row.b} ahead"
            words.append(f"{ahead}, by less than {margin:g}" if equivalent else ahead)
        elif equivalent:
            words.append(f"equivalent within ±{margin:g}")
        elif effect is not None and d > effect:
            words.append(f"underpowered (detectable ±{d:.3g} > ±{effect:g} of interest)")
        else:
            words.append(f"no clear difference (detectable ±{d:.3g})")
    words = [
        f"{word}; rests on a tie in the selection ({row.tied}: the first tried is taken)"
        if getattr(row, "tied", "") and not row.incomplete and word != "-"
        else word
        for word, row in zip(words, pairs.itertuples(), strict=True)
    ]
    return pairs.assign(p_holm=p_holm, tost_p_holm=tost_holm, detectable=detectable,
                        verdict=words)  # fmt: skip
