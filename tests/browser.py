"""Headless Chromium for the page tests (the server's page, the attention view): one-shot runs
(--dump-dom, --screenshot) and, for what must be waited on in real time (a streamed answer) or
watched (the requests a page makes), the DevTools protocol over --remote-debugging-pipe (JSON
messages separated by NUL bytes on file descriptors 3 and 4; no websocket needed)."""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def run_once(profile: Path, url: str, *options: str) -> str:
    """Chromium on `url` with `options` (--dump-dom, --screenshot=...); its stdout."""
    run = subprocess.run([str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *options, url],
                         capture_output=True, text=True, timeout=90, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def _high(*fds: int) -> tuple:
    """The descriptors moved to 10 and above, clear of 3 and 4, which the shell below rewires (bash:
    dash takes one-digit descriptors only)."""
    moved = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in fds)
    for fd in fds:
        os.close(fd)
    return moved


class Pipe:
    """A Chromium process driven over the DevTools pipe; use as a context manager."""

    def __init__(self, profile: Path) -> None:
        to_r, self._to = _high(*os.pipe())
        self._from, from_w = _high(*os.pipe())
        script = f'exec "$@" 3<&{to_r} 4>&{from_w}'  # the protocol's descriptors must be 3 and 4
        self.proc = subprocess.Popen(["/bin/bash", "-c", script, "bash", str(CHROMIUM), *FLAGS,
                                      f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
                                     pass_fds=(to_r, from_w), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_r)
        os.close(from_w)
        self._buffer, self._id, self.session = b"", 0, None
        self.events = []  # every event the browser sent (Network.requestWillBeSent, ...), in order

    def call(self, method: str, params: dict | None = None) -> dict:
        """Send one command (to the attached page, once there is one); its reply."""
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self._to, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._from, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                return reply
            if "method" in reply:
                self.events.append(reply)

    def open(self, url: str) -> None:
        """Open `url` in a new page and attach to it."""
        target = self.call("Target.createTarget", {"url": url})["result"]["targetId"]
        reply = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
        self.session = reply["result"]["sessionId"]

    def wait_for(self, expression: str, seconds: float = 30.0):
        """The value of a JavaScript expression, once it is truthy (polled every 50 ms)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            reply = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
            value = reply.get("result", {}).get("result", {}).get("value")
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"{expression} stayed false for {seconds} s")

    def __enter__(self) -> Pipe:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.call("Browser.close")
        except (OSError, RuntimeError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        os.close(self._to)
        os.close(self._from)
