"""Issue 43, classes 1 and 7 (a store's half): what a resume reads back from a store is this user's
own, or a key they named, and no more of it than rayflow means to read.

Experiments are signed by the user who wrote them (a manifest of their files, signed with the
user's key); a resume verifies before it reads anything: an experiment planted under a shared
prefix (a rayflow.json that turns auth off, adds a Hydra search path and points tracking at
another server; a tuner.pkl that runs code when unpickled) is refused by `resume=PATH`, passed by
by `resume=true`, and nothing of it is used: no request reaches its tracking server, no code of its
runs. A signed experiment restores only the trials' own keys. Another user's key is refused until
listed in trusted_signers; a file changed after signing is refused by name. Reads from a store are
bounded: an oversized rayflow.json, a mirror pull past its caps, keys that clash (`a` and `a/b`), a
lease nobody trusted signed. Against a real S3-compatible server (moto, scripts/servers/s3.py)
and local folders; nothing here starts Ray.
"""

from __future__ import annotations

import http.server
import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from scripts.servers.s3 import S3Server


@pytest.fixture(scope="module")
def s3():
    with S3Server(bucket="rayflow-shared") as server:
        yield server


@pytest.fixture(autouse=True)
def user(tmp_path, monkeypatch, s3) -> dict[str, str]:
    """This test's user: a cache (their key) of their own, the store's settings; the environment a
    command of theirs runs with."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    for key in ("RAY_AUTH_MODE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(key, raising=False)
    return dict(os.environ)


class Marker:
    """What a planted tuner.pkl holds: unpickled, it creates `path` (code run from a store)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _put(where: str, relative: str, data: bytes) -> None:
    """A file of an experiment: in a folder, or an object in the store."""
    from rayflow.results import storage

    if storage.is_uri(where):
        filesystem, path = storage.filesystem(storage.join(where, relative))
        with filesystem.open_output_stream(path) as out:
            out.write(data)
        return
    target = Path(where) / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def _get(where: str, relative: str) -> bytes:
    from rayflow.results import storage

    data = storage.read_capped(storage.join(where, relative), 2**30)
    assert data is not None
    return data


def _state(workload: str = "cifar", **extra) -> dict:
    """A rayflow.json as a run of `workload` writes it."""
    from rayflow.orchestrator.compose import compose_config
    from rayflow.orchestrator.resume import resumed_keys
    from rayflow.schema.values import to_container

    cfg = compose_config(f"workload={workload}")
    config = to_container(cfg)
    kept = {k: config[k] for k in resumed_keys(cfg)}
    return {"mlflow_run_id": None, "choices": {"workload": workload}, "config": kept, **extra}


def _experiment(where: str, state: dict | None = None, tuner: bytes | None = None) -> str:
    """An experiment's files as Tune and rayflow leave them (unsigned)."""
    _put(where, "rayflow.json", json.dumps(state or _state()).encode())
    _put(where, "tuner.pkl", tuner or pickle.dumps({"tuner": "state"}))
    _put(where, "experiment_state-2026-11-28_10-00-00.json", b'{"trial_data": []}')
    _put(where, "basic-variant-state-2026-11-28_10-00-00.json", b"{}")
    _put(where, "train_cifar_00000/params.pkl", pickle.dumps({"lr": 0.01}))
    _put(where, "train_cifar_00000/result.json", b'{"loss": 1.0}\n')
    _put(where, "train_cifar_00000/checkpoint_000000/model.pt", b"\0" * 2048)
    return where


def _own(where: str, workload: str = "cifar", **state) -> str:
    """An experiment of this user's, signed as its run signs it."""
    from rayflow.results.signing import sign_folder

    _experiment(where, _state(workload, **state))
    sign_folder(where, workload)
    return where


def _signed_by_another(where: str, cache: Path, monkeypatch) -> str:
    """An experiment signed by another user's key (their own cache); that key's public id."""
    from rayflow.results.signing import sign_folder
    from rayflow.security.keys import public_id

    _experiment(where)
    with monkeypatch.context() as other:
        other.setenv("XDG_CACHE_HOME", str(cache))
        sign_folder(where, "cifar")
        return public_id()


