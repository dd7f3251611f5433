"""A real ``baton ui`` process over the test Redis and S3, and a real headless Chromium (Debian's
``chromium`` through its ``chromedriver``, both installed by scripts/test.sh) driving its pages.
Screenshots go to ``test-artifacts/dashboard/`` (BATON_TEST_ARTIFACTS to change)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.helpers import REPO, start_baton, wait_for  # noqa: F401 - the dashboard's tests import it from here

TOKEN = "dashboard-test-token-7f3a9c"
ARTIFACTS = Path(os.environ.get("BATON_TEST_ARTIFACTS", REPO / "test-artifacts")) / "dashboard"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Dashboard:
    url: str
    proc: subprocess.Popen
    log: Path

    def call(self, method: str, path: str, body: Any = None, token: Optional[str] = None,
             headers: Optional[dict] = None, data: Optional[bytes] = None) -> tuple[int, Any]:
        """(status, JSON body) of one request, as any HTTP client (a stranger) would send it (``data``: these
        bytes as the body instead of ``body``'s JSON)."""
        data = data if data is not None else None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json", **(headers or {})})
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw[:1] in (b"{", b"[") else raw
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw[:1] in (b"{", b"[") else raw

    def get(self, path: str) -> Any:
        status, body = self.call("GET", path)
        assert status == 200, (path, status, body)
        return body


def start_dashboard(env: dict, log: Path, token: Optional[str] = TOKEN, *extra: str) -> Dashboard:
    """``baton ui`` on a free port; another port if a neighbour takes that one before the dashboard binds it."""
    env = dict(env)
    env.pop("BATON_UI_TOKEN", None)
    if token:
        env["BATON_UI_TOKEN"] = token
    return _start("ui", env, log, extra)


def start_server(env: dict, log: Path, *extra: str) -> Dashboard:
    """``baton server`` (the pool's: every request names its user by a token) on a free port."""
    return _start("server", env, log, extra)


def _start(command: str, env: dict, log: Path, extra: tuple[str, ...]) -> Dashboard:
    for _ in range(5):
        board = _try_dashboard(command, env, log, extra)
        if board is not None:
            return board
    raise AssertionError(f"baton {command} found no free port in 5 tries: {log.read_text()}")


def _try_dashboard(command: str, env: dict, log: Path, extra: tuple[str, ...]) -> Optional[Dashboard]:
    port = free_port()
    proc = start_baton(command, "--port", str(port), "--history-every-s", "0.5", *extra, env=env, log=log)
    board = Dashboard(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if proc.returncode == 2 and "Address already in use" in log.read_text():
                return None
            raise AssertionError(f"baton {command} exited with {proc.returncode}: {log.read_text()}")
        try:
            board.get("/api/health")
            return board
        except (urllib.error.URLError, ConnectionError, AssertionError):
            time.sleep(0.1)
    raise AssertionError(f"baton {command} did not answer: {log.read_text()}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def dashboard(cluster):
    board = start_dashboard(cluster.env, cluster.log_dir / "ui.log")
    yield board
    stop(board.proc)


@pytest.fixture(scope="session")
def browser_binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("the dashboard's tests need Debian's chromium and chromium-driver: scripts/test.sh installs them")
    return chromium, driver


@pytest.fixture
def browser(browser_binaries):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = browser_binaries
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1400,1500", "--disable-extensions", "--no-first-run"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    yield chrome
    chrome.quit()


def screenshot(browser, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    browser.save_screenshot(str(path))
    return path
