"""The report page: one self-contained HTML file (Vega, Vega-Lite and vega-embed inlined, no network).

Each chart's container gets `data-rendered="true"` when vega-embed succeeds, or `data-error` when it
fails, and `<body data-charts="done">` once every chart has settled, so a headless browser can check it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from html import escape
from typing import Any

import altair as alt
import vl_convert as vlc
from altair.utils._importers import vl_version_for_vl_convert


@dataclass(slots=True)
class Section:
    """One chart of the report, or the reason it is missing (`chart` None, `missing` says why)."""

    key: str
    title: str
    note: str  # trusted HTML: what to look for
    chart: alt.TopLevelMixin | None = None
    missing: str = ""  # trusted HTML


@functools.cache
def vega_bundle() -> str:
    """vega + vega-lite + vega-embed as one script, matching altair's Vega-Lite version (from vl-convert)."""
    return vlc.javascript_bundle(vl_version=vl_version_for_vl_convert())


def chart_spec(chart: alt.TopLevelMixin) -> dict[str, Any]:
    """The Vega-Lite spec of a chart. Schema validation is skipped: it costs seconds per chart, and the
    tests validate every chart the report draws."""
    return chart.to_dict(validate=False)


def chart_png(spec: dict[str, Any]) -> bytes:
    return vlc.vegalite_to_png(spec, vl_version=vl_version_for_vl_convert())


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element."""
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/")


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; margin: 0;
       background: #fafafa; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 32px 64px; background: #fff; }
h1 { margin: 0 0 4px; font-size: 28px; }
h2 { margin: 36px 0 6px; font-size: 20px; border-top: 1px solid #eee; padding-top: 20px; }
p { line-height: 1.5; max-width: 900px; }
.meta { color: #666; margin-top: 0; }
.lead { font-size: 19px; font-weight: 600; margin: 18px 0; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; display: block; overflow-x: auto; }
th, td { padding: 4px 8px; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th { white-space: normal; vertical-align: bottom; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; font-weight: 600; }
.vis { margin: 8px 0; overflow-x: auto; }
.note { color: #8a1f11; background: #fbeaea; padding: 8px 12px; border-radius: 4px; }
.missing { color: #8a6d3b; background: #fcf8e3; padding: 8px 12px; border-radius: 4px; }
.coverage { color: #555; font-size: 13px; margin-top: 0; }
.png { font-size: 12px; color: #888; }
code { background: #f3f3f3; padding: 1px 4px; border-radius: 3px; }
"""

EMBED = """
const specs = %s;
const jobs = Object.entries(specs).map(([key, spec]) => {
  const el = document.getElementById("chart-" + key);
  return vegaEmbed(el, spec, {renderer: "svg", actions: false})
    .then(() => { el.dataset.rendered = "true"; })
    .catch((err) => { el.dataset.error = String(err); el.textContent = "Chart failed: " + err; });
});
Promise.allSettled(jobs).then(() => { document.body.dataset.charts = "done"; });
"""


def _table(header: tuple[str, ...], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section(section: Section, png_dir: str) -> str:
    parts = [f'<section id="{section.key}"><h2>{escape(section.title)}</h2>', f"<p>{section.note}</p>"]
    if section.chart is None:
        parts.append(f'<p class="missing">{section.missing}</p>')
    else:
        parts.append(f'<div class="vis" id="chart-{section.key}" data-chart="{section.key}"></div>')
        parts.append(f'<p class="png"><a href="{png_dir}/{section.key}.png">PNG</a></p>')
    return "".join(parts) + "</section>"


def render_page(
    title: str,
    description: str,
    meta: str,
    headline: list[str],
    table: tuple[tuple[str, ...], list[list[str]]] | None,
    sections: list[Section],
    specs: dict[str, dict[str, Any]],
    png_dir: str = "charts",
    notes: list[str] | None = None,
    table_note: str = "",
) -> str:
    """The whole HTML document; `specs` holds the Vega-Lite spec of each section that has a chart;
    `notes` are caveats shown above the headline; `table_note` is said under the table (what its
    latencies cover)."""
    lead = "".join(f'<p class="note">{escape(line)}</p>' for line in notes or [])
    lead += "".join(f'<p class="lead">{escape(line)}</p>' for line in headline)
    summary = _table(*table) if table and table[1] else ""
    if summary and table_note:
        summary += f'<p class="coverage">{escape(table_note)}</p>'
    body = "".join(_section(s, png_dir) for s in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{CSS}</style>"
        f'<script type="text/javascript">{vega_bundle()}</script></head>'
        f'<body data-charts="pending"><main><h1>{escape(title)}</h1>'
        f'<p>{escape(description)}</p><p class="meta">{escape(meta)}</p>'
        f"{lead}{summary}{body}</main>"
        f'<script type="text/javascript">{EMBED % _script_json(specs)}</script></body></html>\n'
    )
