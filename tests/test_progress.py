"""What the long waits print: download progress on a terminal (and not in a pipe), once for
concurrent downloads; one line per start-up phase in a pipe, with its time; the formatting."""

from __future__ import annotations

import fcntl
import io
import os
import re
import select
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest

from rayflow.runtime import progress, ray_logs
from rayflow.runtime.transfer import Transfer, format_duration, format_rate, format_size, time_left

PREPARE = (
    "import sys; from rayflow.workloads.presets import cifar_data as data\n"
    "print(data.prepare(data.DataSpec(root=sys.argv[3], url=sys.argv[1], md5=sys.argv[2])))\n"
)
PROGRESS = re.compile(
    r"\[rayflow\] data: downloading cifar-10-python\.tar\.gz: [\d.]+ (B|kB) / [\d.]+ kB \(\d+%\), "
    r"[\d.]+ (B|kB|MB)/s, (\d+ s left|time left unknown)"
)
DOWNLOADED = re.compile(
    r"^\[rayflow\] data: downloaded cifar-10-python\.tar\.gz from http://127\.0\.0\.1:\d+/\S+ "
    r"\([\d.]+ kB at [\d.]+ (kB|MB)/s\), md5 ok, unpacked in \d+\.\d s$"
)
WAITING = "[rayflow] data: waiting for another process preparing the data under "


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakePipe(io.StringIO):
    def isatty(self) -> bool:
        return False


# --- formatting ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.0 kB"),
        (1536, "1.5 kB"),
        (999_950, "1.0 MB"),
        (170_498_071, "170.5 MB"),
        (2.5e9, "2.5 GB"),
        (3.2e15, "3200.0 TB"),
    ],
)
def test_sizes_are_decimal_with_one_digit(n, text):
    assert format_size(n) == text


def test_rates_and_time_left():
    assert format_rate(6_200_000) == "6.2 MB/s" and format_rate(512) == "512 B/s"
    assert [format_duration(s) for s in (0, 8.4, 59.6, 125, 3720)] == [
        "0 s",
        "8 s",
        "1 min 00 s",
        "2 min 05 s",
        "1 h 02 min",
    ]
    assert time_left(50, 100, 10.0) == 5.0
    assert (
        time_left(50, None, 10.0) is None
        and time_left(50, 100, 0.0) is None
        and time_left(150, 100, 1.0) is None
    )


def test_a_narrow_terminal_shortens_what_not_the_numbers():
    assert (
        progress._fit(
            "[rayflow] data: downloading a-long-name.tar.gz:", " 1.0 kB / 2.0 kB (50%)", 40
        )
        == "[rayflow] data: d… 1.0 kB / 2.0 kB (50%)"
    )
    assert progress._fit("short:", " 1 s", 40) == "short: 1 s"
    fitted = progress._fit("x" * 100, " 12 s left", 30)
    assert len(fitted) == 30 and fitted.endswith("… 12 s left")


# --- phases -------------------------------------------------------------------------------------


def test_a_phase_in_a_pipe_is_one_line_with_its_time():
    pipe = FakePipe()
    with progress.phase(
        "starting Spark (local-cluster[2, 1, 2048])",
        "spark",
        stream=pipe,
        tick_after_s=0,
        tick_every_s=0.01,
    ):
        time.sleep(0.1)
    with progress.phase("applying RayCluster default/x", "kuberay", stream=pipe) as step:
        step.done("applied RayCluster default/x")
    with (
        pytest.raises(RuntimeError),
        progress.phase("waiting for the dashboard", "vm", stream=pipe),
    ):
        raise RuntimeError("no")
    lines = pipe.getvalue().splitlines()
    assert "\r" not in pipe.getvalue() and len(lines) == 3
    assert re.fullmatch(
        r"\[rayflow\] spark: starting Spark \(local-cluster\[2, 1, 2048\]\)\.\.\. done in 0\.\d s",
        lines[0],
    )
    assert re.fullmatch(r"\[rayflow\] kuberay: applied RayCluster default/x in 0\.0 s", lines[1])
    assert re.fullmatch(
        r"\[rayflow\] vm: waiting for the dashboard\.\.\. failed after 0\.0 s", lines[2]
    )


def test_on_a_terminal_a_ticker_redraws_the_line_with_what_it_waits_on():
    terminal = FakeTerminal()
    before = threading.active_count()
    with progress.phase(
        "waiting for the head pod", "kuberay", stream=terminal, tick_after_s=0.1, tick_every_s=0.05
    ) as step:
        step.status(lambda: "Pending (ContainerCreating)")
        time.sleep(0.5)
        step.done("head pod x-head-1 ready")
    out = terminal.getvalue()
    assert threading.active_count() == before, "the ticker thread ends with its phase"
    redraws = out.split("\r\x1b[K")[1:]
    assert redraws[0] == "[rayflow] kuberay: waiting for the head pod..."  # shown at once
    assert any(
        re.fullmatch(
            r"\[rayflow\] kuberay: waiting for the head pod\.\.\. 0 s, Pending \(ContainerCreating\)",
            r,
        )
        for r in redraws
    )
    assert re.fullmatch(r"\[rayflow\] kuberay: head pod x-head-1 ready in 0\.\d s\n", redraws[-1])
    assert out.count("\n") == 1


