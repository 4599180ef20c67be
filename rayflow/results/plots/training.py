"""The plots of a single Ray Train run: its epochs and its reports.

training draws rayflow's ddp preset's epochs (train and val loss, val accuracy, samples/s);
reports draws any Train run's reports, each number it reports against the epoch (or the report's
index). Apart from the Tune plots: one run, no trials to tell apart, no best to mark.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rayflow.results.plots.canvas import Drawn, new_figure
from rayflow.results.records import series

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def training(rows: list[dict[str, Any]]) -> Drawn:
    """A Ray Train run per epoch: train and val loss, val accuracy, samples/s."""
    figure, (loss, accuracy, speed) = new_figure(1, 3, width=13, height=4)
    lines = {"loss": 0, "accuracy": 0, "throughput": 0}
    for ax, panel, keys in (
        (loss, "loss", ("train_loss", "val_loss")),
        (accuracy, "accuracy", ("val_accuracy",)),
        (speed, "throughput", ("samples_per_s",)),
    ):
        for key in keys:
            points = series(rows, "epoch", key)
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=key)
                lines[panel] += 1
        ax.set(
            xlabel="epoch",
            ylabel=panel if panel != "throughput" else "samples/s",
            title=", ".join(keys),
        )
        _whole_ticks(ax)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    epochs = [int(x) for x, _ in series(rows, "epoch", "epoch")]
    ticks = sorted({float(t) for ax in (loss, accuracy, speed) for t in ax.get_xticks()})
    return figure, {"lines": sum(lines.values()), "panels": lines, "epochs": epochs, "ticks": ticks}


def _whole_ticks(ax: Axes) -> None:
    """Epochs and reports are counted: no tick between two (a 2-epoch run had 1.25, 1.5, ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def reports(rows: list[dict[str, Any]], panels: int = 6) -> Drawn:
    """A Ray Train run's reports: each number it reports (up to `panels`) against the epoch, or
    the report's index where it reports none."""
    x = "epoch" if rows and all("epoch" in r for r in rows) else "report"
    rows = [r if x == "epoch" else {**r, "report": i} for i, r in enumerate(rows, 1)]
    keys = sorted(
        {
            k
            for r in rows
            for k, v in r.items()
            if k not in ("epoch", "report") and series([r], x, k)
        }
    )[:panels]
    cols = min(max(len(keys), 1), 3)
    figure, axes = new_figure(
        math.ceil(max(len(keys), 1) / cols),
        cols,
        width=4.3 * cols,
        height=3.6 * math.ceil(max(len(keys), 1) / cols),
    )
    # fewer keys than the grid has panels: the rest are hidden
    for ax, key in zip(axes, keys, strict=False):
        ax.plot(*zip(*series(rows, x, key), strict=True), marker="o", markersize=3)
        ax.set(xlabel=x, ylabel=key, title=key)
        _whole_ticks(ax)
        ax.grid(alpha=0.3)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    return figure, {"panels": keys, "x": x, "points": len(rows)}
