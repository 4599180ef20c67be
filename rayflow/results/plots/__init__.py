"""Plots of a finished (or interrupted) run, drawn on the driver after it, into
`<experiment>/plots/`.

Pure functions turn what rayflow.results.records reads from the experiment folder into matplotlib
Figures; make.make_plots draws the figures a workload picks by what it ran and writes them as
PNGs. Only matplotlib's object API with the Agg canvas is used, never pyplot and its global state.
Each PNG carries a summary of what it draws (lines, trials stopped early, the best trial, ASHA's
rungs) as JSON in its "rayflow" text chunk: `PIL.Image.open(png).text["rayflow"]`.

The modules, by purpose:

- canvas: a new figure on the Agg canvas, its title, how the run ended;
- style: how a trial looks in every plot (its colour, marker, legend name), and the best one;
- curves: the trials' curves over time (Tune's learning curves, RLlib's returns);
- search: each trial's final value against its hyperparameters;
- training: a single Ray Train run's epochs and reports;
- make: the figures of a Tune experiment, drawn and written as PNGs, and read back.

This package's own namespace holds nothing: import from the module that holds a name.
"""
