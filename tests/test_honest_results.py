"""Issue 31, items 3, 4 and 6: results and plots tell the truth (synthetic experiment folders as
Tune 2.60 writes them; no Ray is started).

- a trial that finished is `done` in RunResult.trials, though Tune logs its last report done=false
  when the trainable returns (only its experiment state says TERMINATED);
- a run with no successful trial says so in one line, with no empty headings, no blank plots,
  and a waiting line that does not claim "done";
- the plots' titles fit, name the fixed keys and an interrupted or errored run, and overlapping
  trials stay apart (a colour and marker each, curves that share points set side by side).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.colors import to_hex
from omegaconf import OmegaConf

from rayflow.orchestrator.compose import compose_config
from rayflow.results.plots.curves import learning_curves
from rayflow.results.plots.make import make_plots, read_meta, tune_figures
from rayflow.results.plots.search import search_view
from rayflow.results.records import tune_trials
from rayflow.results.run_result import RunResult
from rayflow.workloads.tune_summary import TuneSummary
from tests.test_plots import write_trial


def write_state(root: Path, statuses: dict[str, str], stamp: str = "2026-11-25_07-00-00") -> None:
    """Tune's experiment state: trial_data holds [the trial's JSON, its runtime metadata's JSON]."""
    data = {
        "trial_data": [
            [
                json.dumps({"trial_id": t, "status": s, "config": {}}),
                json.dumps({"last_result": {}}),
            ]
            for t, s in statuses.items()
        ],
        "runner_data": {},
        "stats": {},
    }
    (root / f"experiment_state-{stamp}.json").write_text(json.dumps(data))


def returned_trials(root: Path, n: int = 3, momentum: float = 0.9) -> dict[str, str]:
    """n trials whose trainable returned after 3 reports: Tune logged none of them done=true."""
    ids = {}
    for i in range(n):
        trial_id = f"f_0000{i}"
        write_trial(
            root,
            trial_id,
            {"lr": 0.01 * (i + 1), "momentum": momentum},
            [{"training_iteration": it, "loss": (i + 1) / it} for it in (1, 2, 3)],
            done=False,
        )
        ids[trial_id] = "TERMINATED"
    return ids


def tune_result(root: Path) -> RunResult:
    cfg = compose_config(
        "workload=tune",
        "workload.trainable=train:objective",
        "workload.metric=loss",
        "workload.mode=min",
    )
    return RunResult("tune", None, root, config=OmegaConf.to_container(cfg, resolve=False))


# --- item 3: done -----------------------------------------------------------------------------


def test_trials_that_returned_are_done_in_run_result_trials(tmp_path):
    root = tmp_path / "tune-1"
    write_state(root, returned_trials(root))
    trials = tune_result(root).trials
    assert list(trials["done"]) == [True, True, True]
    assert list(trials["iterations"]) == [3, 3, 3]


def test_errored_and_interrupted_trials_are_not_done(tmp_path):
    root = tmp_path / "tune-1"
    statuses = returned_trials(root)
    statuses |= {"f_00001": "ERROR", "f_00002": "RUNNING"}
    # an older invocation's state
    write_state(root, {"f_00000": "PENDING"}, stamp="2026-11-25_06-00-00")
    write_state(root, statuses)
    assert [t.done for t in tune_trials(root)] == [True, False, False]
    assert list(tune_result(root).trials["done"]) == [True, False, False]


def test_a_trial_that_never_reported_has_its_id_and_status(tmp_path):
    root = tmp_path / "tune-1"
    folder = root / "broken_ab12c_00000_0_lr=0.01_2026-11-25_07-00-00"
    folder.mkdir(parents=True)
    (folder / "params.json").write_text('{"lr": 0.01}')
    write_state(root, {"ab12c_00000": "ERROR"})
    [trial] = tune_trials(root)
    assert (trial.trial_id, trial.done, trial.errored) == ("ab12c_00000", False, True)


def test_without_tunes_state_the_last_reports_done_flag_decides(tmp_path):
    root = tmp_path / "tune-1"
    write_trial(root, "o_00000", {"lr": 0.1}, [{"training_iteration": 1, "loss": 1.0}], done=True)
    write_trial(root, "o_00001", {"lr": 0.2}, [{"training_iteration": 1, "loss": 1.0}], done=False)
    assert [t.done for t in tune_trials(root)] == [True, False]


# --- item 4: a run whose only trial raised ---------------------------------------------------------


def errored_summary(**kwargs) -> TuneSummary:
    values = dict(
        best_config={},
        best_metrics={},
        best_checkpoint=None,
        trials=1,
        errored=1,
        interrupted=False,
        stopped_early=0,
        trial_epochs=0,
        budget_epochs=0,
        devices=[],
        error="ValueError: boom: the trainable failed on purpose",
        metric="loss",
    )
    return TuneSummary(**{**values, **kwargs})


