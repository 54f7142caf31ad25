"""Headless Chromium driven over the Chrome DevTools Protocol through a pipe
(--remote-debugging-pipe): no driver binary, no extra Python package, no network.
Used by the browser test and by scripts/regenerate_examples.py (full-page and panel
screenshots).
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
from typing import Any

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars"]


def chromium_path() -> str | None:
    """$CHARACTERIZE_CHROMIUM, else Debian's /usr/bin/chromium, else chromium on PATH."""
    env = os.environ.get("CHARACTERIZE_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """Headless Chromium over the DevTools Protocol on fds 3 (commands in) and 4 (replies out);
    messages are JSON terminated by NUL."""

    def __init__(self, executable: str, user_data_dir: Path, timeout: float = 60.0):
        self.timeout = timeout
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def child_fds() -> None:  # runs in the child: put the pipe ends on fds 3 and 4
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        argv = [executable, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", "--remote-debugging-pipe",
                "about:blank"]
        self.proc = subprocess.Popen(argv, preexec_fn=child_fds, close_fds=False, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    # -------------------------------------------------------------- protocol
    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from Chromium over the DevTools pipe")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"Chromium closed the DevTools pipe: {self.stderr_tail()}")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, session: str | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        for i, ev in enumerate(self.events):
            if ev.get("method") == method and (session is None or ev.get("sessionId") == session):
                return self.events.pop(i)
        while True:
            ev = self._read_message(deadline)
            if ev.get("method") == method and (session is None or ev.get("sessionId") == session):
                return ev
            self.events.append(ev)

    def stderr_tail(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return (self.proc.stderr.read() or b"").decode(errors="replace")[-2000:]

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.stderr:
            self.proc.stderr.close()

    # ---------------------------------------------------------------- a page
    def open_page(self, url: str, width: int = 1280, height: int = 900) -> str:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=session)
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_for("Page.loadEventFired", session)
        return session

    def evaluate(self, session: str, expression: str) -> Any:
        r = self.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True},
                      session=session)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page script failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, session: str, path: Path, max_height: int = 16000) -> Path:
        size = self.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], max_height), "scale": 1}
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip},
                         session=session)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions, error log entries and requests leaving the page."""
        out = []
        for ev in self.events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
            elif m == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append("log: " + p["entry"].get("text", ""))
            elif m == "Network.requestWillBeSent":
                url = p.get("request", {}).get("url", "")
                if not url.startswith(("data:", "file:", "about:")):
                    out.append("request: " + url)
            elif m == "Network.loadingFailed":
                out.append("failed load: " + p.get("errorText", ""))
        return out

    def clip_of(self, session: str, selector: str) -> dict[str, float] | None:
        """The page rectangle of the first element matching `selector` (None when absent)."""
        r = self.evaluate(session, "(() => { const e = document.querySelector(" + json.dumps(selector) + ");"
                                   " if (!e) return null; e.querySelectorAll('details').forEach(d => d.open = false);"
                                   " const b = e.getBoundingClientRect();"
                                   " return {x: b.left + window.scrollX, y: b.top + window.scrollY,"
                                   " width: b.width, height: b.height}; })()")
        return r

    def element_screenshot(self, session: str, selector: str, path: Path, max_height: int = 6000) -> Path | None:
        """A PNG of one element (a panel), or None when the page has no such element."""
        clip = self.clip_of(session, selector)
        if not clip or clip["width"] <= 0 or clip["height"] <= 0:
            return None
        clip = {**clip, "height": min(clip["height"], max_height), "scale": 1}
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip},
                         session=session)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


# Per figure: decoded size and the variance of pixel brightness drawn back through a canvas
# (every 7th pixel); the document's text; elements that hostile names could have produced.
CHECK_PAGE = """
(async () => {
  const imgs = [...document.images];
  await Promise.all(imgs.map(i => i.decode().catch(() => null)));
  const figures = imgs.map(img => {
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    const ctx = c.getContext('2d');
    if (!c.width || !c.height) return {src: img.src.slice(0, 30), complete: img.complete, w: 0, h: 0, variance: 0};
    ctx.drawImage(img, 0, 0);
    const d = ctx.getImageData(0, 0, c.width, c.height).data;
    let n = 0, s = 0, s2 = 0, dark = 0;
    for (let i = 0; i < d.length; i += 4 * 7) {
      const v = (d[i] + d[i + 1] + d[i + 2]) / 3;
      n++; s += v; s2 += v * v; if (v < 128) dark++;
    }
    const mean = s / n;
    return {src: img.src.slice(0, 30), complete: img.complete, w: img.naturalWidth, h: img.naturalHeight,
            variance: s2 / n - mean * mean, dark: dark / n,
            shown: img.getBoundingClientRect().width > 0 || img.closest('details:not([open])') !== null};
  });
  const stats = new Map(imgs.map((img, i) => [img, figures[i]]));
  const panels = [...document.querySelectorAll('div.panel')].map(p => ({
    id: p.id, missing: p.classList.contains('is-missing'), error: p.classList.contains('is-error'),
    figures: [...p.querySelectorAll('img')].map(i => stats.get(i)),
    tables: p.querySelectorAll('table').length, text: p.innerText.length,
  }));
  return {
    figures, panels,
    figureElements: document.querySelectorAll('figure').length,
    svgs: document.querySelectorAll('svg').length,
    scripts: document.querySelectorAll('script').length,
    text: document.body.innerText,
    kernelCells: [...document.querySelectorAll('td.kname')].map(td => td.textContent),
    strayElements: document.querySelectorAll('k, float, long, script, iframe, object, embed').length,
    title: document.title,
    viewport: {width: window.innerWidth, height: window.innerHeight},
    answers: [...document.querySelectorAll('section.answer')].map(e => {
      const b = e.getBoundingClientRect();
      return {id: e.id, top: b.top + window.scrollY, bottom: b.bottom + window.scrollY, text: e.innerText};
    }),
    pageHeight: document.documentElement.scrollHeight,
  };
})()
"""