def test_a_short_phase_on_a_terminal_does_not_tick():
    terminal = FakeTerminal()
    with progress.phase("connecting", "spark", stream=terminal):
        pass
    assert terminal.getvalue().count("\r") == 2  # the opening line and the end line only


def test_transfer_shows_bytes_rate_and_time_left_on_a_terminal():
    terminal = FakeTerminal()
    with Transfer("downloading cifar-10-python.tar.gz", "data", stream=terminal) as bar:
        bar.expect(400_000)
        for _ in range(8):
            time.sleep(0.05)
            bar.update(50_000)
        bar.finished()
    out = terminal.getvalue()
    assert re.search(
        r"downloading cifar-10-python\.tar\.gz: 50\.0 kB / 400\.0 kB \(12%\), [\d.]+ (kB|MB)/s, \d+ s left",
        out,
    )
    assert re.search(
        r"\r\x1b\[K\[rayflow\] data: downloading cifar-10-python\.tar\.gz: 400\.0 kB at [\d.]+ (kB|MB)/s, done in 0\.\d s\n$",
        out,
    )


def test_transfer_without_a_length_shows_bytes_and_rate():
    terminal = FakeTerminal()
    with Transfer("downloading x", "data", stream=terminal) as bar:
        bar.expect(None)
        time.sleep(0.05)
        bar.update(2_000_000)
    assert re.search(r"downloading x: 2\.0 MB, [\d.]+ MB/s, 0 s", terminal.getvalue())
    assert "left" not in terminal.getvalue()


def test_a_transfer_that_fails_says_how_far_it_got():
    pipe = FakePipe()
    with pytest.raises(OSError), Transfer("downloading x", "data", stream=pipe) as bar:
        bar.update(1500)
        raise OSError("reset")
    assert re.fullmatch(
        r"\[rayflow\] data: downloading x\.\.\. failed after 0\.0 s \(1\.5 kB received\)\n",
        pipe.getvalue(),
    )


# --- the CIFAR-10 download, on a terminal and in a pipe -------------------------------------------


def _pty() -> tuple[int, int]:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    return master, slave


def _read_all(masters: list[int], procs: list[subprocess.Popen], timeout: float = 120) -> list[str]:
    """Everything written to each pty until its process ends (EIO on Linux once the slave closes)."""
    out = dict.fromkeys(masters, b"")
    open_ = set(masters)
    deadline = time.monotonic() + timeout
    while open_ and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_), [], [], 0.5)
        for m in ready:
            try:
                chunk = os.read(m, 65536)
            except OSError:
                chunk = b""
            if chunk:
                out[m] += chunk
            else:
                open_.discard(m)
    for p in procs:
        p.wait(timeout=max(1.0, deadline - time.monotonic()))
    for m in masters:
        os.close(m)
    return [out[m].decode(errors="replace").replace("\r\n", "\n") for m in masters]


def _start(url: str, md5: str, root, stderr) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PREPARE, url, md5, str(root)],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def test_the_download_shows_its_progress_on_a_terminal(tmp_path, archive_server):
    url, md5, hits = archive_server
    master, slave = _pty()
    proc = _start(url + "?bytes_per_s=100000", md5, tmp_path, slave)
    os.close(slave)
    [out] = _read_all([master], [proc])
    assert proc.returncode == 0, out
    assert len(hits) == 1
    redraws = out.split("\r\x1b[K")
    # redrawn in place as bytes arrive
    assert len([r for r in redraws if PROGRESS.fullmatch(r)]) >= 3, out
    lines = [line for line in out.split("\n") if line]
    assert len(lines) == 1 and DOWNLOADED.fullmatch(lines[0].split("\r\x1b[K")[-1]), out


def test_the_download_in_a_pipe_is_one_line_without_redraws(tmp_path, archive_server):
    url, md5, _ = archive_server
    proc = _start(url + "?bytes_per_s=100000", md5, tmp_path, subprocess.PIPE)
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 0, err
    assert "\r" not in err and "\x1b" not in err
    assert len(err.splitlines()) == 1 and DOWNLOADED.fullmatch(err.splitlines()[0]), err


