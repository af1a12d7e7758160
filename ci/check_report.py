#!/usr/bin/env python3
"""Check a generated Allure report in a real browser (headless Chromium):

    ci/check_report.py REPORT_DIR SCREENSHOT_DIR

Serves REPORT_DIR on 127.0.0.1 (Allure's single-page app needs http, not file://), then
with ``chromium --headless --dump-dom --virtual-time-budget``:

1. the overview page lists every experiment of the report (its test cases' names, read
   from ``data/test-cases/*.json``; beyond the overview widget's ten, the Suites page);
2. each test page (the first five) shows its name and its timeline plot: the
   ``timeline plot`` attachment is listed, served as a real PNG, and, opened in the page
   (:data:`OPEN_PLOT_JS`, as a reader's click would), renders as an image of a sane size;

and saves screenshots (``--screenshot``) of the overview and of each checked test page
into SCREENSHOT_DIR. Exit 0 when every check passes, 1 on a failed check (one line each,
``check_report: FAIL: ...``), 2 on bad input or a missing browser (one line).
Standard library only. The browser: ``$CHROMIUM``, else ``chromium`` (Debian's),
``chromium-browser`` or ``google-chrome`` on PATH.
"""

from __future__ import annotations

import argparse
import functools
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.request import urlopen

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOT_ATTACHMENT = "timeline plot"
MAX_TEST_PAGES = 5
OVERVIEW_WIDGET_ITEMS = 10
BROWSER_TIMEOUT_S = 120


class BadInput(Exception):
    """Bad input: one line, exit 2."""


def find_browser() -> str:
    """The Chromium binary (module doc). Raises BadInput when there is none."""
    env = os.environ.get("CHROMIUM")
    if env:
        if shutil.which(env):
            return shutil.which(env)
        raise BadInput(f"$CHROMIUM={env} is not an executable browser")
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise BadInput("headless Chromium is missing (apt-get install -y chromium, or set CHROMIUM=/path/to/chrome)")


def test_cases(report_dir: Path) -> list[dict]:
    """``[{"uid", "name", "plot": attachment source or None}]`` of the report's test cases."""
    d = report_dir / "data" / "test-cases"
    if not (report_dir / "index.html").is_file() or not d.is_dir():
        raise BadInput(f"{report_dir} is not a generated Allure report (index.html or data/test-cases/ missing)")
    out = []
    for f in sorted(d.glob("*.json")):
        case = json.loads(f.read_text(encoding="utf-8"))
        plots = []

        def walk(stage: dict) -> None:
            plots.extend(a["source"] for a in stage.get("attachments") or [] if a.get("name") == PLOT_ATTACHMENT)
            for step in stage.get("steps") or []:
                walk(step)

        walk(case.get("testStage") or {})
        out.append({"uid": case["uid"], "name": case["name"], "plot": plots[0] if plots else None})
    if not out:
        raise BadInput(f"{report_dir}: the report has no test cases")
    return out


#: Added to a copy of index.html served as ``/check.html`` (the report on disk is not
#: changed): once the test page is drawn, it opens the timeline plot's attachment row
#: (Allure shows attachments collapsed), waits for the image to load and writes its
#: natural size into ``<html data-specchaos-plot="WxH">`` ("none" when it never loads),
#: for ``--dump-dom`` to read; the screenshot then shows the plot.
OPEN_PLOT_JS = """<script>(function () {
  var tries = 0;
  function rowOfPlot() {
    var rows = document.querySelectorAll('.attachment-row');
    for (var i = 0; i < rows.length; i++) {
      var name = rows[i].querySelector('.attachment-row__name');
      if (name && name.textContent.trim() === '%s') return rows[i];
    }
    return null;
  }
  function step() {
    tries++;
    var row = rowOfPlot();
    if (row && !row.getAttribute('data-specchaos-opened')) {
      row.setAttribute('data-specchaos-opened', '1');
      (row.querySelector('.attachment-row__arrow') || row).click();
    }
    var img = row && document.querySelector('.attachment__' + row.getAttribute('data-uid') + ' img');
    if (img && img.complete && img.naturalWidth > 0) {
      document.documentElement.setAttribute('data-specchaos-plot', img.naturalWidth + 'x' + img.naturalHeight);
      row.scrollIntoView();
      return;
    }
    if (tries < 150) setTimeout(step, 100);
    else document.documentElement.setAttribute('data-specchaos-plot', 'none');
  }
  window.addEventListener('load', function () { setTimeout(step, 300); });
})();</script>""" % PLOT_ATTACHMENT


class Quiet(SimpleHTTPRequestHandler):
    """Serves the report; ``/check.html`` is index.html with :data:`OPEN_PLOT_JS` added."""

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/check.html":
            return super().do_GET()
        page = (Path(self.directory) / "index.html").read_text(encoding="utf-8")
        body = page.replace("</body>", OPEN_PLOT_JS + "</body>").encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):   # a browser closing early is no error
            super().handle_error(request, client_address)


