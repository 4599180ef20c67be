"""A submitted run's head that stops answering, seen through Ray's own Jobs client over HTTP: a
gateway in between (the kuberay relay, the API server's service proxy, an ingress) answers 502,
503 or 504 for it. Waiting for the job ends in one line naming the dashboard, and stopping it ends
in a warning, as with a dropped connection; another error status is not taken for that."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rayflow.errors import ClusterError
from rayflow.orchestrator import submission


class Gateway(BaseHTTPRequestHandler):
    """Answers Ray's version check (the client's first request), then `status` for every job."""

    status = 502

    def _answer(self) -> None:
        if self.path == "/api/version":
            body = json.dumps({"version": "4", "ray_version": "2.60.0", "ray_commit": "x"})
            code = 200
        else:
            body, code = "gateway: upstream did not answer", self.status
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture
def client_for(monkeypatch):
    from ray.job_submission import JobSubmissionClient

    monkeypatch.setattr(submission, "UNREACHABLE_S", 1.0)
    servers = []

    def make(status: int):
        handler = type("Answering", (Gateway,), {"status": status})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return JobSubmissionClient(f"http://127.0.0.1:{server.server_address[1]}")

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_gateway_that_cannot_reach_the_head_ends_the_wait_in_one_line(client_for, status):
    client = client_for(status)
    with pytest.raises(ClusterError) as raised:
        submission.wait_for_end(client, "raysubmit_x")
    message = str(raised.value)
    assert "stopped answering for 1 s while job raysubmit_x ran" in message
    assert f"status code {status}" in message and "\n" not in message


def test_stopping_a_job_behind_a_gateway_that_cannot_reach_the_head_warns(client_for, capsys):
    import time

    client = client_for(502)
    submission._stop(client, "raysubmit_x", deadline=time.monotonic() + 1.5)
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("rayflow: warning: job raysubmit_x had not stopped")


def test_an_error_of_the_jobs_api_itself_is_not_taken_for_an_unreachable_head(client_for):
    with pytest.raises(RuntimeError, match="status code 500"):
        submission.wait_for_end(client_for(500), "raysubmit_x")


def test_the_kuberay_relay_answers_502_for_an_api_server_that_says_nothing(monkeypatch):
    """An API server that takes the request and never answers: the relay's 502 ends the Jobs
    client's call, which sets no timeout of its own (and would otherwise wait for good)."""
    import http.client
    import socket
    import time

    from rayflow.backends.kuberay import relay as relay_module

    monkeypatch.setattr(relay_module, "HTTP_SILENCE_S", 1)
    silent = socket.socket()  # listens, never accepts: connections wait in its backlog
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    relay = relay_module.DashboardRelay(f"http://127.0.0.1:{silent.getsockname()[1]}", dict)
    relay.start()
    try:
        host, port = relay.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        began = time.monotonic()
        conn.request("GET", "/api/jobs/raysubmit_x", headers=relay.client_headers())
        response = conn.getresponse()
        assert response.status == 502 and time.monotonic() - began < 15
        assert response.read().decode().startswith("rayflow relay: ")
        conn.close()
    finally:
        relay.stop()
        silent.close()
