"""Headless Chromium driven through its DevTools protocol over a pipe (`--remote-debugging-pipe`: JSON
messages separated by NUL bytes on file descriptors 3 and 4), standard library only: no websocket
client, no driver to pin. For the report's browser test (tests/test_report_browser.py).

    with Chromium(folder) as browser:
        page = browser.page(1400, 1000)
        page.open("file:///.../report.html")
        page.evaluate("document.title")
        page.screenshot(path)
        browser.errors  # what the pages logged as errors

Needs Debian's `chromium` (or another Chromium-based browser on PATH); unavailable() says what is missing.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

# Distribution names first: the test is meant for the packaged browser.
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserError(RuntimeError):
    """The browser did not answer, or answered with an error."""


def executable() -> str | None:
    return next((found for name in NAMES if (found := shutil.which(name))), None)


def unavailable() -> str | None:
    """Why no browser can be driven here, or None."""
    if executable() is None:
        return f"no Chromium on PATH (any of {', '.join(NAMES)}): apt-get install chromium"
    return None


class Chromium:
    def __init__(self, folder: Path, timeout: float = 30.0):
        self.folder, self.timeout = Path(folder), timeout
        self.errors: list[str] = []
        self._events: list[dict] = []
        self._buffer = b""
        self._next = 0

    def __enter__(self) -> Chromium:
        # Ours: write to the browser's fd 3, read from its fd 4.
        theirs_in, self._out = os.pipe()
        self._in, theirs_out = os.pipe()

        def descriptors():  # in the child, before exec: the two ends where Chromium looks for them
            # Through fresh copies: an end may already be 3 or 4, and dup2 onto itself would leave it
            # closed at exec.
            copies = os.dup(theirs_in), os.dup(theirs_out)
            os.dup2(copies[0], 3)
            os.dup2(copies[1], 4)

        flags = ["--headless", "--remote-debugging-pipe", f"--user-data-dir={self.folder / 'profile'}",
                 "--disable-gpu", "--no-first-run", "--no-default-browser-check", "--mute-audio",
                 # The test reads the table pages inside the report's frames: file:// pages are each
                 # their own origin otherwise, and a frame's document out of the report's reach.
                 "--allow-file-access-from-files"]
        if os.geteuid() == 0:  # Chromium refuses to run as root inside its sandbox (containers, CI)
            flags.append("--no-sandbox")
        log = (self.folder / "chromium.log").open("wb")
        self._process = subprocess.Popen([executable(), *flags, "about:blank"], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, preexec_fn=descriptors, close_fds=False)
        log.close()
        os.close(theirs_in)
        os.close(theirs_out)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        os.close(self._out)
        os.close(self._in)

    # -- the protocol ------------------------------------------------------------------------------------

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise BrowserError(f"no answer within {self.timeout} s; see {self.folder / 'chromium.log'}")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise BrowserError(f"the browser closed its pipe; see {self.folder / 'chromium.log'}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _event(self, message: dict) -> None:
        method, params = message["method"], message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            args = params["args"]
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(f"{params['entry']['text']} ({params['entry'].get('url', '')})")
        self._events.append(message)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._read(deadline)
            if "method" in answer:
                self._event(answer)
            elif answer.get("id") == self._next:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error'].get('message')}")
                return answer.get("result", {})

    def wait_event(self, method: str, session: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method and event.get("sessionId") == session:
                    return self._events.pop(i)
            answer = self._read(deadline)
            if "method" in answer:
                self._event(answer)

    def page(self, width: int, height: int) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        page = Page(self, session)
        page.resize(width, height)
        return page


class Page:
    def __init__(self, browser: Chromium, session: str):
        self.browser, self.session = browser, session

    def resize(self, width: int, height: int) -> None:
        self.browser.call("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, self.session)

    def open(self, url: str) -> None:
        self.browser._events.clear()
        answer = self.browser.call("Page.navigate", {"url": url}, self.session)
        if answer.get("errorText"):
            raise BrowserError(f"{url}: {answer['errorText']}")
        self.browser.wait_event("Page.loadEventFired", self.session)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression (awaited when it is a promise), as JSON gives it."""
        answer = self.browser.call("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": True}, self.session)
        if "exceptionDetails" in answer:
            details = answer["exceptionDetails"]
            raise BrowserError(details.get("exception", {}).get("description") or details.get("text"))
        return answer["result"].get("value")

    def until(self, expression: str, timeout: float = 10.0):
        """The first truthy value of `expression`, polled every 50 ms."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.05)

    def screenshot(self, path: Path) -> Path:
        data = self.browser.call("Page.captureScreenshot", {"format": "png"}, self.session)["data"]
        path.write_bytes(base64.b64decode(data))
        return path