def serve(report_dir: Path) -> ThreadingHTTPServer:
    """An HTTP server for ``report_dir`` on 127.0.0.1 (a free port), in a daemon thread."""
    server = Server(("127.0.0.1", 0), functools.partial(Quiet, directory=str(report_dir)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Browser:
    """Headless Chromium, one process per page (``--dump-dom`` or ``--screenshot``)."""

    def __init__(self, binary: str, budget_ms: int, profile: Path):
        self.binary, self.budget_ms, self.profile = binary, budget_ms, profile

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        cmd = [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--hide-scrollbars", f"--user-data-dir={self.profile}",
               f"--virtual-time-budget={self.budget_ms}", "--window-size=1400,1100", *args]
        return subprocess.run(cmd, capture_output=True, timeout=BROWSER_TIMEOUT_S)

    def dom(self, url: str) -> str:
        res = self._run("--dump-dom", url)
        if res.returncode != 0:
            raise RuntimeError(f"chromium --dump-dom {url} exited {res.returncode}: "
                               f"{res.stderr.decode(errors='replace').strip().splitlines()[-1:]}")
        return res.stdout.decode("utf-8", errors="replace")

    def screenshot(self, url: str, path: Path) -> bool:
        self._run(f"--screenshot={path}", url)
        return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


def text_of(dom: str) -> str:
    """The visible text of a dumped DOM (scripts and styles dropped, entities decoded)."""
    body = dom[dom.find("<body"):]
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", body, flags=re.S | re.I)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


def check(report_dir: Path, shots: Path, browser: Browser, base: str) -> list[str]:
    """Run the checks (module doc); returns the failures, one line each."""
    cases = test_cases(report_dir)
    shots.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    overview = text_of(browser.dom(f"{base}/index.html"))
    missing = [c["name"] for c in cases if c["name"] not in overview]
    if missing and len(cases) > OVERVIEW_WIDGET_ITEMS:   # the widget shows ten: the rest on the Suites page
        suites = text_of(browser.dom(f"{base}/index.html#suites"))
        missing = [n for n in missing if n not in suites]
    if "Allure" not in overview:
        failures.append("the overview page did not render (no 'Allure' in its text)")
    failures += [f"the overview does not list the experiment {n!r}" for n in missing]
    if not browser.screenshot(f"{base}/index.html", shots / "overview.png"):
        failures.append(f"no screenshot of the overview written to {shots / 'overview.png'}")
    print(f"check_report: overview lists {len(cases) - len(missing)} of {len(cases)} experiment(s)")
    for i, case in enumerate(cases[:MAX_TEST_PAGES]):
        url = f"{base}/check.html#testresult/{case['uid']}"
        dom = browser.dom(url)
        text = text_of(dom)
        where = f"test page of {case['name']!r} ({url})"
        if case["name"] not in text:
            failures.append(f"{where}: does not show the experiment's name")
        if case["plot"] is None:
            failures.append(f"{where}: the result has no '{PLOT_ATTACHMENT}' attachment")
        else:
            if f"attachments/{case['plot']}" not in dom and PLOT_ATTACHMENT not in text:
                failures.append(f"{where}: the '{PLOT_ATTACHMENT}' attachment is not listed")
            with urlopen(f"{base}/data/attachments/{case['plot']}", timeout=30) as resp:
                if resp.read(8) != PNG_MAGIC:
                    failures.append(f"{where}: data/attachments/{case['plot']} is not a PNG")
        size = re.search(r'data-specchaos-plot="(\d+)x(\d+)"', dom)
        if case["plot"] is not None and not size:
            failures.append(f"{where}: the timeline plot is not shown (its attachment opened no loaded <img>)")
        elif size and (int(size[1]) < 200 or int(size[2]) < 150):
            failures.append(f"{where}: the timeline plot shows at {size[1]}x{size[2]} px, too small")
        shot = shots / f"test-{i + 1}.png"
        if not browser.screenshot(url, shot):
            failures.append(f"{where}: no screenshot written to {shot}")
        print(f"check_report: test page {case['name']!r}: plot "
              + (f"shown at {size[1]}x{size[2]} px" if size else "not shown"))
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report_dir", type=Path)
    ap.add_argument("screenshot_dir", type=Path)
    ap.add_argument("--budget-ms", type=int, default=15000, help="Chromium's --virtual-time-budget per page")
    a = ap.parse_args(argv)
    try:
        binary = find_browser()
        test_cases(a.report_dir)   # bad input before anything starts
    except BadInput as exc:
        print(f"check_report: error: {exc}", file=sys.stderr)
        return 2
    a.screenshot_dir.mkdir(parents=True, exist_ok=True)
    server = serve(a.report_dir.resolve())
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with tempfile.TemporaryDirectory(prefix="check-report-") as profile:
            failures = check(a.report_dir, a.screenshot_dir, Browser(binary, a.budget_ms, Path(profile)), base)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        failures = [f"the browser check could not run: {exc}"]
    finally:
        server.shutdown()
        server.server_close()
    for f in failures:
        print(f"check_report: FAIL: {f}", file=sys.stderr)
    if not failures:
        print(f"check_report: ok; screenshots in {a.screenshot_dir}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
