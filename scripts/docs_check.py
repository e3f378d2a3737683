"""The built site (site/) as a reader's browser shows it, checked in a real headless Chromium
driven over the DevTools protocol: the home page and the API page render with the
navigation and the search box, the API page holds the reference of TorchEstimator and the
errors, and a search typed into the box lists results (Material's search runs in a web
worker over the search index, so this proves the index and the worker load).

  python scripts/docs_check.py CHROMIUM SITE_DIR
"""
from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path

import websocket  # websocket-client, pinned in constraints-docs.txt

WAIT_S = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    def __init__(self, chromium: str):
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="sparkddl-docs-chromium-")
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--remote-debugging-port={self.port}", "--remote-allow-origins=*",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json") as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("Chromium did not open its DevTools port")
            time.sleep(0.2)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=WAIT_S)
        self.next_id = 0

    def call(self, method: str, **params: object):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def js(self, expression: str):
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                        awaitPromise=True)
        return out.get("result", {}).get("value")

    def until(self, expression: str) -> object:
        """The value of ``expression`` once it is truthy, or its last value after WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        while True:
            value = self.js(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.25)

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.until("document.readyState === 'complete' && document.querySelector('.md-nav') "
                   "!== null")

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # noqa: ANN002 - one line per request is noise
        pass


def serve(site: Path) -> str:
    handler = partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/"


def main(chromium: str, site: Path) -> None:
    base = serve(site)
    browser = Browser(chromium)
    problems = []

    def need(page: str, what: str, expression: str) -> None:
        if not browser.until(expression):
            problems.append(f"{page}: {what}")
    try:
        browser.call("Page.enable")
        for page, path in (("home", ""), ("API", "reference/api/")):
            browser.open(base + path)
            need(page, "no navigation", "document.querySelectorAll('.md-nav__link').length > 10")
            need(page, "the guides are not in the navigation",
                 "document.body.innerText.includes('Data and readers')")
            need(page, "no search box", "document.querySelector('.md-search__input') !== null")
        need("API", "no TorchEstimator reference",
             "document.getElementById('sparkddl.ml.estimator.TorchEstimator') !== null")
        need("API", "no reference of the errors",
             "document.getElementById('sparkddl.errors.DataError') !== null")
        browser.open(base)
        need("home", "no text", "document.body.innerText.includes('barrier-mode stage')")
        browser.js("""(() => {
            const box = document.querySelector('.md-search__input');
            box.focus(); box.value = 'read_delta';
            box.dispatchEvent(new Event('input', {bubbles: true}));
            box.dispatchEvent(new KeyboardEvent('keyup', {bubbles: true, key: 'a'}));
            return true; })()""")
        hits = browser.until("document.querySelectorAll('.md-search-result__item').length")
        if not hits:
            meta = browser.js("(document.querySelector('.md-search-result__meta') || {})"
                              ".innerText")
            problems.append(f"search: typing read_delta listed no result ({meta!r})")
    finally:
        browser.close()
    if problems:
        raise SystemExit("docs check failed:\n  " + "\n  ".join(problems))
    print(f"docs check: the home and API pages render with navigation and search in "
          f"{chromium}; a search for read_delta lists {hits} result(s)")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
