#!/usr/bin/env python3
"""Open every page of the built documentation site in headless Chromium and check it.

Usage: python scripts/check_site.py SITE_DIR [--chromium /usr/bin/chromium]

The site is served over HTTP from a thread of this script (as a reader's browser gets it, so
the search index and scripts load as they would), and each page is opened in one headless
Chromium driven through the DevTools protocol on a pipe (no driver, no npm package). A page
passes when it loads with no console error, no uncaught exception and no failed request, and
every Mermaid diagram on it became an SVG (Material for MkDocs renders each into a closed
shadow root, which the protocol's DOM pierces), and no Markdown extension's syntax is left as
text (a line of the page's visible text that starts ``=== "`` is a content tab whose extension
is off; ``!!! `` an admonition). Exit 0 when every page passes, else 1 with one
line per problem.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import re
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync",
         "--remote-debugging-pipe"]
PAGE_TIMEOUT = 30.0


class Chromium:
    """One browser, spoken to through --remote-debugging-pipe (fd 3 in, fd 4 out)."""

    def __init__(self, binary: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="outbox-docs-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        os.set_inheritable(to_browser_r, True)
        os.set_inheritable(from_browser_w, True)

        def fds() -> None:  # in the child: the pipe's ends on fds 3 and 4
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4, to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed its pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout: float = PAGE_TIMEOUT) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]
            self.events.append(answer)

    def wait_for(self, method: str, timeout: float = PAGE_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._read(deadline))

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except Exception:  # it may be gone already
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self.profile, ignore_errors=True)


def _serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _problems_in(events: list[dict[str, Any]]) -> list[str]:
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            found.append(f"console {params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            found.append("uncaught: " + details.get("exception", {}).get(
                "description", details.get("text", "")).splitlines()[0])
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            found.append(f"log: {entry['text']} {entry.get('url', '')}".strip())
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            found.append(f"request failed: {params.get('errorText')}")
    return found


def _shadow_svgs(node: dict[str, Any]) -> int:
    """How many div.mermaid elements under ``node`` hold an <svg> in their shadow root."""
    count = 0
    attributes = node.get("attributes", [])
    classes = dict(zip(attributes[::2], attributes[1::2])).get("class", "").split()
    if node.get("localName") == "div" and "mermaid" in classes:
        roots = node.get("shadowRoots", [])
        if any(child.get("localName") == "svg" for root in roots
               for child in root.get("children", [])):
            count += 1
    for child in node.get("children", []) + node.get("shadowRoots", []):
        count += _shadow_svgs(child)
    return count


#: A line of visible text that is Markdown an extension should have turned into HTML.
UNRENDERED = re.compile(r'\s*(=== "|!!! [a-z]|\?\?\?\+? [a-z])')


def check(site: Path, binary: str) -> tuple[int, int, list[str]]:
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html"))
    server, base = _serve(site)
    browser = Chromium(binary)
    problems: list[str] = []
    diagrams = 0
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget",
                               {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable", session=session)
        for page in pages:
            expected = (site / page).read_text(encoding="utf-8").count('class="mermaid"')
            browser.events.clear()
            browser.send("Page.navigate", {"url": base + page}, session=session)
            try:
                browser.wait_for("Page.loadEventFired")
            except TimeoutError:
                problems.append(f"{page}: did not load within {PAGE_TIMEOUT:.0f} s")
                continue
            rendered = 0
            deadline = time.monotonic() + PAGE_TIMEOUT
            while True:  # Mermaid renders after the load event; give it until the deadline
                tree = browser.send("DOM.getDocument", {"depth": -1, "pierce": True},
                                    session=session)["root"]
                rendered = _shadow_svgs(tree)
                if rendered >= expected or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            time.sleep(0.3)  # late console messages of the page's own scripts
            text = browser.send("Runtime.evaluate", {"expression": "document.body.innerText",
                                                     "returnByValue": True},
                                session=session)["result"].get("value", "")
            problems += [f"{page}: {p}" for p in _problems_in(browser.events)]
            problems += [f"{page}: unrendered Markdown: {line.strip()[:60]!r}"
                         for line in text.splitlines() if UNRENDERED.match(line)]
            if rendered != expected:
                problems.append(f"{page}: {rendered} of {expected} Mermaid diagrams rendered")
            diagrams += rendered
    finally:
        browser.close()
        server.shutdown()
    return len(pages), diagrams, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("site", type=Path, help="the built site (mkdocs build's site_dir)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()
    if not (args.site / "index.html").exists():
        parser.error(f"{args.site} holds no built site (run: mkdocs build)")
    started = time.monotonic()
    pages, diagrams, problems = check(args.site, args.chromium)
    for problem in problems:
        print(f"check_site: {problem}", file=sys.stderr)
    print(f"check_site: {pages} pages opened in headless Chromium, {diagrams} Mermaid diagrams "
          f"rendered, {len(problems)} problems, in {time.monotonic() - started:.1f} s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
