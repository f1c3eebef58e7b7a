"""Screenshots of the report and of the MLflow runs table for docs/, in headless Chromium.

    python scripts/screenshots.py        # after `dvc repro`; writes docs/img/*.png

Needs the Debian `chromium` package (apt-get install -y chromium) or CHROMIUM=<binary>.
Drives Chromium over its DevTools protocol (the `websockets` package, installed with
Prefect) so that each shot waits until the page shows what it must show:
- docs/img/report_summary.png: reports/report.html from the top (title, the revision /
  date / experiment / params line, the summary, the score table);
- docs/img/report_claims.png: the claims table;
- docs/img/mlflow_studies.png, docs/img/mlflow_evaluate.png: the MLflow runs table in its
  saved views "studies" and "evaluate", from a temporary `mlflow ui` on ./mlflow.db (to
  which the committed study is added first if missing: margrpo.tracking.rebuild).
"""
from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]
WAIT_S = 120  # a loaded 2-core machine renders MLflow's UI slowly


def chromium() -> str:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    sys.exit("screenshots: no Chromium found; apt-get install -y chromium, or set CHROMIUM=<path>")


class Browser:
    """One headless Chromium page driven over the DevTools protocol."""

    def __init__(self):
        from websockets.sync.client import connect

        self.profile = tempfile.mkdtemp(prefix="shots-")
        self.proc = subprocess.Popen([chromium(), *FLAGS, f"--user-data-dir={self.profile}",
                                      "--remote-debugging-port=0", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.time() + WAIT_S
        while not port_file.exists() or not port_file.read_text().strip():
            if time.time() > deadline:
                self.close()
                sys.exit("screenshots: Chromium did not open its DevTools port")
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
        url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
        self.ws = connect(url, max_size=None, open_timeout=WAIT_S)
        self.ids = itertools.count(1)

    def call(self, method: str, **params):
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=WAIT_S))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def shoot(self, url: str, out: Path, size: tuple[int, int], ready_text: str, scroll_to: str | None = None,
              close: tuple[str, ...] = ()) -> None:
        """Load url, wait until the page's text contains ready_text, click the buttons whose
        aria-label is in `close` (side panels, banners), optionally scroll the element with
        id scroll_to to the top, and save a PNG of the viewport."""
        self.call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                  mobile=False)
        self.call("Page.navigate", url=url)
        check = f"document.body !== null && document.body.innerText.includes({json.dumps(ready_text)})"
        deadline = time.time() + WAIT_S
        while not self.call("Runtime.evaluate", expression=check, returnByValue=True)["result"].get("value"):
            if time.time() > deadline:
                sys.exit(f"screenshots: {url} did not show {ready_text!r} within {WAIT_S} s")
            time.sleep(0.5)
        for label in close:
            self.call("Runtime.evaluate", expression=f"document.querySelector('button[aria-label={json.dumps(label)}]')?.click()")
        if scroll_to:
            self.call("Runtime.evaluate", expression=f"document.getElementById({json.dumps(scroll_to)}).scrollIntoView()")
        time.sleep(2)  # let late cells and fonts settle
        data = self.call("Page.captureScreenshot", format="png")["data"]
        out.write_bytes(base64.b64decode(data))
        print(f"screenshots: {out.relative_to(ROOT)}")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_mlflow(uri: str, port: int) -> subprocess.Popen:
    mlflow = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen([str(mlflow), "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(1)
    proc.terminate()
    sys.exit(f"screenshots: mlflow ui did not start within {WAIT_S} s")


def main() -> None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    from margrpo.tracking.rebuild import prepare_store

    OUT.mkdir(parents=True, exist_ok=True)
    uri, exp_id = prepare_store(ROOT)
    server = serve_mlflow(uri, free_port())
    browser = Browser()
    try:
        report = (ROOT / "reports" / "report.html").as_uri()
        browser.shoot(report, OUT / "report_summary.png", (1280, 1400), "Summary")
        browser.shoot(report, OUT / "report_claims.png", (1280, 1000), "Claims of the paper", scroll_to="claims")
        port = server.args[server.args.index("--port") + 1]
        runs = f"http://127.0.0.1:{port}/#/experiments/{exp_id}/runs?viewStateShareKey="
        # the assistant panel, the "shared view" banner, the navigation sidebar
        panels = ("Close", "Hide banner", "Toggle sidebar")
        browser.shoot(runs + "studies", OUT / "mlflow_studies.png", (1700, 520), "overall/base", close=panels)
        browser.shoot(runs + "evaluate", OUT / "mlflow_evaluate.png", (1700, 520), "eval/geneval/overall", close=panels)
    finally:
        browser.close()
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
