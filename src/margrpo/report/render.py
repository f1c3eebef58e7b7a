"""A report as a list of sections, written as Markdown and as one self-contained HTML file.

Both writers read the same structure, so the two files always say the same thing. The
HTML embeds every image as a base64 data URI and uses no scripts or external styles, so
it opens offline and can be mailed as one file.
"""
from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass, field
from pathlib import Path


# A table cell: one line of text, or several short lines (rendered one under another).
Cell = str | list[str]


@dataclass
class Table:
    header: list[str]
    rows: list[list[Cell]]


@dataclass
class Figure:
    path: Path
    caption: str
    # Pixel-art figures (sample grids of 32 px images) are scaled up to the page width.
    pixelated: bool = False


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    code: str | None = None
    anchor: str | None = None  # HTML id, so report.html#<anchor> opens at this section


def _md_cell(cell: Cell) -> str:
    lines = [cell] if isinstance(cell, str) else cell
    return "<br>".join(line.replace("|", "\\|") for line in lines)


def to_markdown(title: str, sections: list[Section], base: Path, subtitle: str = "") -> str:
    """Markdown with image links relative to `base` (the folder report.md is written to)."""
    out = [f"# {title}", ""] + ([f"*{subtitle}*", ""] if subtitle else [])
    for s in sections:
        out += [f"## {s.title}", ""]
        for p in s.paragraphs:
            out += [p, ""]
        for t in s.tables:
            out.append("| " + " | ".join(t.header) + " |")
            out.append("|" + "---|" * len(t.header))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in t.rows]
            out.append("")
        for f in s.figures:
            rel = os.path.relpath(f.path, base)
            out += [f"**{f.caption}**", "", f"![{f.caption}]({rel})", ""]
        if s.code:
            out += ["```yaml", s.code.rstrip(), "```", ""]
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
.meta{color:#555;font-size:14px;margin-top:-0.6em}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left;
vertical-align:top}th{background:#f3f3f3}td div{white-space:nowrap}
figure{margin:1.5em 0;text-align:center}figure img{max-width:100%}img.pixelated{width:100%;max-width:1000px;
image-rendering:pixelated}figcaption{font-size:14px;color:#333;margin-bottom:.4em;font-weight:600}
pre{background:#f7f7f7;padding:1em;overflow:auto;font-size:12px}
.holds{color:#176b2c;font-weight:600}.does-not-hold{color:#a11;font-weight:600}.inconclusive{color:#8a6d00;font-weight:600}
.no-difference{color:#1f4e8c;font-weight:600}"""


def _cell(cell: Cell) -> str:
    if not isinstance(cell, str):
        return "<td>" + "".join(f"<div>{html.escape(line)}</div>" for line in cell) + "</td>"
    cls = {"holds": "holds", "does not hold": "does-not-hold", "inconclusive": "inconclusive",
           "no difference larger than δ": "no-difference"}.get(cell)
    return f'<td class="{cls}">{html.escape(cell)}</td>' if cls else f"<td>{html.escape(cell)}</td>"


def to_html(title: str, sections: list[Section], subtitle: str = "") -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>"] + ([f'<p class="meta">{html.escape(subtitle)}</p>'] if subtitle else [])
    for s in sections:
        anchor = f' id="{s.anchor}"' if s.anchor else ""
        out.append(f"<h2{anchor}>{html.escape(s.title)}</h2>")
        out += [f"<p>{html.escape(p)}</p>" for p in s.paragraphs]
        for t in s.tables:
            out.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in t.header) + "</tr>")
            out += ["<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in t.rows]
            out.append("</table>")
        for f in s.figures:
            data = base64.b64encode(Path(f.path).read_bytes()).decode()
            cls = ' class="pixelated"' if f.pixelated else ""
            out.append(f"<figure><figcaption>{html.escape(f.caption)}</figcaption>"
                       f'<img{cls} alt="{html.escape(f.caption)}" src="data:image/png;base64,{data}"></figure>')
        if s.code:
            out.append(f"<pre>{html.escape(s.code)}</pre>")
    out.append("</body></html>")
    return "\n".join(out)
