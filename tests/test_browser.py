"""The report page in a real browser: headless Chromium renders every chart offline, with no Vega error.

Skipped when Chromium is not installed, except under CI (env var CI set), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_report import CHARTS, make_report_dir

from sim.report.build import build_report

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--hide-scrollbars", "--virtual-time-budget=15000",
)  # fmt: skip


def find_browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    reason = "Chromium is not installed (apt-get install -y chromium)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must run the browser check")
    pytest.skip(reason)


class ChartScan(HTMLParser):
    """Per chart container (`data-chart`): its attributes and how many <svg>/<canvas> it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, dict[str, str | None]] = {}
        self.drawn: dict[str, int] = {}
        self.body: dict[str, str | None] = {}
        self._open: str | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        if tag == "body":
            self.body = attr
        if self._open is not None:
            self._depth += tag not in {"br", "img", "input", "meta", "link", "hr"}
            self.drawn[self._open] += tag in {"svg", "canvas"}
        elif tag == "div" and attr.get("data-chart"):
            self._open = str(attr["data-chart"])
            self.charts[self._open], self.drawn[self._open], self._depth = attr, 0, 1

    def handle_endtag(self, tag: str) -> None:
        if self._open is not None:
            self._depth -= 1
            if self._depth == 0:
                self._open = None


def run_browser(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [browser, *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)


def test_every_chart_renders_in_headless_chromium(tmp_path: Path) -> None:
    browser = find_browser()
    report_dir = make_report_dir(tmp_path)
    build_report(report_dir, png=False)
    url = (report_dir / "index.html").resolve().as_uri()

    dom = run_browser(browser, tmp_path / "profile", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    scan = ChartScan()
    scan.feed(dom.stdout)
    assert scan.body.get("data-charts") == "done", "vega-embed did not settle in time"
    assert sorted(scan.charts) == sorted(CHARTS)
    for key, attr in scan.charts.items():
        assert attr.get("data-error") is None, f"{key}: {attr.get('data-error')}"
        assert attr.get("data-rendered") == "true", key
        assert scan.drawn[key] >= 1, f"{key}: no <svg> or <canvas> drawn"

    shot = report_dir / "screenshot.png"
    result = run_browser(
        browser, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1400,5200", url
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