def test_a_run_with_no_successful_trial_says_so_in_one_line():
    table = errored_summary().table()
    assert table.strip().splitlines() == [
        "== rayflow results ==",
        "no trial succeeded: 1 of 1 errored; the first error: ValueError: boom: the trainable failed on purpose",
    ]
    assert "best config" not in table


def test_an_interrupt_before_any_result_is_not_called_an_error():
    table = errored_summary(errored=0, error=None, interrupted=True, trials=2).table()
    assert (
        table.strip().splitlines()[-1]
        == "no trial reported loss before the interrupt (2 trials; resume continues them)"
    )


def test_a_search_without_a_search_space_shows_no_empty_heading():
    table = errored_summary(errored=0, error=None, best_metrics={"loss": 0.5}).table()
    assert "best config" not in table and "best loss          0.5000" in table


def test_rllib_with_no_successful_trial_says_so_in_one_line():
    from rayflow.workloads.rllib_results import RLlibSummary

    summary = RLlibSummary(
        best_config={},
        best_return=None,
        steps_at_best=None,
        best_checkpoint=None,
        trials=2,
        errored=2,
        interrupted=False,
        devices=[],
        goal=450.0,
        error="RuntimeError: env crashed",
        algorithm="PPO",
    )
    assert summary.table().strip().splitlines() == [
        "== rayflow results (RLlib PPO) ==",
        "no trial succeeded: 2 of 2 errored; the first error: RuntimeError: env crashed",
    ]


def only_trial_errored(root: Path) -> Path:
    folder = root / "broken_ab12c_00000_0_lr=0.01_2026-11-25_07-00-00"
    folder.mkdir(parents=True)
    (folder / "params.json").write_text('{"lr": 0.01}')
    write_state(root, {"ab12c_00000": "ERROR"})
    return root


def test_no_blank_plots_are_written_or_announced(tmp_path, capsys):
    from rayflow.orchestrator import report as session
    from rayflow.results.experiment import Experiment
    from rayflow.workloads import workload_for

    class Tracker:
        run_id = "r1"
        logged = []

        def log_artifacts(self, folder, artifact_path):
            self.logged.append(folder)

    root = only_trial_errored(tmp_path / "tune-1")
    cfg = compose_config(
        "workload=tune",
        "workload.trainable=train:objective",
        "workload.metric=loss",
        "workload.mode=min",
    )
    tracker = Tracker()
    session.plots(cfg, tracker, Experiment(str(root)), workload_for(cfg.workload))
    out, err = capsys.readouterr()
    assert "plots" not in out and err == ""
    assert not (root / "plots").exists() and tracker.logged == []


def test_the_waiting_line_does_not_say_done_when_the_trial_errored(capsys):
    from types import SimpleNamespace

    from rayflow.workloads.tune_fit import first_result_wait

    wait = first_result_wait()
    wait.setup()
    wait.on_trial_error(iteration=1, trials=[], trial=SimpleNamespace(trial_id="ab12c_00000"))
    wait.on_experiment_end(trials=[])
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("[rayflow] tune: no first result: trial ab12c_00000 errored in ")
    assert "done" not in line


def test_the_waiting_line_says_done_at_the_first_result(capsys):
    from types import SimpleNamespace

    from rayflow.workloads.tune_fit import first_result_wait

    wait = first_result_wait()
    wait.setup()
    wait.on_trial_result(iteration=1, trials=[], trial=SimpleNamespace(trial_id="x"), result={})
    wait.on_experiment_end(trials=[])
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "waiting for the first trial's first result" in line and "... done in " in line


# --- item 6: plots ------------------------------------------------------------------------------------


def inside_figure(figure, artist) -> bool:
    renderer = figure.canvas.get_renderer()
    figure.canvas.draw()
    box, frame = artist.get_window_extent(renderer), figure.bbox
    return box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1


def test_the_search_plots_title_fits_and_names_the_fixed_key(tmp_path):
    root = tmp_path / "tune-1"
    write_state(root, returned_trials(root))
    figure, meta = search_view(tune_trials(root), "loss", "min")
    assert meta["panels"] == ["lr"]  # one searched key: one narrow panel, the title longer than it
    title = figure.get_suptitle()
    assert "final loss of each trial against its hyperparameters" in " ".join(title.split())
    assert "fixed: momentum=0.9" in title and meta["fixed"] == {"momentum": 0.9}
    assert inside_figure(figure, figure._suptitle)


