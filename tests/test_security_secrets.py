"""Planted secrets in every channel the command line prints besides a run: Hydra's override
parse error, argparse's usage error, `--cfg` (job, all, hydra, --resolve), `--help`, `--info`,
dry runs (with the stderr note on secrets the document holds), the cluster spec a submitted job
is handed (RAYFLOW_CLUSTER_SPEC) and logged (cluster/spec.yaml), a ConfigError raised to Python
and repr(RunResult). None starts Ray."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rayflow.security.redaction import REDACTED
from tests.harness.secrets import STRUCTURAL_VM_SECRETS, assert_nowhere, planted


def cli(tmp_path: Path, *args: str, full_error: str = "0") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rayflow", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HYDRA_FULL_ERROR": full_error},
    )


def test_hydras_parse_error_masks_the_override_it_quotes(tmp_path):
    out = cli(tmp_path, "+backend.api_token=PLANTED-parse]")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    # issue 43: the line names the override's key, and shows nothing of a secret's value
    assert out.stderr.startswith(
        "rayflow: error: backend.api_token: cannot parse its value; not shown, it holds a secret"
    )
    url = cli(tmp_path, "tracking.uri=http://u:PLANTED-url@h/x", "bad[=")
    assert url.returncode == 2
    # not a choice of --info
    argparse = cli(tmp_path, "--info", "tracking.uri=http://u:PLANTED-argparse@h/x")
    assert argparse.returncode == 2 and "u:***@h/x" in argparse.stderr
    # Hydra's own traceback, asked for (HYDRA_FULL_ERROR=1) where Hydra answers: --cfg
    traceback = cli(
        tmp_path, "--cfg", "job", "+backend.api_token=PLANTED-traceback]", full_error="1"
    )
    assert (
        traceback.returncode == 1
        and "OverrideParseException" in traceback.stderr
        and "api_token=***]" in traceback.stderr
    )
    assert_nowhere(
        ["PLANTED"],
        [
            out.stdout,
            out.stderr,
            url.stdout,
            url.stderr,
            argparse.stdout,
            argparse.stderr,
            traceback.stdout,
            traceback.stderr,
        ],
        [],
    )


SECRETS = [
    "+backend.api_token=PLANTED-key",
    "tracking.uri=http://u:PLANTED-url@h/x",
    "+backend.spark_conf.fs.azure.account.key.acct=PLANTED-nested",
    "+backend.env=[{name:AWS_SECRET_ACCESS_KEY,value:PLANTED-env-pair}]",
    "+backend.shown=${backend.spark_conf.fs.azure.account.key.acct}",
]


@pytest.mark.parametrize(
    "flags",
    [
        ["--cfg", "job"],
        ["--cfg", "job", "--resolve"],
        ["--cfg", "all"],
        ["--cfg", "hydra"],
        ["--cfg", "job", "--package", "backend", "--resolve"],
        ["--help"],
        ["--info", "config"],
    ],
)
def test_what_hydra_prints_of_the_config_is_masked(tmp_path, flags):
    out = cli(tmp_path, *flags, *SECRETS)
    assert out.returncode == 0, out.stderr
    assert_nowhere(["PLANTED"], [out.stdout, out.stderr], [])
    if flags[:2] == ["--cfg", "job"] and "--package" not in flags:
        backend = yaml.safe_load(out.stdout)["backend"]
        assert backend["api_token"] == REDACTED and backend["env"] == [
            {"name": "AWS_SECRET_ACCESS_KEY", "value": REDACTED}
        ]
        assert backend["shown"] == (
            REDACTED if "--resolve" in flags else "${backend.spark_conf.fs.azure.account.key.acct}"
        )
        assert yaml.safe_load(out.stdout)["tracking"]["uri"] == "http://u:***@h/x"


def test_without_secrets_hydras_output_is_unchanged(tmp_path):
    """The masking changes nothing else: --cfg all and --help are Hydra's own, byte for byte."""

    def run(call: str, flags: list[str]) -> subprocess.CompletedProcess:
        script = f"import sys; import rayflow.cli as c; sys.argv[0] = 'rayflow'; c.{call}()"
        return subprocess.run(
            [sys.executable, "-c", script, *flags],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    for flags in (["--cfg", "all", "backend=vm"], ["--cfg", "job", "backend=kuberay"], ["--help"]):
        ours, hydras_own = run("main", flags), run("_informational", flags)
        assert ours.returncode == hydras_own.returncode == 0, ours.stderr + hydras_own.stderr
        assert ours.stdout == hydras_own.stdout


def test_a_dry_run_masks_structural_secrets_and_says_so(tmp_path):
    overrides, secrets = planted(STRUCTURAL_VM_SECRETS)
    out = cli(tmp_path, "backend=vm", "tracking=none", "dry_run=true", *overrides)
    assert out.returncode == 0, out.stderr
    assert_nowhere(secrets, [out.stdout, out.stderr], [])
    doc = yaml.safe_load(out.stdout)  # still the document `ray up` takes, less the secrets
    assert doc["setup_commands"] == ["export WANDB_API_KEY=***", "run --db-password ***"]
    assert doc["provider"]["env"] == [{"name": "AWS_SECRET_ACCESS_KEY", "value": REDACTED}]
    assert (
        "RAY_AUTH_MODE=token" in " ".join(doc["head_start_ray_commands"])
        or "RAY_AUTH_MODE" in out.stdout
    )
    [note] = [line for line in out.stderr.splitlines() if "in clear" in line]
    assert (
        "provider.env.0.value" in note
        and "setup_commands.0" in note
        and "environment" in note
        and "Kubernetes Secret" in note
    )
    plain = cli(tmp_path, "backend=vm", "tracking=none", "dry_run=true")
    assert plain.returncode == 0 and "in clear" not in plain.stderr  # no note without a secret


def test_the_spec_handed_to_a_job_and_logged_is_masked():
    """run_submitted hands cluster.spec (spec_text) to the job as RAYFLOW_CLUSTER_SPEC, and the
    tracker writes it as cluster/spec.yaml after redact(): neither holds a planted secret."""
    import rayflow
    from rayflow.orchestrator.cluster import spec_text
    from rayflow.orchestrator.preflight import plan_job
    from rayflow.security.redaction import redact

    overrides, secrets = planted(STRUCTURAL_VM_SECRETS)
    backend = plan_job(
        rayflow.compose("backend=vm", "tracking=none", "dry_run=true", *overrides), []
    ).backend
    # what `ray up` gets holds them
    assert any(secret in backend.render().text for secret in secrets)
    spec = spec_text(backend)
    logged = yaml.safe_dump(redact(yaml.safe_load(spec)), sort_keys=False)
    assert_nowhere(secrets, [spec, logged], [])


def test_a_config_error_raised_to_python_is_masked():
    import rayflow
    from rayflow.errors import ConfigError

    for call in (rayflow.run, rayflow.dry_run, rayflow.compose):
        with pytest.raises(ConfigError) as raised:
            call("+backend.api_token=PLANTED-api]")
        assert (  # issue 43: the key named, nothing of the secret's value shown
            raised.value.key == "backend.api_token"
            and "PLANTED" not in str(raised.value)
            and "not shown, it holds a secret" in str(raised.value)
        )


def test_repr_of_a_run_result_is_masked(tmp_path):
    from rayflow.results.run_result import RunResult

    class Summary:
        def table(self):
            return "trial  lr    config\nt1     0.1   {'token': 'PLANTED-table', 'lr': 0.1}\n"

    result = RunResult(
        "cifar",
        Summary(),
        tmp_path,
        ("+backend.api_token=PLANTED-override",),
        {"backend": {"api_token": REDACTED}},
        "https://u:PLANTED-uri@mlflow.invalid",
        "exp?token=PLANTED-exp",
        mlflow_run_id="abc",
    )
    shown = repr(result)
    assert "u:***@mlflow.invalid" in shown and "'lr': 0.1" in shown
    assert_nowhere(["PLANTED"], [shown], [])
