"""Structural masking (rayflow/security/redaction.py), as tables: which names are secrets and which a
user needs to see, what text is masked and what stays, values beside secret names, and the
time mask_text takes on a 1 MB line (it runs on every streamed log line). No Ray."""

from __future__ import annotations

import time

import pytest

from rayflow.security.redaction import REDACTED, drop_redacted, mask_text, redact
from rayflow.security.secret_names import is_secret_name

SECRET_NAMES = [
    "token",
    "api_key",
    "MLFLOW_TRACKING_TOKEN",
    "db.password",
    "aws-secret",
    "spark.ssl.keyPassword",
    "spark.ssl.trustStorePassword",
    "spark.authenticate.secret",
    "fs.azure.account.key.acct.blob.core.windows.net",
    # concatenated, plural and short forms
    "dbpassword",
    "mysql_pass",
    "apiKeys",
    "GITHUB_PAT",
    "x-api-key",
    "session_cookie",
    "aws_secret_access_key",
    "AWS_SECRET_ACCESS_KEY",
    "secretAccessKey",
    "APIKey",
    "privateKey",
    "PGPASSWORD",
    "WANDB_API_KEY",
    "HF_TOKEN",
    "githubtoken",
    "refresh_token",
    "client_secret",
    "passphrase",
    "pwd",
    "dbpwd",
    "creds",
    "credentials",
    "Authorization",
    "proxy-authorization",
    "basic_auth",
    "oauth",
    "auth",
    "bearer",
    "cookies",
    "sas",
    "keys",
]
# What a user needs to see: words that merely contain a stem, counts, a kind of key that is no
# secret, and names that say they are about a secret (its mode, file, user, name, where it is).
NOT_SECRET_NAMES = [
    "monkey",
    "tokenizer",
    "keyboard",
    "keyboard_layout",
    "path",
    "pattern",
    "patience",
    "author",
    "authority",
    "passes",
    "num_passes",
    "bypass",
    "compass",
    "hockey",
    "num_samples",
    "metric",
    "max_tokens",
    "max_new_tokens",
    "num_keys",
    "total_tokens",
    "pad_token",
    "eos_token",
    "public_key",
    "primary_key",
    "sort_key",
    "full_key",
    "host_key",
    "StrictHostKeyChecking",
    "ray_auth_mode",
    "RAY_AUTH_MODE",
    "authOptions.mode",
    "auth.ssh_user",
    "fs.azure.account.auth.type",
    "spark.hadoop.fs.s3a.aws.credentials.provider",
    "secretName",
    "password_file",
    "token_url",
    "RAY_AUTH_TOKEN_PATH",
    "KeyName",
    "secretKeyRef",
    "spark.authenticate",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_names_users_need_to_see(name):
    assert not is_secret_name(name)


TEXTS = [
    ("export WANDB_API_KEY=abc123 && pip install x", "export WANDB_API_KEY=*** && pip install x"),
    ("env GITHUB_PAT=ghp_abc make", "env GITHUB_PAT=*** make"),
    ("run --db-password hunter2 --verbose", "run --db-password *** --verbose"),
    ("run --db-password=hunter2", "run --db-password=***"),
    (
        "java -Djavax.net.ssl.keyStorePassword=x1 -jar a",
        "java -Djavax.net.ssl.keyStorePassword=*** -jar a",
    ),
    ("curl -H 'Authorization: Bearer abcdefghijkl' x", "curl -H 'Authorization: Bearer ***' x"),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
    ("sent Bearer eyJhbGciOiJIUzI1NiJ9.e30.x to the head", "sent Bearer *** to the head"),
    ("x-api-key: abc\nnext: 1", "x-api-key: ***\nnext: 1"),
    ("Cookie: a=1; b=2", "Cookie: ***"),
    (
        "https://h/cb#access_token=XYZ&token_type=bearer",
        "https://h/cb#access_token=***&token_type=bearer",
    ),
    ("https://alice:hunter2@host:5000/x", "https://alice:***@host:5000/x"),
    ("ray://tok123@head:10001", "ray://***@head:10001"),
    ("http://host/p?token=abc&page=2", "http://host/p?token=***&page=2"),
    (
        '{"name": "AWS_SECRET_ACCESS_KEY", "value": "s3cr3t"}',
        '{"name": "AWS_SECRET_ACCESS_KEY", "value": "***"}',
    ),
    (
        "- name: AWS_SECRET_ACCESS_KEY\n  value: s3cr3t",
        "- name: AWS_SECRET_ACCESS_KEY\n  value: ***",
    ),
    ("{'password': 'my pass', 'lr': 0.1}", "{'password': '***', 'lr': 0.1}"),
    ("password: hunter", "password: ***"),
    (
        "Error parsing override '+backend.api_token=S]' extraneous",
        "Error parsing override '+backend.api_token=***]' extraneous",
    ),
    # what stays: no secret, a count, a path named by its key, prose after a key, a reference
    ("RAY_AUTH_MODE=token ray start --head", "RAY_AUTH_MODE=token ray start --head"),
    ("max_tokens=100 num_keys: 3", "max_tokens=100 num_keys: 3"),
    ("~/.ray/auth_token: /home/u/.ray/auth_token", "~/.ray/auth_token: /home/u/.ray/auth_token"),
    ("backend.api_token: must be a string", "backend.api_token: must be a string"),
    (
        "${oc.env:RAY_AUTH_MODE,token} token=${X} export T=$V auth: {}",
        "${oc.env:RAY_AUTH_MODE,token} token=${X} export T=$V auth: {}",
    ),
    ("Usage: rayflow [key=value ...]", "Usage: rayflow [key=value ...]"),
    (
        "export GOOGLE_APPLICATION_CREDENTIALS=/path/to/key.json; TOKEN=<your token>",
        "export GOOGLE_APPLICATION_CREDENTIALS=/path/to/key.json; TOKEN=<your token>",
    ),
    ("ssh -o StrictHostKeyChecking=no head", "ssh -o StrictHostKeyChecking=no head"),
    (
        "backend.ssh_private_key=~/.ssh/id_ed25519 see `?token=***`).",
        "backend.ssh_private_key=~/.ssh/id_ed25519 see `?token=***`).",
    ),
    (
        "tolerations:\n- key: nvidia.com/gpu\n  operator: Exists",
        "tolerations:\n- key: nvidia.com/gpu\n  operator: Exists",
    ),
    ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
]


# What a trial's traceback says about the user's own code: the names it quotes (a missing key, an
# attribute, a module) stay readable, whatever the exception's class is called.
CODE_LINES = [
    "KeyError: 'lr'",
    "KeyError: 'api_key'",
    'KeyError: "token"',
    "builtins.KeyError: 'password'",
    "AttributeError: 'Net' object has no attribute 'token'",
    "NameError: name 'secret' is not defined",
    "ModuleNotFoundError: No module named 'keyring'",
    "TokenExpiredError: 'refresh'",
    "ray.exceptions.RayTaskError(KeyError): KeyError: 'lr'",
    "ValueError: invalid literal for int() with base 10: 'ten'",
]
# Beside them, secrets in the same lines are still masked
SECRET_LINES = [
    ("KeyError: 'lr' (password: hunter2)", "KeyError: 'lr' (password: ***)"),
    ("RuntimeError: login failed for token=abc123", "RuntimeError: login failed for token=***"),
    ("KeyError: 'x' {'api_key': 'sk-123'}", "KeyError: 'x' {'api_key': '***'}"),
    ("api_key: sk-123", "api_key: ***"),
]


@pytest.mark.parametrize("line", CODE_LINES)
def test_the_names_an_exception_quotes_stay_readable(line):
    assert mask_text(line) == line


@pytest.mark.parametrize("line, masked", SECRET_LINES)
def test_secrets_beside_an_exception_are_still_masked(line, masked):
    assert mask_text(line) == masked


@pytest.mark.parametrize("text, masked", TEXTS)
def test_mask_text(text, masked):
    assert mask_text(text) == masked
    assert mask_text(masked) == masked  # masking twice changes nothing


def test_values_beside_secret_names_are_masked():
    doc = {
        "env": [
            {"name": "AWS_SECRET_ACCESS_KEY", "value": "s1"},
            {"name": "RAY_AUTH_MODE", "value": "token"},
            {"name": "T", "valueFrom": {"secretKeyRef": {"name": "my-secret", "key": "password"}}},
        ],
        "Tags": [{"Key": "db_password", "Value": "s2"}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "api": {"key": "s5"},
        "args": ["--db-password", "s3", "--port", "1", "--token", "--verbose"],
        "setup_commands": ["export WANDB_API_KEY=s4"],
        "auth": {
            "ssh_user": "ubuntu",
            "ssh_private_key": "~/.ssh/k.pem",
            "ssh_proxy_command": "nc %h %p",
        },
        "file_mounts": {"~/.ray/auth_token": "/home/u/.ray/auth_token"},
        "max_tokens": 100,
        "keys": 3,
        "password": 1234,
        "use_token": True,
        "token": None,
    }
    masked = redact(doc)
    assert masked["env"] == [
        {"name": "AWS_SECRET_ACCESS_KEY", "value": REDACTED},
        {"name": "RAY_AUTH_MODE", "value": "token"},
        doc["env"][2],
    ]  # a reference to a Kubernetes Secret is kept: the manifest still works
    assert masked["Tags"] == [{"Key": "db_password", "Value": REDACTED}]
    assert masked["tolerations"] == doc["tolerations"] and masked["api"] == {
        "key": REDACTED
    }  # a label; a bare key
    assert masked["args"] == ["--db-password", REDACTED, "--port", "1", "--token", "--verbose"]
    assert masked["setup_commands"] == ["export WANDB_API_KEY=***"]
    # paths: a dry run stays usable
    assert masked["auth"] == doc["auth"] and masked["file_mounts"] == doc["file_mounts"]
    assert (
        masked["max_tokens"],
        masked["keys"],
        masked["password"],
        masked["use_token"],
        masked["token"],
    ) == (100, 3, REDACTED, True, None)


def test_a_saved_config_merged_back_drops_what_was_masked_in_part():
    saved = redact({"uri": "http://u:pw@h", "setup": ["export TOKEN=x"], "lr": 0.1, "token": "t"})
    assert drop_redacted(saved) == {"lr": 0.1}


LINES = {
    "assignments": "token=b " * 125_000,
    "flags": "--password x " * 80_000,
    "spaces after a flag": "--password" + " " * 1_000_000,
    "a dotted run": "a." * 500_000,
    "separators": ";?&#" * 250_000,
    "colons": "a:" * 500_000,
    "schemes": "x://" + ":" * 1_000_000,
    "urls": "a://b@" * 160_000,
    "json": '"token": "v", ' * 70_000,
    "pairs": "name: AWS_SECRET_ACCESS_KEY, value: v " * 25_000,
    "one word": "a" * 1_000_000,
    "bearers": "Bearer abcdefghij " * 55_000,
}


@pytest.mark.parametrize("kind", LINES)
def test_a_1mb_line_is_masked_fast(kind):
    """Linear patterns: a quadratic one takes minutes on these."""
    line = LINES[kind]
    start = time.perf_counter()
    mask_text(line)
    assert time.perf_counter() - start < 3.0
