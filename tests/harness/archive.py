"""A CIFAR-format archive served over loopback HTTP, for the download path (tests/test_data.py,
tests/test_progress.py)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import tarfile
import threading
import time
import urllib.parse
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def cifar_archive(folder: Path) -> bytes:
    """A tiny archive laid out like the official cifar-10-python.tar.gz."""
    from rayflow.workloads.presets import cifar_data as data

    data.write_synthetic(folder / "src" / data.BATCH_DIR, 50, 10, seed=1)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder / "src" / data.BATCH_DIR, arcname=data.BATCH_DIR)
    return buffer.getvalue()


@contextlib.contextmanager
def archive_server(tmp_path: Path):
    """A loopback HTTP server holding a CIFAR-format archive; counts the downloads.
    `?bytes_per_s=N` sends it at about N bytes a second (a download that lasts), and
    `&length=0` without a Content-Length (the total unknown to the client)."""
    served = tmp_path / "served"
    served.mkdir()
    payload = cifar_archive(tmp_path)
    (served / "cifar-10-python.tar.gz").write_bytes(payload)
    hits = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            if "bytes_per_s" not in query:
                return super().do_GET()
            rate = float(query["bytes_per_s"][0])
            self.send_response(200)
            self.send_header("Content-Type", "application/gzip")
            if query.get("length", ["1"])[0] != "0":
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            chunk = 8192
            for start in range(0, len(payload), chunk):
                self.wfile.write(payload[start : start + chunk])
                self.wfile.flush()
                time.sleep(chunk / rate)
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/cifar-10-python.tar.gz"
    try:
        yield url, hashlib.md5(payload).hexdigest(), hits
    finally:
        server.shutdown()
