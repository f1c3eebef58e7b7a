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


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Figure:
    path: Path
    caption: str


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    code: str | None = None


def to_markdown(title: str, sections: list[Section], base: Path) -> str:
    """Markdown with image links relative to `base` (the folder report.md is written to)."""
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for p in s.paragraphs:
            out += [p, ""]
        for t in s.tables:
            out.append("| " + " | ".join(t.header) + " |")
            out.append("|" + "---|" * len(t.header))
            out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in t.rows]
            out.append("")
        for f in s.figures:
            rel = os.path.relpath(f.path, base)
            out += [f"![{f.caption}]({rel})", "", f"*{f.caption}*", ""]
        if s.code:
            out += ["```yaml", s.code.rstrip(), "```", ""]
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}
th{background:#f3f3f3}img{max-width:100%;image-rendering:pixelated}figure{margin:1em 0}
figcaption{font-size:13px;color:#555}pre{background:#f7f7f7;padding:1em;overflow:auto;font-size:12px}
.holds{color:#176b2c;font-weight:600}.does-not-hold{color:#a11;font-weight:600}.inconclusive{color:#8a6d00;font-weight:600}"""


def _cell(text: str) -> str:
    cls = {"holds": "holds", "does not hold": "does-not-hold", "inconclusive": "inconclusive"}.get(text)
    return f'<td class="{cls}">{html.escape(text)}</td>' if cls else f"<td>{html.escape(text)}</td>"


def to_html(title: str, sections: list[Section]) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>"]
    for s in sections:
        out.append(f"<h2>{html.escape(s.title)}</h2>")
        out += [f"<p>{html.escape(p)}</p>" for p in s.paragraphs]
        for t in s.tables:
            out.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in t.header) + "</tr>")
            out += ["<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in t.rows]
            out.append("</table>")
        for f in s.figures:
            data = base64.b64encode(Path(f.path).read_bytes()).decode()
            out.append(f'<figure><img alt="{html.escape(f.caption)}" src="data:image/png;base64,{data}">'
                       f"<figcaption>{html.escape(f.caption)}</figcaption></figure>")
        if s.code:
            out.append(f"<pre>{html.escape(s.code)}</pre>")
    out.append("</body></html>")
    return "\n".join(out)
