"""Figures that read: an accuracy's axis stays within [0, 1] (the tables print intervals
unclipped), no metric-vs-parameters figure where the counts do not vary (387,000 and 387,250
parameters gave ticks 3.87×10^5 3.8725×10^5 ...), plain tick labels."""

import pandas as pd

from ablations.report.figures import plot_vs_params, plot_vs_train_size


def done(params: list[int], accuracies: list[list[float]]) -> pd.DataFrame:
    rows = [
        {"size": "s", "mechanism": f"m{i}", "setting": "", "params": p, "test_acc": acc,
         "test_loss": 2.0 - acc, "n_train": n_train, "seed": seed}
        for i, (p, values) in enumerate(zip(params, accuracies, strict=True))
        for n_train in (100, 1000)
        for seed, acc in enumerate(values)
    ]  # fmt: skip
    return pd.DataFrame(rows)


COLOURS = {"m0": "C0", "m1": "C1"}


def test_parameter_counts_within_ten_percent_give_no_figure():
    assert plot_vs_params("t", done([387_000, 387_250], [[0.9, 0.8]] * 2), COLOURS) is None
    figure = plot_vs_params("t", done([100_000, 400_000], [[0.9, 0.8]] * 2), COLOURS)
    (ax,) = figure.axes
    figure.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels and all("×" not in label and "$" not in label for label in labels)


def test_an_accuracys_axis_stays_within_0_and_1_and_a_loss_is_drawn_as_it_is():
    near_one = done([100_000, 400_000], [[0.99, 0.90, 1.0], [0.98, 1.0, 0.93]])  # bounds > 1
    for figure in (plot_vs_params("t", near_one, COLOURS),
                   plot_vs_train_size("t", near_one, COLOURS)):  # fmt: skip
        low, high = figure.axes[0].get_ylim()
        assert low >= 0.0 and high == 1.0
    loss = plot_vs_params("t", near_one, COLOURS, metric="test_loss")
    assert loss.axes[0].get_ylim()[1] > 1.05  # losses of 1.0 to 1.1: not cut at 1
