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


def test_plan_page_charts_render_in_headless_chromium(tmp_path: Path) -> None:
    """The `sim plan` page (cost-latency front and throughput front) renders offline, with no Vega error."""
    import polars as pl

    from sim.report.plan import front_chart, plan_page
    from sim.studies.plan_result import PlanResult, pareto

    browser = find_browser()
    rows = pl.DataFrame({
        "config": ["a", "b", "c"], "cost_per_hour": [1.0, 2.0, 3.0], "gpus": [1, 2, 3],
        "ttft_p99": [0.9, 0.5, 0.2], "tpot_p99": [0.01] * 3, "tpot_p50": [0.008, 0.01, 0.02],
        "goodput_per_s": [1.0] * 3, "output_tokens_per_s": [900.0, 1500.0, 2000.0],
        "meets_slo": [True, True, False], "verdict": ["meets", "meets", "fails"],
        "mode": ["colocated", "pd", "colocated"], "gpu": ["A100-80GB"] * 3, "tp": [1] * 3,
        "knobs": ["{}"] * 3, "counts": [[1], [1, 1], [3]],
    })  # fmt: skip
    result = PlanResult(20.0, 0.9, 3, 0, 0, rows=rows.to_dicts(), best=rows.row(0, named=True),
                        slo={"ttft_s": 0.5, "tpot_s": 0.03, "e2e_s": None})  # fmt: skip
    assert front_chart(rows, pareto(rows)).to_dict(validate=True)
    page = tmp_path / "index.html"
    page.write_text(plan_page(result, rows, pareto(rows), "plan.toml"), encoding="utf-8")
    dom = run_browser(browser, tmp_path / "profile", "--dump-dom", page.resolve().as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    scan = ChartScan()
    scan.feed(dom.stdout)
    assert scan.body.get("data-charts") == "done", "vega-embed did not settle in time"
    assert sorted(scan.charts) == ["front", "throughput"]
    for key, attr in scan.charts.items():
        assert attr.get("data-error") is None, f"{key}: {attr.get('data-error')}"
        assert attr.get("data-rendered") == "true" and scan.drawn[key] >= 1, key
