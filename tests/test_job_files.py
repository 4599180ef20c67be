"""The user's files that go with a submitted run (rayflow.orchestrator.job_files): what is shipped, what is
left out, and the size check before anything starts (rayflow.orchestrator.upload_check and
upload_size). Fast: no cluster; what Ray would upload is checked against the zip Ray's own
packaging code builds."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rayflow.errors import ConfigError
from rayflow.orchestrator import job_files as jf
from rayflow.orchestrator import upload_check, upload_size


def workload(**keys):
    """A config whose workload section has only the shipping keys (the rest is not read)."""
    return OmegaConf.create(
        {
            "workload": {
                "working_dir": None,
                "excludes": None,
                "py_modules": None,
                "pip": None,
                **keys,
            }
        }
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project: code, a .git folder, a virtual environment, MLflow's store, Hydra's
    outputs, byte code, one big data file, and a .gitignore."""
    root = tmp_path / "proj"
    files = {
        "train.py": "def objective(config):\n    return {'loss': 0.0}\n",
        "lib/__init__.py": "",
        "lib/model.py": "WIDTH = 8\n",
        "lib/__pycache__/model.cpython-311.pyc": "x" * 100,
        "conf.yaml": "lr: 0.1\n",
        ".git/HEAD": "ref: refs/heads/main\n",
        ".git/objects/pack/p.pack": "g" * 50_000,
        ".venv/lib/python3.11/site-packages/torch/__init__.py": "t" * 50_000,
        "mlruns/0/meta.yaml": "m" * 1000,
        "mlflow.db": "s" * 1000,
        "outputs/2026-01-01/run.log": "o" * 1000,
        "notes.secret": "ignored by .gitignore",
        ".gitignore": "*.secret\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(os.urandom(300_000))
    return root


def ray_zip(
    path: Path, patterns: list[str], tmp_path: Path, include_parent_dir: bool = False
) -> Path:
    """The zip Ray's Jobs client builds (ray._private.runtime_env.packaging._zip_files, .gitignore honoured)."""
    from ray._private.runtime_env.packaging import _zip_files

    out = tmp_path / f"pkg-{len(list(tmp_path.glob('pkg-*')))}.zip"
    _zip_files(
        str(path),
        list(patterns),
        str(out),
        include_gitignore=True,
        include_parent_dir=include_parent_dir,
    )
    return out


def working_dir_patterns(cfg) -> list[str]:
    """What the Jobs client excludes from a working_dir: Ray's defaults, then the runtime_env's."""
    from ray._private.ray_constants import get_runtime_env_default_excludes

    return get_runtime_env_default_excludes() + jf.job_files(cfg)["excludes"]


def test_job_files_gives_the_runtime_env_parts(project):
    import omegaconf

    cfg = workload(
        working_dir=str(project),
        excludes=["*.ckpt"],
        py_modules=["omegaconf"],
        pip=["einops==0.8.0"],
    )
    env = jf.job_files(cfg)
    assert env["working_dir"] == str(project) and Path(env["working_dir"]).is_absolute()
    assert env["excludes"] == [*jf.DEFAULT_EXCLUDES, *jf.CREDENTIAL_EXCLUDES, "*.ckpt"]
    assert env["py_modules"] == [str(Path(omegaconf.__file__).parent.resolve())]
    assert env["pip"] == ["einops==0.8.0"]


def test_nothing_to_ship_gives_no_keys(tmp_path, monkeypatch):
    assert jf.job_files(workload()) == {}
    # a config without the keys
    assert jf.job_files(OmegaConf.create({"workload": {"name": "cifar"}})) == {}
    # nothing to check
    upload_check.check_upload(OmegaConf.create({"workload": {"name": "cifar"}}), limit=1)
    monkeypatch.chdir(tmp_path)
    # `.`: where rayflow runs
    assert jf.job_files(workload(working_dir="."))["working_dir"] == str(tmp_path)


def test_what_is_shipped_is_what_ray_zips(project, tmp_path):
    """The excludes keep .git, the venv, MLflow's store, Hydra's outputs, byte code and what
    .gitignore names out; the list and the size match the zip Ray builds byte for byte."""
    cfg = workload(working_dir=str(project))
    patterns = working_dir_patterns(cfg)
    archive = ray_zip(project, patterns, tmp_path)
    names = sorted(zipfile.ZipFile(archive).namelist())
    assert names == [
        ".gitignore",
        "conf.yaml",
        "data/big.bin",
        "lib/__init__.py",
        "lib/model.py",
        "train.py",
    ]
    assert sorted(upload_size.shipped(project, patterns)) == names
    _, size, stopped = upload_size.upload_entries(project, patterns)
    assert (size, stopped) == (archive.stat().st_size, False)


def test_a_py_module_is_counted_as_ray_zips_it(tmp_path):
    import omegaconf

    folder = Path(omegaconf.__file__).parent
    patterns = list(jf.DEFAULT_EXCLUDES)
    archive = ray_zip(folder, patterns, tmp_path, include_parent_dir=True)
    names = zipfile.ZipFile(archive).namelist()
    assert (
        names
        and all(n.startswith("omegaconf/") for n in names)
        and not any("__pycache__" in n for n in names)
    )
    assert (
        upload_size.upload_entries(folder, patterns, include_parent_dir=True)[1]
        == archive.stat().st_size
    )


def test_over_the_limit_is_one_line_naming_the_biggest_entry(project):
    cfg = workload(working_dir=str(project))
    with pytest.raises(ConfigError) as err:
        upload_check.check_upload(cfg, limit=200_000)
    message = str(err.value)
    assert "\n" not in message and err.value.key == "workload.working_dir"
    assert message.startswith(
        f"workload.working_dir: {project} is 294 KiB after excludes, over Ray's 195 KiB limit"
    )
    assert "biggest: data/big.bin 293 KiB" in message and "workload.excludes" in message
    assert "train.py" not in message  # small files are not named
    # excluded: it fits
    upload_check.check_upload(workload(working_dir=str(project), excludes=["/data"]), limit=200_000)


def test_counting_stops_far_over_the_limit(project):
    with pytest.raises(
        ConfigError, match=r"is more than .* after excludes.*biggest: data/big\.bin"
    ):
        upload_check.check_upload(workload(working_dir=str(project)), limit=10_000)


def test_gitignore_is_honoured_unless_ray_is_told_not_to(project, monkeypatch):
    cfg = workload(working_dir=str(project))
    assert "notes.secret" not in upload_size.shipped(project, working_dir_patterns(cfg))
    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")
    assert "notes.secret" in upload_size.shipped(project, working_dir_patterns(cfg))


def test_excludes_may_re_include_a_default(project):
    (project / "wandb").mkdir()
    (project / "wandb" / "keep.txt").write_text("k")
    cfg = workload(working_dir=str(project), excludes=["!wandb", "!wandb/**"])
    assert "wandb/keep.txt" in upload_size.shipped(project, working_dir_patterns(cfg))
    assert "wandb/keep.txt" not in upload_size.shipped(
        project, working_dir_patterns(workload(working_dir=str(project)))
    )


def test_a_missing_working_dir_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^workload\.working_dir: .*/nowhere does not exist"):
        upload_check.check_upload(workload(working_dir=str(tmp_path / "nowhere")))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(
        ConfigError, match=r"^workload\.working_dir: .*file\.txt is not a directory"
    ):
        upload_check.check_upload(workload(working_dir=str(tmp_path / "file.txt")))


@pytest.mark.parametrize("name", ["no_such_module_rayflow_test", "no_such_package.sub", "sys"])
def test_a_py_module_that_cannot_be_shipped_is_refused(name):
    with pytest.raises(ConfigError) as err:
        jf.job_files(workload(py_modules=[name]))
    assert (
        err.value.key == "workload.py_modules"
        and name in str(err.value)
        and "\n" not in str(err.value)
    )


def test_wrong_kinds_are_refused():
    with pytest.raises(ConfigError, match=r"^workload\.excludes: must be a list"):
        jf.job_files(workload(working_dir=".", excludes="*.ckpt"))
    with pytest.raises(ConfigError, match=r"^workload\.pip: must be a list of non-empty strings"):
        jf.job_files(workload(pip=["torch", ""]))


def test_a_big_py_module_names_the_module(tmp_path, monkeypatch):
    package = tmp_path / "site" / "bigpkg"
    (package / "weights").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "weights" / "w.bin").write_bytes(os.urandom(100_000))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(
        ConfigError,
        match=r"^workload\.py_modules: bigpkg \(.*\) is 98 KiB .* biggest: weights/w\.bin 98 KiB .*workload\.pip",
    ):
        upload_check.check_upload(workload(py_modules=["bigpkg"]), limit=50_000)


