"""The self-contained HTML page: one file, inline CSS and SVG, no script, no network.

This module knows the page's markup only; :mod:`meshtax.report.build` decides what goes in it.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from meshtax._version import __version__

CSS = """
:root { --fg:#1f2328; --muted:#59636e; --line:#d1d9e0; --bg:#ffffff; --accent:#d62728; --card:#f6f8fa; }
* { box-sizing: border-box; }
body { margin:0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Helvetica, Arial,
  sans-serif; color:var(--fg); background:var(--bg); }
header { padding: 20px 32px 8px; border-bottom: 1px solid var(--line); }
header h1 { margin: 0 0 4px; font-size: 26px; }
header p { margin: 0; color: var(--muted); }
nav ul { list-style:none; padding:0; margin:10px 0 6px; display:flex; flex-wrap:wrap; gap:6px 18px; }
nav a { color:#0969da; text-decoration:none; } nav a:hover { text-decoration:underline; }
main { padding: 8px 32px 40px; max-width: 1280px; }
section { margin-top: 26px; }
h2 { font-size: 21px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 17px; margin: 22px 0 6px; }
.cards { display:flex; flex-wrap:wrap; gap:12px; margin: 14px 0; }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:10px 16px; min-width: 190px; }
.card .v { font-size: 24px; font-weight: 600; }
.card .k { color: var(--muted); font-size: 13px; }
table { border-collapse: collapse; margin: 8px 0 14px; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 10px; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: var(--card); }
td.neg { color: #1a7f37; } td.pos { color: var(--accent); }
figure.mt-figure { margin: 14px 0 22px; padding: 10px; border: 1px solid var(--line);
  border-radius: 8px; overflow-x: auto; }
figure.mt-figure svg { max-width: 100%; height: auto; display: block; }
figcaption { color: var(--muted); font-size: 13px; margin-bottom: 6px; }
figcaption strong { color: var(--fg); font-size: 14px; display:block; }
.warn { border-left: 4px solid #bf8700; background:#fff8c5; padding: 6px 12px; margin: 6px 0; font-size: 14px; }
.missing { color: var(--muted); font-style: italic; }
footer { color: var(--muted); font-size: 12px; padding: 12px 32px; border-top: 1px solid var(--line); }
"""


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


@dataclass
class Section:
    """One part of the page (a heading in the table of contents) made of HTML blocks."""

    id: str
    title: str
    blocks: list[str] = field(default_factory=list)


def table(
    head: Sequence[str],
    rows: Sequence[Sequence[Any]],
    classes: Sequence[Sequence[str]] | None = None,
) -> str:
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = []
    for i, r in enumerate(rows):
        cls = classes[i] if classes else [""] * len(r)
        body.append(
            "<tr>"
            + "".join(
                f'<td class="{c}">{esc(v)}</td>' if c else f"<td>{esc(v)}</td>"
                for v, c in zip(r, cls)
            )
            + "</tr>"
        )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def cards(items: Sequence[tuple[str, str]]) -> str:
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>'
            for v, k in items
        )
        + "</div>"
    )


def figure(fid: str, kind: str, title: str, caption: str, svg: str) -> str:
    # svg is produced by meshtax.report.figures (matplotlib), trusted markup
    return (
        f'<figure class="mt-figure" id="{esc(fid)}" data-kind="{esc(kind)}"><figcaption><strong>{esc(title)}</strong>'
        f"{esc(caption)}</figcaption>{svg}</figure>"
    )


def missing(text: str) -> str:
    return f'<p class="missing">{esc(text)}</p>'


def para(text: str, cls: str = "") -> str:
    return f'<p class="{cls}">{esc(text)}</p>' if cls else f"<p>{esc(text)}</p>"


def page(title: str, subtitle: str, sections: Sequence[Section], created: str) -> str:
    toc = "".join(f'<li><a href="#{esc(s.id)}">{esc(s.title)}</a></li>' for s in sections)
    body = "".join(
        f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>{"".join(s.blocks)}</section>'
        for s in sections
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
        'content="width=device-width, initial-scale=1">'
        '<meta name="generator" content="meshtax '
        f'{esc(__version__)}"><title>{esc(title)}</title><style>{CSS}</style></head>'
        f"<body><header><h1>{esc(title)}</h1><p>{esc(subtitle)}</p><nav><ul>{toc}</ul></nav></header>"
        f"<main>{body}</main><footer>meshtax {esc(__version__)} · created {esc(created)} · one self-contained file: "
        "no scripts, no network.</footer></body></html>\n"
    )