def test_the_title_fits_a_long_metric_name_too(tmp_path):
    root = tmp_path / "tune-1"
    write_state(root, returned_trials(root))
    long = "validation_top5_accuracy_on_the_held_out_split"
    for trial in root.iterdir():
        if trial.is_dir():
            rows = [
                {**r, long: r["loss"]}
                for r in map(json.loads, (trial / "result.json").read_text().splitlines())
            ]
            (trial / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trials = tune_trials(root)
    figure, _ = search_view(trials, long, "max")
    assert inside_figure(figure, figure._suptitle)
    figure, _ = learning_curves(trials, long, "max", None, [], "training_iteration", None)
    assert inside_figure(figure, figure.axes[0].title)


def test_an_interrupted_run_is_marked_in_every_title(tmp_path):
    root = tmp_path / "tune-1"
    write_state(root, {**returned_trials(root), "f_00002": "RUNNING"})
    files = make_plots(
        tune_figures(root, "loss", "min", "training_iteration", None, [], None), root
    )
    assert [f.name for f in files] == ["learning_curves.png", "search.png"]
    for png in files:
        meta = read_meta(png)  # the title as drawn, read back from the PNG
        assert "INTERRUPTED: 1 of 3 trials unfinished" in meta["title"]


def test_an_errored_trial_is_marked_and_a_finished_run_is_not(tmp_path):
    root = tmp_path / "tune-1"
    statuses = returned_trials(root)
    write_state(root, statuses)
    figure, meta = learning_curves(
        tune_trials(root), "loss", "min", None, [], "training_iteration", None
    )
    assert meta["state"] == "" and "INTERRUPTED" not in figure.axes[0].get_title()
    write_state(root, {**statuses, "f_00001": "ERROR"}, stamp="2026-11-25_08-00-00")
    figure, meta = learning_curves(
        tune_trials(root), "loss", "min", None, [], "training_iteration", None
    )
    assert "1 of 3 trials ERRORED" in figure.axes[0].get_title()


def trial_lines(figure) -> list:
    """The lines that draw trials (marked points), not the best trial's band, rungs or stop marks."""
    return [
        line
        for line in figure.axes[0].get_lines()
        if line.get_marker() not in ("None", "", None, "x") and len(line.get_xdata()) > 1
    ]


def test_trials_that_overlap_stay_apart(tmp_path):
    """Three trials that report the same losses: each its own colour and marker, set side by side."""
    root = tmp_path / "tune-1"
    for i in range(3):
        write_trial(
            root,
            f"s_0000{i}",
            {"lr": 0.1 * (i + 1)},
            [{"training_iteration": it, "loss": 1 / it} for it in (1, 2, 3)],
        )
    figure, meta = learning_curves(
        tune_trials(root), "loss", "min", None, [], "training_iteration", None
    )
    lines = trial_lines(figure)
    assert len(lines) == 3
    assert len({to_hex(line.get_color()) for line in lines}) == 3
    assert len({line.get_marker() for line in lines}) == 3
    assert len({tuple(line.get_xdata()) for line in lines}) == 3  # not drawn one on top of another
    assert meta["dodged"] == ["s_00000", "s_00001", "s_00002"]
    assert len({tuple(c) for c in meta["colors"].values()}) == 3


def test_trials_that_do_not_overlap_are_not_moved(tmp_path):
    root = tmp_path / "tune-1"
    returned_trials(root)
    figure, meta = learning_curves(
        tune_trials(root), "loss", "min", None, [], "training_iteration", None
    )
    assert meta["dodged"] == []
    assert sorted(tuple(line.get_xdata()) for line in trial_lines(figure)) == [(1, 2, 3)] * 3


def test_trials_sharing_a_category_are_spread_apart_in_the_search_plot(tmp_path):
    root = tmp_path / "tune-1"
    for i in range(4):
        write_trial(
            root,
            f"c_0000{i}",
            {"width": [64, 128][i % 2], "lr": 0.01 * (i + 1)},
            [{"training_iteration": 1, "loss": 1.0}],
        )
    figure, meta = search_view(tune_trials(root), "loss", "min")
    width = figure.axes[meta["panels"].index("width")]
    spots = {
        tuple(c.get_offsets()[0]) for c in width.collections
    }  # each trial's point, and the best's star on its own
    assert len(spots) == 4  # four trials in two categories: no two on one spot
    assert len({tuple(c) for c in meta["colors"].values()}) == 4


@pytest.mark.parametrize("n", [3, 12])
def test_every_trial_has_its_own_style(tmp_path, n):
    from rayflow.results.plots.style import styles
    from rayflow.results.records import Trial

    assert len(set(styles([Trial(f"t_{i:05d}", {}) for i in range(n)]).values())) == n