def test_rayflow_own_package_keeps_its_files():
    """Ray applies a job's excludes to rayflow's package too: the defaults drop none of its files,
    and a pattern that would (its YAML configs) is refused before anything starts."""
    from ray._private.thirdparty.pathspec import PathSpec

    spec = PathSpec.from_lines("gitwildmatch", jf.DEFAULT_EXCLUDES)
    files = upload_check._rayflow_files()
    assert "conf/config.yaml" in files and "orchestrator/job_files.py" in files
    assert not [
        f
        for f in files
        if any(spec.match_file("/".join(f.split("/")[: i + 1])) for i in range(f.count("/") + 1))
    ]
    with pytest.raises(
        ConfigError,
        match=r"^workload\.excludes: '\*\.yaml' would also drop rayflow's own rayflow/conf/",
    ):
        upload_check.check_upload(workload(py_modules=["omegaconf"], excludes=["*.yaml"]))


def test_unreadable_file_is_named(project, monkeypatch):
    """Ray's zip would fail on a file it cannot read: named before anything starts (root reads
    every file, so unreadability is simulated)."""
    (project / "locked.bin").write_text("x")
    access = os.access
    monkeypatch.setattr(
        os, "access", lambda path, mode: Path(path).name != "locked.bin" and access(path, mode)
    )
    with pytest.raises(ConfigError, match=r"locked\.bin.*workload\.excludes"):
        upload_check.check_upload(workload(working_dir=str(project)))