def test_concurrent_downloads_show_the_progress_once(tmp_path, archive_server):
    """Four processes, each on a terminal of its own: one downloads and shows progress, the
    others say at most once that they wait for it."""
    url, md5, hits = archive_server
    ptys = [_pty() for _ in range(4)]
    procs = [_start(url + "?bytes_per_s=100000", md5, tmp_path, slave) for _, slave in ptys]
    for _, slave in ptys:
        os.close(slave)
    outputs = _read_all([master for master, _ in ptys], procs)
    assert all(p.returncode == 0 for p in procs), outputs
    assert len(hits) == 1
    fetched = [out for out in outputs if "downloading cifar-10" in out]
    assert len(fetched) == 1, outputs
    assert PROGRESS.search(fetched[0]) and DOWNLOADED.search(
        fetched[0].split("\r\x1b[K")[-1].strip()
    )
    for out in outputs:
        if out is not fetched[0]:
            assert "\r" not in out and len(out.splitlines()) <= 1, out
            assert not out or out.startswith(WAITING), out


def test_the_download_without_a_length_still_shows_bytes_and_rate(tmp_path, archive_server):
    url, md5, _ = archive_server
    master, slave = _pty()
    proc = _start(url + "?bytes_per_s=100000&length=0", md5, tmp_path, slave)
    os.close(slave)
    [out] = _read_all([master], [proc])
    assert proc.returncode == 0, out
    assert re.search(
        r"downloading cifar-10-python\.tar\.gz: [\d.]+ kB, [\d.]+ (kB|MB)/s, \d+ s", out
    ), out
    assert "left" not in out


# --- a backend's start-up phases (starts Ray: run under `flock /tmp/ray-tests.lock`) ----------------

START_LOCAL = (
    "from rayflow.backends import backend_for; from rayflow.orchestrator.compose import compose_config\n"
    "from rayflow.orchestrator.cluster import running\n"
    "with running(backend_for(compose_config('backend=local', 'backend.num_cpus=1'))) as handle:\n"
    "    print(handle.address)\n"
)


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_local_start_up_prints_its_phase_with_its_time(rayflow, terminal):
    if terminal:
        master, slave = _pty()
        proc = subprocess.Popen(
            [sys.executable, "-c", START_LOCAL],
            stdout=subprocess.DEVNULL,
            stderr=slave,
            cwd=rayflow.workdir,
        )
        os.close(slave)
        [err] = _read_all([master], [proc], timeout=180)
    else:
        proc = subprocess.Popen(
            [sys.executable, "-c", START_LOCAL],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=rayflow.workdir,
        )
        err = proc.communicate(timeout=180)[1].decode()
    assert proc.returncode == 0, err[-3000:]
    phase = r"\[rayflow\] local: starting Ray on this machine \(ray\.init, num_cpus=1\)\.\.\."
    if terminal:
        assert re.search(r"\r\x1b\[K" + phase + r" done in \d+\.\d s\n", err), err[-3000:]
    else:
        ours = [line for line in err.splitlines() if "[rayflow]" in line]
        assert "\r" not in err and len(ours) == 1, err[-3000:]
        assert re.fullmatch(phase + r" done in \d+\.\d s", ours[0]), ours


def test_off_a_terminal_a_job_prints_no_colour_codes(capsys):
    """What Ray prints uncoloured nowhere near a terminal: its log records (the dashboard URL, a
    trial's traceback) and the "[repeated Nx across cluster]" of deduplicated worker logs."""
    import logging

    ray_log = logging.getLogger("ray")
    handler = logging.StreamHandler(io.StringIO())
    ray_log.addHandler(handler)
    try:
        with ray_logs.plain_ray_logs(io.StringIO()):
            print("(train_cifar pid=1) saved\x1b[32m [repeated 5x across cluster]\x1b[0m")
            print("\x1b[36mray::ImplicitFunc.train()\x1b[39m failed", file=sys.stderr)
            ray_log.warning(
                "View the dashboard at %s%s%s",
                "\x1b[1m\x1b[32m",
                "http://127.0.0.1:8265",
                "\x1b[39m\x1b[22m",
            )
            try:
                raise ValueError("\x1b[36mray::Task\x1b[39m boom")
            except ValueError:
                ray_log.exception("trial failed")
        print("\x1b[32mafter the job\x1b[0m")  # the streams are the caller's again
    finally:
        ray_log.removeHandler(handler)
    out, err = capsys.readouterr()
    logged = handler.stream.getvalue()
    assert "[repeated 5x across cluster]" in out and "ray::ImplicitFunc.train() failed" in err
    assert "http://127.0.0.1:8265" in logged and "ray::Task boom" in logged
    *during, after = out.splitlines()
    assert "\x1b[" not in "\n".join(during) + err + logged
    assert after == "\x1b[32mafter the job\x1b[0m"
