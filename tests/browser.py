"""Headless Chromium driven over its DevTools protocol on a pipe (standard library only): open a
local page, wait for it to load, and return what a reader's browser did with it.

    page = open_page(Path("reports/demo/index.html"))   # errors, dialogs, requests, images, text
    python tests/browser.py reports/demo/index.html docs/img/demo_report.png   # a screenshot

Chromium (`make browser-deps`: Debian's package) reads protocol messages, each a JSON object
ended by a NUL byte, on its file descriptor 3 and writes replies and events on 4.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--remote-debugging-pipe",
    "--no-sandbox",  # root in a container has no user namespace for the sandbox
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # no host name resolves: nothing leaves the machine
]
# What the page tells about itself once loaded: every image's source (shortened), whether it
# finished loading, its natural width and alt text, where it lies and whether inside a
# <details>; where the question, each table and each <details> lie (CSS pixels from the page's
# top: `box`; a closed <details>' content has none), and the text a reader sees.
INSPECT = """(() => {
  const box = e => { const r = e.getBoundingClientRect();
                     return {top: r.top + scrollY, bottom: r.bottom + scrollY}; };
  const question = document.querySelector('.question');
  return JSON.stringify({
    images: [...document.images].map(i => ({src: i.src.slice(0, 80), complete: i.complete,
      width: i.naturalWidth, alt: i.alt, in_details: i.closest('details') !== null, ...box(i)})),
    tables: [...document.querySelectorAll('table')].map(t => ({header: t.rows[0].innerText,
      in_details: t.closest('details') !== null, ...box(t)})),
    details: [...document.querySelectorAll('details')].map(d => ({
      summary: d.querySelector('summary').innerText, ...box(d)})),
    question: question && {text: question.innerText, ...box(question)},
    text: document.body.innerText,
  });
})()"""


@dataclass
class Page:
    """What Chromium did with a page: console errors and uncaught exceptions (`errors`), the
    messages of JavaScript dialogs it opened (`dialogs`), every URL it requested (`requests`,
    their first 100 characters), its images ({src, complete, width, alt, in_details, top,
    bottom}), tables ({header, in_details, top, bottom}), <details> ({summary, top, bottom}),
    its question ({text, top, bottom}; None without), its visible text (not a closed
    <details>' content) and a PNG screenshot of the window."""

    errors: list[str]
    dialogs: list[str]
    requests: list[str]
    images: list[dict]
    tables: list[dict]
    details: list[dict]
    question: dict | None
    text: str
    png: bytes


class DevTools:
    """One Chromium process and its protocol pipe; `call` sends a command and returns its
    result, keeping the events that arrive meanwhile in `events`."""

    def __init__(self, profile: Path, timeout: float):
        if CHROMIUM is None:
            raise FileNotFoundError("no chromium on PATH (make browser-deps installs it)")
        to_browser, self._to_browser = os.pipe()
        self._from_browser, from_browser = os.pipe()

        def onto_3_and_4() -> None:  # in the child: its ends of the pipes as fds 3 and 4
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser, from_browser)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(3, 4),  # kept open once onto_3_and_4 has put the pipes there
            preexec_fn=onto_3_and_4,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        self.timeout = timeout
        self.events: list[dict] = []
        self._buffer = b""
        self._next_id = 0

    def send(self, method: str, session: str | None = None, **params) -> int:
        """Write one command; its id."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def call(self, method: str, session: str | None = None, **params) -> dict:
        """Send a command and wait for its result (RuntimeError if Chromium refuses it)."""
        wanted = self.send(method, session, **params)
        while True:
            message = self._receive()
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def wait_for(self, method: str) -> dict:
        """The parameters of the first event named `method` (kept ones first)."""
        for event in self.events:
            if event["method"] == method:
                return event["params"]
        while True:
            message = self._receive()
            if message.get("method") == method:
                return message["params"]

    def _receive(self) -> dict:
        """The next message; an event is kept in `events` (a JavaScript dialog is recorded,
        then dismissed, so that the page goes on)."""
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError(f"chromium sent nothing for {self.timeout} s")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed its pipe (exit {self.process.poll()})")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        message = json.loads(raw)
        if "method" in message:
            self.events.append(message)
            if message["method"] == "Page.javascriptDialogOpening":
                self.send("Page.handleJavaScriptDialog", message.get("sessionId"), accept=True)
        return message

    def close(self) -> None:
        try:
            self.send("Browser.close")
            self.process.wait(timeout=self.timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)


def open_page(path: Path, width: int = 1100, height: int = 1300, timeout: float = 60) -> Page:
    """Load the local file `path` in a fresh headless Chromium (a `width` x `height` window)
    and inspect it; the screenshot shows that window."""
    with tempfile.TemporaryDirectory() as profile:
        browser = DevTools(Path(profile), timeout)
        try:
            target = browser.call("Target.createTarget", url="about:blank")["targetId"]
            session = browser.call("Target.attachToTarget", targetId=target, flatten=True)
            session = session["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                browser.call(f"{domain}.enable", session)
            browser.call("Emulation.setDeviceMetricsOverride", session, width=width,
                         height=height, deviceScaleFactor=1, mobile=False)  # fmt: skip
            browser.call("Page.navigate", session, url=path.resolve().as_uri())
            browser.wait_for("Page.loadEventFired")
            found = browser.call("Runtime.evaluate", session, expression=INSPECT)
            shown = json.loads(found["result"]["value"])
            png = browser.call("Page.captureScreenshot", session, format="png")["data"]
        finally:
            browser.close()
    return Page(
        errors=_errors(browser.events),
        dialogs=[p["message"] for p in _params(browser.events, "Page.javascriptDialogOpening")],
        requests=[
            p["request"]["url"][:100] for p in _params(browser.events, "Network.requestWillBeSent")
        ],
        images=shown["images"],
        tables=shown["tables"],
        details=shown["details"],
        question=shown["question"],
        text=shown["text"],
        png=base64.b64decode(png),
    )


def _params(events: list[dict], method: str) -> list[dict]:
    """The parameters of the events named `method`, in order."""
    return [e["params"] for e in events if e["method"] == method]


def _errors(events: list[dict]) -> list[str]:
    """Console errors, uncaught exceptions and error log entries (a resource that failed to
    load, a blocked request), as text."""
    found = []
    for event in events:
        method, params = event["method"], event["params"]
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            found.append(
                " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
            )
        elif method == "Runtime.exceptionThrown":
            found.append(params["exceptionDetails"].get("text", "exception"))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            found.append(f"{params['entry']['text']} {params['entry'].get('url', '')}")
    return found


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python tests/browser.py PAGE.html SCREENSHOT.png")
    page = open_page(Path(sys.argv[1]))
    if page.errors or page.dialogs:
        sys.exit(f"{sys.argv[1]}: errors {page.errors}, dialogs {page.dialogs}")
    Path(sys.argv[2]).write_bytes(page.png)
    print(f"{sys.argv[2]}: {len(page.png):,} bytes, {len(page.images)} images loaded")
