"""Ray's token: where this driver finds it, and making one before a cluster starts.

Ray 2.60 turns token auth on when `RAY_AUTH_MODE=token`; driver, head, workers and the Jobs
client must all hold the same token. rayflow never prints it or writes it into a spec.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def token_path() -> Path:
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def auth_token() -> str | None:
    """The token this driver authenticates with: RAY_AUTH_TOKEN, its file, or ~/.ray/auth_token."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"]
    try:
        return token_path().read_text().strip() or None
    except OSError:
        return None


def ensure_token() -> None:
    """Make a token (Ray's own `ray get-auth-token --generate`) if this driver has none, so every
    node the cluster starts gets the same one."""
    if auth_token() is None:
        subprocess.run([str(Path(sys.executable).parent / "ray"), "get-auth-token", "--generate"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
