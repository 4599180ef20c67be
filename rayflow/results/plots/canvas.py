"""The figure every plot starts from, and its title.

A new Figure on the Agg canvas (matplotlib's object API, never pyplot and its global state), a
title wrapped to the figure's width with its notes, and how the run ended (interrupted, trials
errored) for that title. Kept apart from what each plot draws so that every plot shares it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rayflow.results.records import FINISHED, Trial

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# A plot: its figure, and the summary of what it draws that its PNG carries
Drawn = tuple["Figure", dict[str, Any]]
# (file name, a function drawing the plot): what a workload's `figures` returns
Figures = list[tuple[str, Callable[[], Drawn]]]


def new_figure(
    rows: int = 1, cols: int = 1, width: float = 7.0, height: float = 4.5
) -> tuple[Figure, list[Axes]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, list(figure.subplots(rows, cols, squeeze=False).ravel())


def run_state(trials: list[Trial]) -> str:
    """How the run ended, for a title: "" when every trial finished (or Tune left no state), else
    what was left: trials an interrupt left unfinished, trials that errored."""
    known = [t for t in trials if t.status is not None]
    unfinished = sum(1 for t in known if t.status != FINISHED and not t.errored)
    errored = sum(1 for t in known if t.errored)
    parts = []
    if unfinished:
        parts.append(f"INTERRUPTED: {unfinished} of {len(trials)} trials unfinished")
    if errored:
        parts.append(f"{errored} of {len(trials)} trials ERRORED")
    return "; ".join(parts)


def fit_title(figure: Figure, text: str, fontsize: float = 12) -> str:
    """`text` wrapped to the figure's width (a suptitle is never clipped at its edges)."""
    # an average glyph: ~0.62 em
    chars = max(20, int(figure.get_figwidth() * 72 / (fontsize * 0.62)))
    return "\n".join(textwrap.wrap(text, chars, break_on_hyphens=False))


def title(figure: Figure, ax: Axes | None, head: str, notes: list[str]) -> str:
    """The plot's title: `head`, then its notes (the fixed keys, how the run ended), each wrapped to
    fit; on the figure when it has several panels, else on the axes."""
    text = "\n".join(
        fit_title(figure, line, 12 if i == 0 else 10)
        for i, line in enumerate([head, *filter(None, notes)])
    )
    if ax is None:
        figure.suptitle(text, fontsize=12)
    else:
        ax.set_title(text, fontsize=11)
    return text
