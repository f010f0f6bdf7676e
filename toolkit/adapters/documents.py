"""Documents for people: the report's HTML page from its Jinja2 template, with Markdown fragments rendered by
markdown-it-py (the only importer of markdown_it).

The page's structure is the template (toolkit/adapters/templates/report.html.j2), filled from plain data the
pure core computes (toolkit.core.results.report.page_context); the text a profile's author or the probe writes
(a verdict's headline, next steps with `knob` names in backticks, a why's link, a plot's caption) is Markdown and
is rendered as Markdown, so code is code and URLs are links. Raw HTML inside that text is escaped, never passed
through; autoescape is on for everything else. The page is standalone: its images are data URIs.
"""

from __future__ import annotations

import base64
import re
from functools import cache
from typing import Any

# A URL in prose, not already a link's target (`](url)`) or an autolink (`<url>`); its closing punctuation is left.
_BARE_URL = re.compile(r"(?<!\]\()(?<![<\w])(https?://[^\s<>()\[\]]+[^\s<>()\[\].,;:!?'\"])")


@cache
def _markdown() -> Any:
    from markdown_it import MarkdownIt

    # CommonMark with tables; raw HTML in the text is shown as text, never interpreted.
    return MarkdownIt("commonmark", {"html": False}).enable("table")


def _autolink(text: str) -> str:
    """Bare URLs as CommonMark autolinks (<https://...>), so they become links without a linkify plug-in."""
    return _BARE_URL.sub(r"<\1>", text)


def markdown_block(text: str) -> str:
    return str(_markdown().render(_autolink(text)))


def markdown_inline(text: str) -> str:
    return str(_markdown().renderInline(_autolink(text)))


@cache
def _environment() -> Any:
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(loader=jinja2.PackageLoader("toolkit.adapters", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["md"] = lambda text: Markup(markdown_block(str(text)))
    env.filters["mdi"] = lambda text: Markup(markdown_inline(str(text)))
    env.filters["b64"] = lambda data: base64.b64encode(data).decode("ascii")
    return env


def render_page(template: str, context: dict[str, Any]) -> str:
    """A template of toolkit/adapters/templates (e.g. "report.html.j2") rendered with `context`."""
    return str(_environment().get_template(template).render(**context))
