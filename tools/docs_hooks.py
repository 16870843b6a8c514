"""mkdocs hooks (mkdocs.yml `hooks:`): the repository's root BENCHMARKS.md and CHANGELOG.md become site pages, and
every link that leaves docs/ is made to work on the site while the Markdown stays as GitHub shows it.

A link from a page to `../BENCHMARKS.md#x` becomes the relative link to the added page (`benchmarks.md#x`, or
`../benchmarks.md#x` from docs/guides/); the added pages' own links into docs/ (`docs/bench/plot.png`) become links
inside the site. A link to any other file outside docs/ (`../tools/bench/run_all.py`, `../README.md#install`) has no
page on the site (the repository has no public URL to point at), so it becomes a code reference: the link text,
followed by the repository path in backticks unless the text already names it. A link to a folder without an
index page becomes a code reference the same way. A link to a path that does not exist is logged as a warning,
which fails `mkdocs build --strict`.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.docs_hooks")

ROOT = Path(__file__).resolve().parents[1]
#: repository file → its page on the site (a path inside docs_dir that no file in docs/ has)
ROOT_PAGES = {"BENCHMARKS.md": "benchmarks.md", "CHANGELOG.md": "changelog.md"}

_FENCE = re.compile(r"^\s*(```+|~~~+)")
_CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
_LINK = re.compile(r"(?P<bang>!?)\[(?P<text>(?:[^\[\]]|\[[^\]]*\])*)\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
_REF_DEF = re.compile(r"^(?P<lead> {0,3}\[[^\]]+\]:\s*)(?P<target>\S+)(?P<rest>.*)$")


def on_files(files: Files, config) -> Files:
    """Add each ROOT_PAGES file to the site under its page name."""
    for source, page in ROOT_PAGES.items():
        if files.get_file_from_path(page) is not None:
            raise ValueError(f"docs/{page} exists, and {source} is added to the site under that name: rename one")
        files.append(File.generated(config, page, abs_src_path=str(ROOT / source)))
    return files


def on_serve(server, config, builder):
    """`mkdocs serve` rebuilds when one of the added root files changes."""
    for source in ROOT_PAGES:
        server.watch(str(ROOT / source))
    return server


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    """Rewrite the page's relative links that leave docs/ (or, on an added root page, that enter it)."""
    docs_dir = Path(config["docs_dir"]).resolve()
    src_uri = page.file.src_uri
    source = {page: src for src, page in ROOT_PAGES.items()}.get(src_uri)
    real = ROOT / source if source else docs_dir / src_uri
    rewrite = _Rewriter(real.parent, posixpath.dirname(src_uri), docs_dir, src_uri)
    out, fence = [], None
    for line in markdown.split("\n"):
        opened = _FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            out.append(line)
            continue
        if opened:
            fence = opened.group(1)
            out.append(line)
            continue
        out.append(rewrite.line(line))
    return "\n".join(out)


class _Rewriter:
    """Link rewriting for one page: `here` is the folder its Markdown really sits in, `uri_dir` its folder on the
    site (relative to docs_dir)."""

    def __init__(self, here: Path, uri_dir: str, docs_dir: Path, src_uri: str):
        self.here, self.uri_dir, self.docs_dir, self.src_uri = here, uri_dir, docs_dir, src_uri

    def line(self, line: str) -> str:
        ref = _REF_DEF.match(line)
        if ref:
            new = self.target(ref["target"], ref["target"], image=False)
            if new is not None and new[0] == "text":
                log.warning("%s defines a link to %s, which is not on the site", self.src_uri, ref["target"])
            return line if new is None or new[0] == "text" else f"{ref['lead']}{new[1]}{ref['rest']}"
        spans = [m.span() for m in _CODE_SPAN.finditer(line)]  # a link that starts inside `code` is text
        return _LINK.sub(lambda m: m.group(0) if any(a <= m.start() < b for a, b in spans) else self._link(m), line)

    def _link(self, m: re.Match) -> str:
        new = self.target(m["target"], m["text"], image=bool(m["bang"]))
        if new is None:
            return m.group(0)
        if new[0] == "text":  # a code reference replaces the whole link
            return new[1]
        return f"{m['bang']}[{m['text']}]({new[1]}{m['title'] or ''})"

    def target(self, target: str, text: str, *, image: bool) -> tuple[str, str] | None:
        """("link", the new target) or ("text", what replaces the whole link); None leaves the link as it is."""
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return None  # a URL, an anchor on this page, or a site-absolute path (mkdocs validates those)
        path, sep, fragment = target.partition("#")
        real = Path(os.path.normpath(self.here / path))
        if self.here.is_relative_to(self.docs_dir) and real.is_relative_to(self.docs_dir) and not real.is_dir():
            return None  # from a page of docs/ to a file of docs/: mkdocs validates it
        try:
            repo_path = real.relative_to(ROOT).as_posix()
        except ValueError:
            log.warning("%s links to %s, outside the repository", self.src_uri, target)
            return None
        if not real.exists():
            log.warning("%s links to %s, which does not exist (%s)", self.src_uri, target, repo_path)
            return None
        site_uri = ROOT_PAGES.get(repo_path)
        if site_uri is None and real.is_relative_to(self.docs_dir) and real.is_file():
            site_uri = real.relative_to(self.docs_dir).as_posix()
        if site_uri is None and real.is_dir() and real.is_relative_to(self.docs_dir):
            index = next((real / n for n in ("index.md", "README.md") if (real / n).is_file()), None)
            site_uri = index.relative_to(self.docs_dir).as_posix() if index else None
        if site_uri is not None:
            new = posixpath.relpath(site_uri, self.uri_dir or ".") + (sep + fragment)
            return None if new == target else ("link", new)
        if image:
            log.warning("%s shows the image %s, which is outside docs/: move it into docs/", self.src_uri, target)
            return None
        shown = repo_path + ("/" if real.is_dir() else "") + (sep + fragment)
        code = f"`{shown}`"
        return "text", code if text.strip("` ") in (shown, repo_path, target) else f"{text} ({code})"
