"""The docs and the code cite only files in the repository: every relative Markdown link and every repository path the
docs name exists, and nothing points at design notes kept outside it (a `shared/...` path, "spec §1.2")."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import REPO

DOCS = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").rglob("*.md"))]
CODE = [p for top in ("framework", "registry", "recipes", "tools", "tests", "conf") for p in (REPO / top).rglob("*")
        if p.suffix in (".py", ".yaml", ".md") and "__pycache__" not in p.parts and p != Path(__file__).resolve()]
#: a citation of something outside the repository: the old design notes, by path or by section number
OUTSIDE = re.compile(r"\bshared/|\bspecs?/\w+\.md|\bspec\s*§|\bspec\s+\d+\.\d|§\s?\d")
#: a repository path with a file extension, not part of a longer path or URL
CITED = re.compile(r"(?<![\w./:-])((?:framework|registry|recipes|conf|docs|tools|tests)/[\w./-]*\.(?:py|md|yaml|json|"
                   r"png|csv|tsv|txt))\b")
#: paths the docs print that are not meant to exist in the repository → why
NOT_FILES = {"framework/optim/signsgd.py": "README's example of a file the reader writes"}


def test_nothing_cites_design_notes_outside_the_repository():
    hits = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in DOCS + CODE
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert hits == []


def test_every_relative_link_and_cited_path_in_the_docs_is_a_file_in_the_repository():
    missing = []
    for doc in DOCS:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+:", path) and not (doc.parent / path).exists():
                missing.append(f"{doc.relative_to(REPO)}: link {target}")
        for path in CITED.findall(text):
            placeholder = any(part.isupper() for part in re.split(r"[/.]", path))  # conf/size/SIZE.yaml
            if not placeholder and path not in NOT_FILES and not (REPO / path).exists():
                missing.append(f"{doc.relative_to(REPO)}: {path}")
    assert missing == []


def test_the_checks_see_a_citation_when_there_is_one():
    assert OUTSIDE.search("see shared/specs/olion_growth.md §1.5") and OUTSIDE.search("(spec 1.4's harder variant)")
    assert not OUTSIDE.search("the NELBO (arXiv 2406.07524); DataSpec.of(data); spectral norm")
    assert CITED.findall("`tests/test_runs.py` and [x](https://h/docs/a.md)") == ["tests/test_runs.py"]