def test_pip_lists_add_up():
    assert jf.merge_runtime_env(
        {"pip": ["torch==2.13.0"]}, {"pip": ["einops"], "working_dir": "/p"}
    ) == {"pip": ["torch==2.13.0", "einops"], "working_dir": "/p"}
    assert jf.merge_runtime_env(
        {"pip": {"packages": ["torch"], "pip_check": False}}, {"pip": ["einops"]}
    ) == {"pip": {"packages": ["torch", "einops"], "pip_check": False}}
    assert jf.merge_runtime_env({}, {"pip": ["einops"]}) == {"pip": ["einops"]}
    assert jf.merge_runtime_env(None, {}) == {}


def test_the_upload_limit_is_rays():
    from ray._private.ray_constants import DASHBOARD_CLIENT_MAX_SIZE
    from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE

    assert (
        upload_size.upload_limit()
        == min(DASHBOARD_CLIENT_MAX_SIZE, GCS_STORAGE_MAX_SIZE)
        == 100 * 2**20
    )


def test_the_job_gets_rayflow_and_the_callers_py_modules(monkeypatch):
    """run_as_job ships rayflow's package first and the caller's py_modules after it."""
    from types import SimpleNamespace

    import ray.job_submission

    from rayflow.orchestrator import submission as remote

    submitted = {}

    class Client:
        def __init__(self, url, headers=None):
            pass

        def submit_job(self, **kwargs):
            submitted.update(kwargs)
            return "job-1"

        async def tail_job_logs(self, job_id):
            return
            yield

        def get_job_status(self, job_id):
            return SimpleNamespace(value="SUCCEEDED")

        def get_job_info(self, job_id):
            return SimpleNamespace(message="")

        def get_job_logs(self, job_id):
            return "done\n"

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", Client)
    outcome = remote.run_as_job(
        "http://127.0.0.1:1",
        ["python", "-m", "rayflow"],
        {"A": "1"},
        runtime_env={"py_modules": ["/x/mylib"], "working_dir": "/x", "pip": ["einops"]},
    )
    env = submitted["runtime_env"]
    assert (
        (outcome.status, outcome.log) == ("SUCCEEDED", "done\n")
        and env["py_modules"][1:] == ["/x/mylib"]
        and env["py_modules"][0].endswith("/rayflow")
    )
    assert (env["working_dir"], env["pip"], env["env_vars"]) == ("/x", ["einops"], {"A": "1"})


def test_check_config_checks_a_submitted_runs_files_before_anything_starts(tmp_path):
    from rayflow.orchestrator.compose import compose_config
    from rayflow.orchestrator.preflight import plan_job

    cfg = compose_config("backend=vm", f"++workload.working_dir={tmp_path / 'nowhere'}")
    with pytest.raises(ConfigError, match=r"^workload\.working_dir: .*nowhere does not exist"):
        plan_job(cfg, [])


CREDENTIALS = [
    ".env",
    ".env.production",
    "id_rsa",
    "id_ed25519.pub",
    ".aws/credentials",
    "kubeconfig",
    ".kube/config",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".docker/config.json",
    ".ssh/known_hosts",
    "certs/server.pem",
    "tls.key",
    "gcp-credentials.json",
    "deploy/service-account-prod.json",
]


def test_credential_files_are_not_shipped_by_default(project, tmp_path, capsys):
    """`workload.working_dir: .` run from a project root or a home directory: the credential files
    in it stay here (Ray's own zip checked), the code beside them goes, and nothing is said."""
    for name in CREDENTIALS:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text("SECRET-VALUE\n")
    # code named so ships
    (project / "lib" / "credentials.py").write_text("def load():\n    return None\n")
    cfg = workload(working_dir=str(project))
    names = zipfile.ZipFile(ray_zip(project, working_dir_patterns(cfg), tmp_path)).namelist()
    assert not [
        n for n in names if any(n == c or n.startswith(c.split("/")[0] + "/") for c in CREDENTIALS)
    ], names
    assert "lib/credentials.py" in names and "train.py" in names
    upload_check.check_upload(cfg, limit=10 * 2**20)
    assert "credential" not in capsys.readouterr().err


def test_credential_files_the_user_re_includes_are_named_in_one_line(project, capsys):
    (project / ".env").write_text("WANDB_API_KEY=SECRET-VALUE\n")
    (project / ".aws").mkdir()
    (project / ".aws" / "credentials").write_text("[default]\naws_secret_access_key=SECRET-VALUE\n")
    cfg = workload(working_dir=str(project), excludes=["!.env", "!.aws", "!.aws/**"])
    upload_check.check_upload(cfg, limit=10 * 2**20)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "rayflow: warning: workload.working_dir: ships credential files"
    ), err
    assert ".env" in err[0] and ".aws/credentials" in err[0] and "SECRET-VALUE" not in err[0]