def _planted(where: str, tracking: str, marker: Path) -> str:
    """An experiment an attacker put under a shared prefix: its rayflow.json turns auth off, adds
    their Hydra search path and points tracking at their server; its tuner.pkl runs code."""
    state = _state()
    state["choices"].update(
        {
            "ray_auth_mode": "disabled",
            "hydra.searchpath": "[file:///tmp/evil]",
            "tracking": "mlflow",
        }
    )
    state["config"]["tracking"] = {"enabled": True, "uri": tracking, "experiment": "x"}
    state["mlflow_run_id"] = "0123456789abcdef0123456789abcdef"
    return _experiment(where, state, pickle.dumps(Marker(marker)))


def _cfg(*overrides: str):
    from rayflow.orchestrator.compose import compose_config

    return compose_config("tracking=none", *overrides)


def _refused(call, key: str = "resume") -> str:
    """The one line a ConfigError naming `key` says."""
    from rayflow.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.key == key, str(err.value)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.fixture
def tracking_server():
    """A loopback HTTP server standing in for an attacker's MLflow: yields (its URI, the requests
    it received, each with its headers)."""
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _any(self):
            seen.append({"path": self.path, "headers": dict(self.headers)})
            self.send_response(404)
            self.end_headers()

        do_GET = do_POST = _any

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _cli(env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayflow", *args],
        cwd=cwd,
        env={**env, "MLFLOW_TRACKING_TOKEN": "user-token-s3cr3t", "HYDRA_FULL_ERROR": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )


# -- a planted experiment: refused by name, passed by by resume=true, nothing of it used --


@pytest.mark.parametrize("shared", ["folder", "bucket"])
def test_a_planted_experiment_is_refused_and_resume_true_takes_the_users_own(
    shared, tmp_path, s3, tracking_server, user
):
    from rayflow.results.experiment import locate

    base = str(tmp_path / "shared") if shared == "folder" else s3.uri(f"{tmp_path.name}/shared")
    mine = _own(f"{base}/cifar-20261127-090000")
    marker = tmp_path / "planted-code-ran"
    uri, seen = tracking_server
    planted = _planted(f"{base}/cifar-20261128-100000", uri, marker)  # the newer one

    line = _refused(lambda: locate(_cfg(f"storage_path={base}", f"resume={planted}")))
    assert line.startswith(f"resume: {planted} is not signed") and "trusted_signers" in line
    assert locate(_cfg(f"storage_path={base}", "resume=true")).location == mine

    # What the user sees, a dry run and a real resume: one line naming resume, exit 2; the
    # planted tracking server is never asked (with the user's MLflow token), no planted code runs
    for extra in (["dry_run=true"], []):
        out = _cli(user, tmp_path, f"storage_path={base}", f"resume={planted}", *extra)
        assert out.returncode == 2, out.stderr[-2000:]
        [said] = out.stderr.strip().splitlines()
        assert said.startswith(f"rayflow: error: resume: {planted} is not signed"), said
    assert not seen and not marker.exists()


def test_resume_true_says_what_it_passed_by(tmp_path, tracking_server, monkeypatch):
    from rayflow.results.experiment import locate

    base = tmp_path / "shared"
    _planted(str(base / "cifar-20261128-100000"), tracking_server[0], tmp_path / "marker")
    _signed_by_another(str(base / "cifar-20261128-110000"), tmp_path / "other", monkeypatch)
    line = _refused(lambda: locate(_cfg(f"storage_path={base}", "resume=true")))
    assert line == (
        f"resume: no cifar experiment under {base} to resume (passed by: 1 unsigned and 1 "
        "signed by a key not trusted; trusted_signers names other keys)"
    )


def test_a_signed_state_sets_only_the_trials_own_keys(tmp_path, tracking_server, user):
    """Even signed (this user's own, or a teammate's), what a rayflow.json may set is an
    allow-list: the workload, its sections, seed and compute. Auth, tracking, hydra.searchpath and
    the backend are this invocation's: a dry run of it asks the recorded tracking server nothing."""
    from rayflow.orchestrator.resume import resumed
    from rayflow.schema.values import to_container

    uri, seen = tracking_server
    state = _state(seed=3)
    state["choices"].update(
        {
            "ray_auth_mode": "disabled",
            "hydra.searchpath": "[file:///tmp/evil]",
            "backend": "attach",
            "tracking": "mlflow",
        }
    )
    state["config"].update(
        {
            "seed": 3,
            "ray_auth_mode": "disabled",
            "tracking": {"enabled": True, "uri": uri},
            "backend": {"name": "attach", "address": "203.0.113.9:6379"},
            "hydra": {"searchpath": ["file:///tmp/evil"]},
        }
    )
    path = str(tmp_path / "cifar-1")
    _experiment(path, state)
    from rayflow.results.signing import sign_folder

    sign_folder(path, "cifar")
    point, cfg = resumed([f"resume={path}", "tracking=none"], _cfg(f"resume={path}"))
    assert cfg.seed == 3 and to_container(cfg.workload) == state["config"]["workload"]
    assert cfg.backend.name == "local" and cfg.ray_auth_mode == "token"
    assert cfg.tracking.enabled is False  # this invocation's tracking=none
    assert not [o for o in point if o.split("=")[0] in ("hydra.searchpath", "ray_auth_mode")]
    assert "backend=attach" not in point

    out = _cli(user, tmp_path, f"resume={path}", "dry_run=true", f"data.root={tmp_path}")
    assert out.returncode == 0, out.stderr[-2000:]
    assert not seen


# -- whose key: another user's refused, accepted once trusted; a file changed, named --


def test_another_users_key_is_refused_until_trusted(tmp_path, monkeypatch):
    from rayflow.results.experiment import locate
    from rayflow.security.keys import public_id

    path = str(tmp_path / "cifar-theirs")
    theirs = _signed_by_another(path, tmp_path / "their-cache", monkeypatch)
    assert theirs != public_id()
    line = _refused(lambda: locate(_cfg(f"resume={path}")))
    assert f"is signed by {theirs}, a key this user does not trust" in line
    assert f"this user's is {public_id()}" in line
    found = locate(_cfg(f"resume={path}", f"trusted_signers=[{theirs}]"))
    assert found.location == path


@pytest.mark.parametrize(
    "changed",
    ["rayflow.json", "tuner.pkl", "experiment_state-2026-11-28_10-00-00.json"],
)
@pytest.mark.parametrize("shared", ["folder", "bucket"])
def test_a_file_changed_after_signing_is_refused_naming_it(changed, shared, tmp_path, s3):
    from rayflow.results.experiment import locate

    where = str(tmp_path / "cifar-1") if shared == "folder" else s3.uri(f"{tmp_path.name}/cifar-1")
    _own(where)
    data = bytearray(_get(where, changed))
    data[len(data) // 2] ^= 1  # one byte
    _put(where, changed, bytes(data))
    line = _refused(lambda: locate(_cfg(f"resume={where}")))
    assert f"{where} changed since it was signed (" in line and f"{changed} (changed)" in line


@pytest.mark.parametrize("shared", ["folder", "bucket"])
def test_a_file_added_or_a_checkpoint_changed_is_refused(shared, tmp_path, s3):
    """Tune picks the newest experiment state: one added is refused; so is a small checkpoint file
    changed (a digest where it is cheap: on a store too)."""
    from rayflow.results.experiment import locate

    where = str(tmp_path / "cifar-1") if shared == "folder" else s3.uri(f"{tmp_path.name}/cifar-1")
    _own(where)
    _put(where, "experiment_state-2026-11-29_00-00-00.json", b"{}")  # Tune reads the newest
    _put(where, "train_cifar_00000/checkpoint_000000/model.pt", b"\1" * 2048)
    line = _refused(lambda: locate(_cfg(f"resume={where}")))
    assert "experiment_state-2026-11-29_00-00-00.json (added)" in line
    assert "train_cifar_00000/checkpoint_000000/model.pt (changed)" in line


def test_what_is_read_after_the_check_is_what_was_checked(tmp_path):
    """A resume holds the experiment and verifies it; a file changed after that (before Tune
    unpickles it) is refused, and rayflow's state read back only as it was verified."""
    from rayflow.results.experiment import claimed_experiment, read_state
    from rayflow.results.verification import check_unchanged

    base = tmp_path / "results"
    where = _own(str(base / "cifar-1"))
    cfg = _cfg(f"storage_path={base}", f"resume={where}")
    with claimed_experiment(cfg) as experiment:
        assert read_state(experiment)["choices"] == {"workload": "cifar"}
        _put(where, "tuner.pkl", pickle.dumps(Marker(tmp_path / "marker")))
        line = _refused(lambda: check_unchanged(experiment.location))
        assert "tuner.pkl (changed)" in line and "not restored" in line
        _put(where, "rayflow.json", json.dumps(_state(seed=9)).encode())
        line = _refused(lambda: read_state(experiment))
        assert "rayflow.json changed since the experiment was verified" in line


def test_a_run_signs_while_it_runs_and_when_it_ends(tmp_path, monkeypatch):
    """What a run writes is signed within SIGN_EVERY_S while it runs (a run killed outright leaves
    seconds unsigned), and at its end however it ends."""
    from rayflow.results import signing
    from rayflow.results.experiment import claimed_experiment
    from rayflow.results.verification import verify
    from rayflow.testing.processes import wait_until

    monkeypatch.setattr(signing, "SIGN_EVERY_S", 0.2)
    base = tmp_path / "results"
    cfg = _cfg(f"storage_path={base}", "experiment_name=cifar-new")
    with pytest.raises(KeyboardInterrupt):
        with claimed_experiment(cfg) as experiment:
            _experiment(experiment.location)
            assert wait_until(lambda: (base / "cifar-new" / signing.MANIFEST).exists(), timeout=5)
            assert verify(experiment.location).workload == "cifar"
            _put(experiment.location, "train_cifar_00000/result.json", b'{"loss": 0.5}\n')
            raise KeyboardInterrupt
    verify(str(base / "cifar-new"))  # what the interrupted run wrote last is signed


def test_a_run_on_a_cluster_signs_with_a_key_this_user_delegated_for_that_experiment(tmp_path):
    """The head never holds this user's key: the run's own key, certified by this user for that
    experiment's name, signs it there; the experiment is this user's, that name (or a suffixed
    one) only. The key leaves the job's environment before any user code runs."""
    from rayflow.results import trust
    from rayflow.results.signing import sign_folder
    from rayflow.results.verification import signature, verify
    from rayflow.security.keys import public_id

    env = trust.delegation_env("cifar-20261128")
    assert "seed" not in json.loads(env[trust.DELEGATE_ENV])["cert"]
    try:
        with pytest.MonkeyPatch.context() as head:
            head.setenv(trust.DELEGATE_ENV, env[trust.DELEGATE_ENV])
            head.setenv("XDG_CACHE_HOME", str(tmp_path / "head-cache"))  # the head's own
            trust.take_delegate()
            assert trust.DELEGATE_ENV not in os.environ
            for name in ("cifar-20261128-2", "cifar-other"):
                sign_folder(_experiment(str(tmp_path / name)), "cifar")
    finally:
        trust._DELEGATE.taken = None
    assert verify(str(tmp_path / "cifar-20261128-2")).issuer == public_id()
    assert signature(str(tmp_path / "cifar-other"))[0] == "unsigned"  # not the name it was for


# -- bounded reads: an oversized state, a pull past its caps, clashing keys, a spammed lease --


def test_an_oversized_rayflow_json_is_one_line_naming_resume(tmp_path, s3):
    from rayflow.results import experiment
    from rayflow.results.experiment import locate

    where = s3.uri(f"{tmp_path.name}/cifar-1")
    _own(where, padding="x" * (experiment.STATE_MAX + 10))
    line = _refused(lambda: experiment.read_state(locate(_cfg(f"resume={where}"))))
    assert f"{where}/rayflow.json holds " in line and "over the 8388608 bytes" in line


def test_a_mirror_past_its_caps_is_refused_naming_its_key(tmp_path, s3, monkeypatch):
    from rayflow.errors import ConfigError
    from rayflow.results import experiment

    where = s3.uri(f"{tmp_path.name}/cifar-1")
    _experiment(where)
    monkeypatch.setattr(experiment, "MIRROR_FILES_MAX", 3)
    with pytest.raises(ConfigError) as err:
        experiment.Experiment(where).pull("resume")
    assert err.value.key == "resume" and "holds 6 files, over the 3 files" in str(err.value)
    monkeypatch.setattr(experiment, "MIRROR_FILES_MAX", 100)
    monkeypatch.setattr(experiment, "MIRROR_BYTES_MAX", 100)
    with pytest.raises(ConfigError) as err:
        experiment.Experiment(where).pull("storage_path")
    assert err.value.key == "storage_path" and "over the 100 bytes" in str(err.value)


def test_too_many_files_to_verify_is_one_line(tmp_path, monkeypatch):
    from rayflow.results import signing
    from rayflow.results.experiment import locate

    where = _own(str(tmp_path / "cifar-1"))
    monkeypatch.setattr(signing, "FILES_MAX", 3)
    line = _refused(lambda: locate(_cfg(f"resume={where}")))
    assert "over the 3 files" in line


def test_keys_that_clash_are_passed_by_with_one_warning(tmp_path, s3, capsys):
    from rayflow.results import storage

    where = s3.uri(f"{tmp_path.name}/clash")
    for key in ("a", "a/b", "c/d", "c/d/e", "ok.json"):
        _put(where, key, key.encode())
    storage.pull(where, tmp_path / "mirror", skip=lambda _: False)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "passed by 2 object(s) whose key is also a folder's (a, c/d)" in err[0]
    assert (tmp_path / "mirror" / "a" / "b").read_bytes() == b"a/b"
    assert (tmp_path / "mirror" / "ok.json").read_bytes() == b"ok.json"


@pytest.mark.parametrize("lease", ["unsigned", "another key's", "this user's"])
def test_only_a_lease_signed_by_a_trusted_key_holds_an_experiment(
    lease, tmp_path, s3, monkeypatch, capsys
):
    from rayflow.results import lease as leases
    from rayflow.results.experiment import LOCK_FILE, locate

    where = s3.uri(f"{tmp_path.name}/cifar-1")
    _own(where)
    if lease == "unsigned":
        text = json.dumps({"host": "x", "pid": 1, "at": 9e9}) + " " * 100
    elif lease == "another key's":
        with monkeypatch.context() as other:
            other.setenv("XDG_CACHE_HOME", str(tmp_path / "other"))
            text = leases.lease_text(where)
    else:
        text = leases.lease_text(where)
    _put(where, LOCK_FILE, text.encode())
    cfg = _cfg(f"resume={where}")
    if lease == "this user's":
        assert "is running now" in _refused(lambda: locate(cfg))
        return
    for _ in range(3):
        assert locate(cfg).location == where  # the spam blocks nothing
    [warning] = capsys.readouterr().err.strip().splitlines()  # said once
    assert warning == (
        f"rayflow: warning: {where}/{LOCK_FILE} is not a lease signed by a trusted key: no run of "
        "this user's holds the experiment, and it is passed by"
    )


def test_a_crashed_runs_last_writes_are_signed_only_on_the_users_word(tmp_path, user, monkeypatch):
    """A run killed before it signed what it wrote last leaves its own experiment changed since
    its signature: the refusal says how its user signs it as theirs once they looked (never for
    another key's experiment), `rayflow sign PATH` does, and the resume then verifies it."""
    from rayflow.results.experiment import locate

    mine = _own(str(tmp_path / "cifar-mine"))
    _put(mine, "experiment_state-2026-11-29_00-00-00.json", b'{"trial_data": []}')  # unsigned
    line = _refused(lambda: locate(_cfg(f"resume={mine}")))
    assert line.endswith(f"then sign the experiment as yours: rayflow sign {mine}"), line
    theirs = str(tmp_path / "cifar-theirs")
    _signed_by_another(theirs, tmp_path / "their-cache", monkeypatch)
    _put(theirs, "tuner.pkl", b"changed")
    assert "rayflow sign" not in _refused(lambda: locate(_cfg(f"resume={theirs}")))

    def sign(path: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rayflow", "sign", path],
            env=user,
            capture_output=True,
            text=True,
            timeout=60,
        )

    out = sign(mine)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        f"[rayflow] signed {mine} as yours (its signature was yours ("
        + out.stdout.split("(its signature was yours (", 1)[1].split(")", 1)[0]
        + "); changed since: experiment_state-2026-11-29_00-00-00.json (added))"
    )
    assert locate(_cfg(f"resume={mine}")).location == mine
    out = sign(str(tmp_path / "nothing-here"))
    assert out.returncode == 2 and out.stderr.strip().endswith("(no rayflow.json)"), out.stderr


# -- the team's setting and the key to share --


def test_rayflow_key_prints_the_public_key_to_share(tmp_path, user):
    from rayflow.security.keys import public_id, valid_public_id

    for argv in (["-m", "rayflow", "key"],):
        out = subprocess.run(
            [sys.executable, *argv], env=user, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == public_id() and valid_public_id(out.stdout.strip())


def test_trusted_signers_takes_public_keys_only(tmp_path, user):
    out = _cli(user, tmp_path, "trusted_signers=[rfk1:not-a-key]", "dry_run=true")
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("rayflow: error: trusted_signers: 'rfk1:not-a-key' is not a rayflow")


def test_the_resume_command_carries_what_a_resume_does_not_restore():
    """The printed command works as it is: it carries this invocation's backend, tracking, auth and
    search path (a resume takes them from its command line only), but no secret (asked by name)."""
    import shlex

    from rayflow.orchestrator.resume import carried, resume_command

    given = [
        "backend=vm",
        "backend.head_ip=10.0.0.5",
        "backend.worker_ips=[10.0.0.6,10.0.0.7]",
        "+backend.api_token=s3cr3t",
        "tracking.uri=http://user:pa55@mlflow:5000",
        "tracking.experiment=mine",
        "ray_auth_mode=token",
        "hydra.searchpath=[file://conf]",
        "workload.max_epochs=3",
    ]
    shown, asks = carried(given)
    command = resume_command("s3://b/runs/cifar-1", shown)
    assert command.startswith("python -m rayflow resume=s3://b/runs/cifar-1 backend=vm ")
    assert shlex.split(command)[4:] == [
        "backend=vm",
        "backend.head_ip=10.0.0.5",
        "backend.worker_ips=[10.0.0.6,10.0.0.7]",
        "tracking.experiment=mine",
        "ray_auth_mode=token",
        "hydra.searchpath=[file://conf]",
    ]
    assert asks == ["backend.api_token", "tracking.uri"]
    assert "s3cr3t" not in command and "pa55" not in command


def test_a_sweeps_outputs_are_made_only_from_an_experiment_verified_as_the_users(tmp_path, s3):
    """hydra/sweeper=rayflow with an object store: the sweep dir's table, best params and job
    folders are made from the search's experiment read back from the bucket, so it is verified
    first; one planted under its name (unsigned) or changed since its run signed it is refused in
    one line naming the key, and nothing of it is read."""
    from types import SimpleNamespace

    from rayflow.sweeper.outputs import _experiment_here

    KEY = "hydra.sweeper.storage_path"
    planted = _experiment(s3.uri(f"{tmp_path.name}/planted/search"))
    line = _refused(lambda: _experiment_here(SimpleNamespace(experiment=planted)), KEY)
    assert "is not signed" in line
    ours = _own(s3.uri(f"{tmp_path.name}/ours/search"))
    assert (_experiment_here(SimpleNamespace(experiment=ours)) / "rayflow.json").is_file()
    _put(ours, "train_cifar_00000/result.json", b'{"loss": -1e9}\n')  # a better "best"
    line = _refused(lambda: _experiment_here(SimpleNamespace(experiment=ours)), KEY)
    assert "changed since it was signed" in line and "result.json (changed)" in line
