"""A link check over a built HTML site, offline: every internal link (``href``/``src`` of
``a``, ``link``, ``img``, ``script``, ``source``) must name a file of the site and, with a
``#fragment``, an element ``id`` (or ``<a name>``) of that page (a path starting with ``/``
counts from the site's root, as mkdocs writes ``404.html``); external links are only
checked for syntax (``http``/``https`` with a host, ``mailto:`` with an address), never
fetched. Parsed with the standard library's :class:`html.parser.HTMLParser`."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

__all__ = ["Page", "parse_page", "check_site"]

LINK_ATTRS = {"a": "href", "link": "href", "img": "src", "script": "src", "source": "src", "iframe": "src"}


@dataclass
class Page:
    """What a page offers (``ids``) and what it points at (``links``, as written)."""

    ids: set[str] = field(default_factory=set)
    links: list[str] = field(default_factory=list)


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = Page()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.page.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.page.ids.add(a["name"])
        want = LINK_ATTRS.get(tag)
        if want and a.get(want) is not None:
            self.page.links.append(a[want])


def parse_page(html: str) -> Page:
    p = _Collector()
    p.feed(html)
    p.close()
    return p.page


def _external_problem(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme in ("http", "https"):
        return None if parts.netloc and " " not in url else "malformed URL"
    if parts.scheme == "mailto":
        return None if "@" in parts.path else "malformed mailto address"
    return f"unexpected scheme {parts.scheme!r}"


def check_site(site: Path) -> list[str]:
    """Every broken link of the site under ``site``, one line each (``page: link: why``);
    empty when every link resolves."""
    site = site.resolve()
    pages = {p: parse_page(p.read_text(encoding="utf-8")) for p in sorted(site.rglob("*.html"))}
    problems: list[str] = []
    for path, page in pages.items():
        rel = path.relative_to(site).as_posix()
        for link in page.links:
            if not link or link.startswith(("javascript:", "data:")):
                continue
            parts = urlsplit(link)
            if parts.scheme or parts.netloc:
                why = _external_problem(link)
                if why:
                    problems.append(f"{rel}: {link}: {why}")
                continue
            if parts.path.startswith("/"):   # 404.html: links from the site's root, wherever it is shown
                target = site / unquote(parts.path).lstrip("/")
            else:
                target = path if not parts.path else (path.parent / unquote(parts.path))
            target = Path(PurePosixPath(*target.parts)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if site not in target.parents and target != site:
                problems.append(f"{rel}: {link}: points outside the site")
                continue
            if not target.is_file():
                problems.append(f"{rel}: {link}: no such file")
                continue
            if parts.fragment:
                ids = pages[target].ids if target in pages else set()
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{rel}: {link}: no anchor #{parts.fragment} in {target.relative_to(site).as_posix()}")
    return problems
