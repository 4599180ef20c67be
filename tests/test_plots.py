"""rayflow.results.plots on synthetic experiment folders written as Tune and EpochLog write them (no Ray)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rayflow.orchestrator.compose import compose_config
from rayflow.results.plots import make
from rayflow.results.plots.curves import asha_rungs
from rayflow.results.plots.make import make_plots, read_meta
from rayflow.results.records import EPOCHS_FILE, series, tune_trials
from rayflow.workloads import workload_for


def part(meta: dict, expected: dict) -> dict:
    """The keys of `meta` that `expected` names (a plot's summary holds more: its title, colours)."""
    return {k: meta.get(k) for k in expected}


def draw(cfg, root):
    """The plots a finished run of cfg's workload draws from its experiment folder `root`."""
    return make_plots(workload_for(cfg.workload).figures(cfg, root), root)


def write_trial(
    root: Path, trial_id: str, params: dict, rows: list[dict], done: bool = True
) -> Path:
    """A Tune trial folder: params.json, and result.json with one JSON line per report."""
    folder = root / f"train_cifar_{trial_id}_{'_'.join(f'{k}={v}' for k, v in params.items())}"
    folder.mkdir(parents=True)
    (folder / "params.json").write_text(json.dumps(params, indent=2))
    lines = [
        {**row, "trial_id": trial_id, "done": done and i == len(rows) - 1, "config": params}
        for i, row in enumerate(rows)
    ]
    (folder / "result.json").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def cifar_experiment(root: Path) -> Path:
    """4 trials, max_t=4: two run to the end, two stopped by ASHA (after 1 and 2 epochs)."""
    losses = {
        "a_00000": [2.0, 1.5, 1.2, 1.0],
        "a_00001": [2.1, 1.4, 0.9, 0.5],
        "a_00002": [2.3],
        "a_00003": [2.2, 1.9],
    }
    for i, (trial_id, values) in enumerate(losses.items()):
        params = {
            "l1": 2 ** (i + 2),
            "l2": 16,
            "lr": 10.0 ** -(i + 1),
            "batch_size": [32, 64][i % 2],
            "momentum": 0.9,
        }
        write_trial(
            root,
            trial_id,
            params,
            [
                {"epoch": e, "val_loss": v, "val_accuracy": 1 - v / 3}
                for e, v in enumerate(values, 1)
            ],
        )
    return root


def test_asha_rungs_follow_grace_period_and_reduction_factor():
    assert asha_rungs(1, 2, 4) == [1, 2, 4]
    assert asha_rungs(1, 2, 10) == [1, 2, 4, 8]
    assert asha_rungs(2, 3, 20) == [2, 6, 18]
    assert asha_rungs(1, 2, 3) == [1, 2]


def test_cifar_learning_curves_and_search_view(tmp_path):
    root = cifar_experiment(tmp_path / "cifar-1")
    cfg = compose_config(
        "workload.max_epochs=4",
        "workload.scheduler.grace_period=1",
        "workload.scheduler.reduction_factor=2",
    )
    files = draw(cfg, root)
    assert [f.name for f in files] == ["learning_curves.png", "search.png"]
    assert all(f.parent == root / "plots" for f in files)
    curves, search = (read_meta(f) for f in files)
    expected = {
        "lines": 4,
        "stopped_early": 2,
        "best": "a_00001",
        "rungs": [1, 2, 4],
        "metric": "val_loss",
        "points": {"a_00000": 4, "a_00001": 4, "a_00002": 1, "a_00003": 2},
        "x": "epoch",
    }
    assert part(curves, expected) == expected
    # momentum and l2 are the same for every trial: not searched hyperparameters, named as fixed
    expected = {
        "panels": ["batch_size", "l1", "lr"],
        "points": 4,
        "best": "a_00001",
        "metric": "val_loss",
        "fixed": {"l2": 16, "momentum": 0.9},
    }
    assert part(search, expected) == expected


def test_mode_max_picks_the_highest_last_value(tmp_path):
    root = cifar_experiment(tmp_path / "cifar-1")
    cfg = compose_config(
        "workload.max_epochs=4", "workload.metric=val_accuracy", "workload.mode=max"
    )
    curves = read_meta(draw(cfg, root)[0])
    assert curves["best"] == "a_00001" and curves["metric"] == "val_accuracy"


def test_a_resumed_trial_is_drawn_whole_and_a_rerun_epoch_once(tmp_path):
    """After a restore Tune appends to result.json: the epochs before and after are one curve;
    an epoch reported again (restored from an older checkpoint) is one point, its last report."""
    root = tmp_path / "cifar-1"
    rows = [
        {"epoch": 1, "val_loss": 2.0},
        {"epoch": 2, "val_loss": 1.8},  # first invocation
        {"epoch": 2, "val_loss": 1.7},
        {"epoch": 3, "val_loss": 1.5},
        {"epoch": 4, "val_loss": 1.2},
    ]  # resumed
    folder = write_trial(root, "r_00000", {"lr": 0.01}, rows)
    with open(folder / "result.json", "a") as f:
        f.write('{"epoch": 5, "val_lo')  # cut short by a kill: skipped
    [trial] = tune_trials(root)
    assert series(trial.rows, "epoch", "val_loss") == [(1, 2.0), (2, 1.7), (3, 1.5), (4, 1.2)]
    cfg = compose_config("workload.max_epochs=4")
    curves = read_meta(draw(cfg, root)[0])
    assert (
        curves["lines"] == 1 and curves["stopped_early"] == 0 and curves["points"] == {"r_00000": 4}
    )


def test_an_interrupted_trial_is_not_counted_as_stopped_by_asha(tmp_path):
    root = tmp_path / "cifar-1"
    write_trial(root, "i_00000", {"lr": 0.01}, [{"epoch": 1, "val_loss": 2.0}], done=False)
    write_trial(root, "i_00001", {"lr": 0.1}, [{"epoch": 1, "val_loss": 2.5}], done=True)
    (root / "i_00002").mkdir()  # a trial that never reported: no line
    (root / "i_00002" / "params.json").write_text('{"lr": 0.001}')
    curves = read_meta(draw(compose_config("workload.max_epochs=4"), root)[0])
    assert curves["lines"] == 2 and curves["stopped_early"] == 1


def test_ddp_sweep_uses_the_sweep_settings(tmp_path):
    root = tmp_path / "ddp-1"
    for i, lr in enumerate([0.003, 0.03, 0.3]):
        epochs = 2 if i else 1
        write_trial(
            root,
            f"d_0000{i}",
            {"lr": lr},
            [{"epoch": e, "val_accuracy": 0.2 * e + 0.1 * i} for e in range(1, epochs + 1)],
        )
    (root / "train-d_00000").mkdir()  # the trials' Ray Train runs live here too: not trials
    cfg = compose_config(
        "workload=ddp", "workload.tune=true", "workload.epochs=2", "workload.sweep.grace_period=1"
    )
    curves, search = (read_meta(f) for f in draw(cfg, root))
    expected = {
        "lines": 3,
        "stopped_early": 1,
        "best": "d_00002",
        "rungs": [1, 2],
        "metric": "val_accuracy",
        "points": {"d_00000": 1, "d_00001": 2, "d_00002": 2},
        "x": "epoch",
    }
    assert part(curves, expected) == expected
    assert search["panels"] == ["lr"] and search["points"] == 3


def test_ddp_training_plot_reads_the_epoch_log(tmp_path):
    root = tmp_path / "ddp-1"
    root.mkdir()
    rows = [
        {
            "epoch": e,
            "train_loss": 2 / e,
            "val_loss": 2.1 / e,
            "val_accuracy": 0.3 * e,
            "samples_per_s": 900 + e,
            "device": "cpu",
        }
        for e in (1, 2, 2, 3)
    ]  # epoch 2 again: the worker group restarted
    (root / EPOCHS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    [png] = draw(compose_config("workload=ddp"), root)
    assert png.name == "training.png"
    meta = read_meta(png)
    ticks = meta.pop("ticks")
    assert meta == {
        "lines": 4,
        "panels": {"loss": 2, "accuracy": 1, "throughput": 1},
        "epochs": [1, 2, 3],
    }
    assert ticks and all(t == int(t) for t in ticks)


def test_a_two_epoch_training_plot_has_whole_epoch_ticks(tmp_path):
    """matplotlib's default ticks for x in [1, 2] are 1.0, 1.2, ..., 2.0: no such epoch."""
    root = tmp_path / "ddp-2"
    root.mkdir()
    rows = [{"epoch": e, "train_loss": 1 / e, "val_accuracy": 0.4 * e} for e in (1, 2)]
    (root / EPOCHS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    [png] = draw(compose_config("workload=ddp"), root)
    ticks = read_meta(png)["ticks"]
    assert ticks and all(t == int(t) for t in ticks), ticks


def test_ppo_one_line_per_lr_and_the_stop_goal(tmp_path):
    root = tmp_path / "ppo-1"
    for i, lr in enumerate([1e-3, 1e-4]):
        rows = [
            {
                "training_iteration": it,
                "num_env_steps_sampled_lifetime": 1000 * it,
                "env_runners": {"episode_return_mean": 20.0 * it + i},
            }
            for it in (1, 2, 3)
        ]
        write_trial(
            root,
            f"p_0000{i}",
            {"lr": lr, "gamma": 0.99, "model_config": {"fcnet_hiddens": [32]}},
            rows,
        )
    cfg = compose_config("workload=ppo", "workload.stop.episode_return_mean=450")
    [png] = draw(cfg, root)
    assert png.name == "returns.png"
    expected = {"lines": 2, "lrs": [1e-4, 1e-3], "points": [3, 3], "goal": 450.0}
    assert part(read_meta(png), expected) == expected
    cfg = compose_config("workload=ppo", "workload.stop.episode_return_mean=null")
    assert read_meta(draw(cfg, root)[0])["goal"] is None


def test_a_failing_plot_warns_once_and_the_others_are_still_made(tmp_path, monkeypatch, capsys):
    root = cifar_experiment(tmp_path / "cifar-1")

    def broken(*args, **kwargs):
        raise ValueError("no luck")

    monkeypatch.setattr(make, "learning_curves", broken)
    files = draw(compose_config("workload.max_epochs=4"), root)
    assert [f.name for f in files] == ["search.png"]
    assert not (root / "plots" / "learning_curves.png").exists()
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == "rayflow: warning: plots: learning_curves.png: ValueError: no luck"


def test_the_session_hook_never_fails_the_run(tmp_path, monkeypatch, capsys):
    from rayflow.orchestrator import report as session
    from rayflow.results.experiment import Experiment

    class Tracker:
        run_id = "r1"
        logged = []

        def log_artifacts(self, folder, artifact_path):
            raise OSError("the store is gone")

    root = cifar_experiment(tmp_path / "cifar-1")
    # no exception
    session.plots(
        compose_config("workload.max_epochs=4"),
        Tracker(),
        Experiment(str(root)),
        workload_for("cifar"),
    )
    out, err = capsys.readouterr()
    assert err.strip() == "rayflow: warning: plots: OSError: the store is gone"
    assert "plots:" not in out


def test_the_session_hook_prints_where_the_plots_are(tmp_path, capsys):
    from rayflow.orchestrator import report as session
    from rayflow.results.experiment import Experiment

    class Tracker:
        run_id = "r1"
        logged = []

        def log_artifacts(self, folder, artifact_path):
            self.logged.append((folder, artifact_path))

    root = cifar_experiment(tmp_path / "cifar-1")
    tracker = Tracker()
    session.plots(
        compose_config("workload.max_epochs=4"),
        tracker,
        Experiment(str(root)),
        workload_for("cifar"),
    )
    assert tracker.logged == [(str(root / "plots"), "plots")]
    out = capsys.readouterr().out
    assert (
        f"plots: {root / 'plots'}/ (learning_curves.png, search.png); MLflow: plots/ of the parent run r1"
        in out
    )


def test_no_pyplot_and_no_backend_switch(tmp_path):
    """The object API on an Agg canvas: pyplot (and its global figure state) is never imported."""
    root = cifar_experiment(tmp_path / "cifar-1")
    code = (
        "import sys, matplotlib; from rayflow.orchestrator.compose import compose_config; from rayflow.results.plots.make import make_plots; "
        "from rayflow.workloads import workload_for; "
        f"cfg = compose_config('workload.max_epochs=4'); assert len(make_plots(workload_for(cfg.workload).figures(cfg, {str(root)!r}), {str(root)!r})) == 2; "
        "print('matplotlib.pyplot' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1]
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", ["cifar", "ppo", "ddp"])
def test_an_empty_experiment_folder_draws_no_blank_plots(tmp_path, name):
    root = tmp_path / f"{name}-1"
    root.mkdir()
    assert draw(compose_config(f"workload={name}"), root) == []
    assert not (root / "plots").exists()
