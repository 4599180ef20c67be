"""Resume hints that work where they are printed: resume=true says which experiment it picked and
where, picks only experiments run from this folder (naming those of other folders it passed
over); a failure in rayflow.run suggests what continues it in the notebook."""

from __future__ import annotations

import json
import time

import pytest

from rayflow.errors import ConfigError
from rayflow.orchestrator.compose import compose_config
from rayflow.results.experiment import STATE_FILE, experiment_dir
from rayflow.results.signing import sign_folder


def _cfg(tmp_path, *overrides: str):
    return compose_config(f"storage_path={tmp_path / 'results'}", "tracking=none", *overrides)


def _experiment(tmp_path, name: str, project: str | None):
    """An experiment as a run leaves it: its state (with the folder it ran from), signed."""
    path = tmp_path / "results" / name
    path.mkdir(parents=True)
    state = {"config": {"workload": {"name": "cifar"}}}
    if project is not None:
        state["project"] = project
    (path / STATE_FILE).write_text(json.dumps(state))
    sign_folder(str(path), "cifar")
    time.sleep(0.01)  # signed one after the other: the later is the latest
    return path


def test_resume_true_picks_this_folders_latest_and_names_the_others(tmp_path, monkeypatch, capsys):
    here, there = tmp_path / "project-a", tmp_path / "project-b"
    here.mkdir(), there.mkdir()
    monkeypatch.chdir(here)
    ours = _experiment(tmp_path, "cifar-ours", str(here))
    _experiment(tmp_path, "cifar-theirs", str(there))  # the latest, of another folder
    assert experiment_dir(_cfg(tmp_path, "resume=true")) == ours
    said = capsys.readouterr().out
    assert (
        f"[rayflow] resume: continuing cifar-ours ({ours}), the latest cifar experiment of this folder under {tmp_path / 'results'}"
        in said
    )
    assert f"passed over 1 of other folders: cifar-theirs ({there})" in said


def test_resume_true_with_only_other_folders_experiments_is_refused_naming_them(
    tmp_path, monkeypatch
):
    here, there = tmp_path / "project-a", tmp_path / "project-b"
    here.mkdir(), there.mkdir()
    monkeypatch.chdir(here)
    for n in range(5):
        _experiment(tmp_path, f"cifar-theirs-{n}", str(there))
    with pytest.raises(ConfigError) as caught:
        experiment_dir(_cfg(tmp_path, "resume=true"))
    said = str(caught.value)
    assert caught.value.key == "resume" and f"no cifar experiment of this folder ({here})" in said
    assert "passed over 5 of other folders: cifar-theirs-4" in said and "and 2 more" in said


def test_an_experiment_from_before_projects_were_recorded_counts_as_this_folders(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    old = _experiment(tmp_path, "cifar-old", None)
    assert experiment_dir(_cfg(tmp_path, "resume=true")) == old
    assert "continuing cifar-old" in capsys.readouterr().out


def test_a_notebooks_failure_suggests_resuming_in_the_notebook(tmp_path, monkeypatch):
    """The hint of rayflow.run's failure: result.resume() and rayflow.resume(PATH), not the CLI
    (which cannot import a trainable defined in the notebook's __main__)."""
    from rayflow import api
    from rayflow.results.run_result import RunResult

    result = RunResult(
        "tune", None, tmp_path / "x", (), {}, None, None, experiment=str(tmp_path / "x")
    )
    cli = f"1 trial(s) errored: KeyError: 'lr'; ... Continue with: python -m rayflow resume={tmp_path / 'x'}"
    said = api.notebook_hint(cli, result, in_main=True)
    assert "err.result.resume()" in said and f"rayflow.resume('{tmp_path / 'x'}'" in said
    assert "python -m rayflow" not in said and said.startswith("1 trial(s) errored: KeyError: 'lr'")
    # a trainable importable by its module path: the shell's way is given too
    both = api.notebook_hint(cli, result, in_main=False)
    assert "err.result.resume()" in both and "python -m rayflow resume=" in both


def test_names_read_from_a_shared_store_are_shown_as_printable_text(tmp_path, monkeypatch):
    """A state's `project` is read before the experiment is verified: terminal controls in it
    reach the line escaped, not acted on."""
    here = tmp_path / "project-a"
    here.mkdir()
    monkeypatch.chdir(here)
    _experiment(tmp_path, "cifar-theirs", "/x\x1b[2J\x1b]0;owned\x07")
    with pytest.raises(ConfigError) as caught:
        experiment_dir(_cfg(tmp_path, "resume=true"))
    said = str(caught.value)
    assert "\x1b" not in said and "\x07" not in said and "/x\\x1b[2J" in said
