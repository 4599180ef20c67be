"""Issue 31, items 8 and 9: MLflow as a new user meets it. The parent run's commit is the user's
project's (never rayflow's own checkout), the experiment is a training experiment, and the hint
opens its runs view. A SQLite store on disk; no Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from rayflow.tracking.tracker import Tracker, git_commit

RAYFLOW_CHECKOUT = Path(__file__).resolve().parents[1]


def _repo(folder: Path) -> str:
    """A git repository with one commit in `folder`; its commit."""
    folder.mkdir(parents=True, exist_ok=True)
    git = [
        "git",
        "-C",
        str(folder),
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@example.com",
        "-c",
        "commit.gpgsign=false",
    ]
    subprocess.run([*git, "init", "-q"], check=True)
    (folder / "train_me.py").write_text("def trainable(config):\n    return {'loss': 1.0}\n")
    subprocess.run([*git, "add", "train_me.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def _rayflow_commit() -> str | None:
    out = subprocess.run(
        ["git", "-C", str(RAYFLOW_CHECKOUT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() if out.returncode == 0 else None


def test_commit_is_the_working_directory_project(tmp_path, monkeypatch):
    commit = _repo(tmp_path / "project")
    monkeypatch.chdir(tmp_path / "project")
    assert git_commit("rayflow.workloads.presets.cifar:train_cifar") == commit
    assert commit != _rayflow_commit()


def test_no_commit_outside_a_repository(tmp_path, monkeypatch):
    """Run from a folder that is no git checkout, with a built-in trainable: no commit at all
    (the old code tagged rayflow's own checkout's)."""
    (tmp_path / "plain").mkdir()
    monkeypatch.chdir(tmp_path / "plain")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # a repo above tmp is not ours
    assert git_commit("rayflow.workloads.presets.cifar:train_cifar") is None
    assert git_commit(None) is None


def test_commit_of_the_trainable_module(tmp_path, monkeypatch):
    """From a plain folder, a trainable whose module lies in a checkout gives that checkout's commit."""
    commit = _repo(tmp_path / "project")
    (tmp_path / "plain").mkdir()
    monkeypatch.chdir(tmp_path / "plain")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path / "project"))
    monkeypatch.delitem(sys.modules, "train_me", raising=False)
    assert git_commit("train_me:trainable") == commit
    assert git_commit("no_such_module_here:trainable") is None


def _cfg(tmp_path: Path):
    return OmegaConf.create(
        {
            "experiment_name": "first-hour",
            "tracking": {
                "enabled": True,
                "uri": f"sqlite:///{tmp_path / 'mlflow.db'}",
                "experiment": "rayflow-first-hour",
            },
        }
    )


def test_experiment_is_a_training_experiment_and_the_hint_opens_its_runs(tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = _cfg(tmp_path)
    tracker = Tracker(cfg)
    tracker.start(cfg, "", tags={"git_commit": "abc123", "workload": "tune"})
    client = MlflowClient(tracking_uri=str(cfg.tracking.uri))
    experiment = client.get_experiment_by_name("rayflow-first-hour")
    assert experiment.tags.get("mlflow.experimentKind") == "custom_model_development"
    tags = client.get_run(tracker.run_id).data.tags
    assert tags["git_commit"] == tags["mlflow.source.git.commit"] == "abc123"
    hint = tracker.ui_hint()
    assert hint.startswith(f"mlflow ui --backend-store-uri sqlite:///{tmp_path / 'mlflow.db'}")
    assert f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs" in hint
    tracker.end("FINISHED")


def test_no_commit_tag_when_there_is_none(tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = _cfg(tmp_path)
    tracker = Tracker(cfg)
    tracker.start(cfg, "", tags={"git_commit": None})
    tags = MlflowClient(tracking_uri=str(cfg.tracking.uri)).get_run(tracker.run_id).data.tags
    assert "git_commit" not in tags and "mlflow.source.git.commit" not in tags


def test_server_hint_opens_the_runs(tmp_path):
    tracker = Tracker(
        OmegaConf.create(
            {
                "tracking": {
                    "enabled": True,
                    "uri": "http://user:s3cret@mlflow.example:5000/",
                    "experiment": "x",
                }
            }
        )
    )
    tracker.experiment_id = "7"
    hint = tracker.ui_hint()
    assert "/#/experiments/7/runs" in hint and "s3cret" not in hint


# -- issue 31 item 7: the vm dry run names its provider, and its note says what the file holds --


def _dry(rayflow, home: Path, *overrides: str):
    """A vm dry run (starts nothing) with a token file of its own under `home`."""
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("not-a-real-token-0123456789\n")
    rayflow.env.update(HOME=str(home))
    rayflow.env.pop("RAY_AUTH_TOKEN", None)
    rayflow.env.pop("RAY_AUTH_TOKEN_PATH", None)
    out = rayflow.run("backend=vm", "dry_run=true", "tracking=none", *overrides, base=False)
    assert out.returncode == 0, out.stderr
    return out, [line for line in out.stderr.splitlines() if line.startswith("rayflow: dry run:")]


def test_default_vm_dry_run_says_it_is_no_ray_up_file(rayflow, tmp_path):
    import yaml

    out, notes = _dry(rayflow, tmp_path / "home")
    assert yaml.safe_load(out.stdout)["provider"]["type"] == "fake_multinode"
    note = notes[-1]
    assert (
        "provider: fake_multinode (started by rayflow on this machine; not a file for ray up"
        in note
    )
    assert (
        "ray start --head --autoscaling-config=cluster.yaml" in note
        and "ray up" not in note.split("not a file for ray up")[1]
    )


def test_aws_vm_dry_run_is_a_ray_up_file_and_its_note_matches_it(rayflow, tmp_path):
    import yaml

    out, notes = _dry(rayflow, tmp_path / "home", "backend.provider=aws")
    config = yaml.safe_load(out.stdout)
    assert config["provider"]["type"] == "aws"
    note = notes[-1]
    assert note.startswith(
        "rayflow: dry run: provider: aws (a file for ray up); to start it yourself: "
    )
    assert "ray up cluster.yaml" in note
    # The file mounts the token file by its real path, and the note says so (the old note claimed
    # the path was masked while the printout showed it); the token's value is in neither.
    assert config["file_mounts"]["~/.ray/auth_token"] == str(
        tmp_path / "home" / ".ray" / "auth_token"
    )
    assert "token file by its path" in note and "mask" not in note
    assert "not-a-real-token" not in out.stdout + out.stderr
