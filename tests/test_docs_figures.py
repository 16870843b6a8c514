"""Every figure in README.md and docs/ is quoted from a file a named command writes, never retyped (issue 15).

A quote is fenced by HTML comments, which Markdown does not render:

    <!-- figures from BENCHMARKS.md#optimizers -->   a committed file; `#name` narrows it to its `## name` section
    ... table rows or sentences ...
    <!-- end figures -->

    <!-- figures from runs/experiments/rlkv/table.md; written by `python tools/experiments/rlkv.py` -->

A table row's decimals must appear in the same order on one line of the source, with the same rounding (a
test file's bounds: anywhere in it); a sentence's decimals must each appear somewhere in it. A source under runs/
is not committed: the named script must exist and write a file of that name, and the numbers are compared
whenever a local run has left the file.
Sample terminal output that is not a measurement sits between `<!-- example output of `CMD` -->` and
`<!-- end example -->`. Outside these blocks, code and the non-figures in ALLOWED, a checked file holds no
decimal number and no percentage, ratio, size or duration.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the written pages (docs/ and its guides); docs/'s subfolders of written-out results are the sources quotes name
OWN_DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for pattern in ("*.md", "guides/*.md")
                                 for p in (REPO / "docs").glob(pattern))]
QUOTE = re.compile(r"<!-- figures from (?P<sources>[^;]+?)(?:; written by `(?P<cmd>[^`]+)`)? -->\n"
                   r"(?P<body>.*?)<!-- end figures -->", re.S)
EXAMPLE = re.compile(r"<!-- example output of `[^`]+`[^>]*-->\n.*?<!-- end example -->", re.S)
DECIMAL = re.compile(r"(?<![\w.])[-−+]?(?:\d+\.\d+(?:\.\d+)*|\.\d+)(?:e[-+]?\d+)?(?!\d)")
MEASURE = re.compile(r"(?<![\w.×/])\d+(?:,\d{3})*\s?(?:%|×(?!\s?[\d(])|x\b|ms\b|s\b|min\b|minutes?\b|seconds?\b"
                     r"|[KMG]iB\b)")
CODE = re.compile(r"^```(?:bash|python|sh)\n.*?^```$|`[^`\n]+`|<!--.*?-->|\]\([^)]*\)", re.S | re.M)
# non-figures that look like figures: versions, addresses, section numbers, goals, hyperparameters and settings
SETTING = r"(?:\blr|λ|α|β\d?|δ|ε|ρ|τ|σ|\bc|\br|\bs|\bk|\bm|clip|eps|wd|gain|temperature|decay|ratio|momentum|EMA)"
GOAL = r"(?:≤|≥)\s?\d*\.?\d+(?:×|%)?"
ALLOWED = [
    r"§\s?\d+(?:\.\d+)*", r"arXiv \d+\.\d+", r"Python ≥ 3\.\d+", r"127\.0\.0\.1",  # versions, addresses
    rf"{SETTING}\s?(?:=|≤|≥|∈)?\s?\d*\.?\d+(?:e-\d+)?", r"\d+% (?:training )?label noise",  # settings
    rf"(?i:goal|target)\s?\(?{GOAL}", rf"{GOAL} (?:target|goal)", r"of full cost, within 0\.5 points\)",
    r"0\.2·(?:sqrt|η)", r"label-smoothed \(0\.1\)", r"GAE\(0\.99, 0\.95\)",  # OLion's and Data Agent's constants
    r"Beta\(1\.69, 1\.69\) with mean 0\.5", r"0\.999³⁰⁰ ≈ 74 %",  # arithmetic, not measurements
    r"lossless at >50% saving", r"≥ 1× Chinchilla",  # the papers' claims, quoted as claims
    r"0\.1·lr",  # a schedule setting
    r"0\.02(?=²|/√| scale)",  # GPT-2's initialisation standard deviation (a setting)
    r"(?i:granite[ -]3\.1)",  # a model's name (IBM's Granite 3.1), not a figure
]


@dataclass
class Quote:
    where: str
    sources: list[str]
    command: str | None
    body: str


def quotes(text: str, where: str) -> list[Quote]:
    """The marked quotes of one Markdown text."""
    return [Quote(f"{where}:{text[:m.start()].count(chr(10)) + 1}", [s.strip() for s in m["sources"].split(",")],
                  m["cmd"], m["body"]) for m in QUOTE.finditer(text)]


def norm(token: str) -> str:
    """A decimal as quoted: sign dropped (prose says 'loses 2.83'), '.54' read as '0.54', rounding kept."""
    token = token.lstrip("+-−")
    return "0" + token if token.startswith(".") else token


def decimals(text: str) -> list[str]:
    return [norm(t) for t in DECIMAL.findall(text)]


def read_source(spec: str) -> str | None:
    """The text of `path` or of the `## section` of `path#section`; None when the file is not there."""
    path, _, section = spec.partition("#")
    file = REPO / path
    if not file.is_file():
        return None
    text = file.read_text()
    if section:
        found = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
        if found is None:
            names = re.findall(r"^## (.+)$", text, re.M)
            raise AssertionError(f"{path} has no section '## {section}'; its sections: {names}")
        text = found.group(1)
    return text


def json_numbers(value: object) -> list[float]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in json_numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in json_numbers(v)]
    return [float(value)] if isinstance(value, int | float) and not isinstance(value, bool) else []


def in_json(token: str, numbers: list[float]) -> bool:
    """A JSON float is quoted rounded: 0.7412 in the file matches '0.741'."""
    places = len(token.split("e")[0].partition(".")[2])
    if "e" in token:
        return any(f"{x:.{places}e}" == f"{float(token):.{places}e}" for x in numbers)
    return any(round(x, places) == round(float(token), places) for x in numbers)


def script_of(command: str) -> Path | None:
    """The file that a `python tools/x.py ...` or `python -m pkg.mod ...` command runs."""
    words = command.split()
    if "-m" in words[:-1]:
        return REPO / (words[words.index("-m") + 1].replace(".", "/") + ".py")
    return next((REPO / w for w in words if w.endswith(".py")), None)


def check(quote: Quote) -> list[str]:
    """What in one quote is not in its sources (empty: every figure is there)."""
    texts, numbers, problems = [], [], []
    for spec in quote.sources:
        text = read_source(spec)
        if text is None:
            script = script_of(quote.command) if quote.command else None
            if not spec.startswith("runs/"):
                problems.append(f"{quote.where}: source {spec} is not in the repository")
            elif script is None or not script.is_file():
                problems.append(f"{quote.where}: {spec} is not committed, so the quote must name the script that "
                                f"writes it ('; written by `python tools/...py`'); got {quote.command!r}")
            elif Path(spec).name not in script.read_text():
                problems.append(f"{quote.where}: {script.relative_to(REPO)} does not write a file named "
                                f"{Path(spec).name} ({spec})")
        elif spec.partition("#")[0].endswith(".json"):
            numbers += json_numbers(json.loads(text))
        else:
            texts.append(text)
    if len(texts) + len(numbers) == 0:
        return problems  # nothing to compare with: the sources are runs not made on this machine
    # a row quoted from a printed table keeps its order; a test's bounds are not laid out as a table
    tabular = not numbers and not any(spec.endswith(".py") for spec in quote.sources)
    lines = [decimals(line) for text in texts for line in text.splitlines()]
    known = {t for line in lines for t in line}
    body = quote.body.splitlines()
    for i, line in enumerate(body):
        tokens = decimals(without_allowed(line))
        if not tokens or re.fullmatch(r"\|[-:| ]+\|", line.strip()):
            continue
        if line.startswith("|") and i + 1 < len(body) and re.fullmatch(r"\|[-:| ]+\|", body[i + 1].strip()):
            continue  # a table header names columns
        if line.startswith("|") and tabular:
            if not any(subsequence(tokens, src) for src in lines):
                problems.append(f"{quote.where}: no line of {', '.join(quote.sources)} holds {tokens} in this order"
                                f" (row: {line.strip()[:90]})")
            continue
        missing = [t for t in tokens if t not in known and not in_json(t, numbers)]
        if missing:
            problems.append(f"{quote.where}: {missing} not in {', '.join(quote.sources)} (line: {line.strip()[:90]})")
    return problems


def subsequence(needle: list[str], hay: list[str]) -> bool:
    it = iter(hay)
    return all(t in it for t in needle)


def without_allowed(line: str) -> str:
    for allowed in ALLOWED:
        line = re.sub(allowed, "", line)
    return line


def unquoted_figures(text: str) -> list[str]:
    """Decimals and measured quantities outside quotes, examples, code and ALLOWED, one entry per line."""
    for pattern in (QUOTE, EXAMPLE, CODE):
        text = pattern.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = without_allowed(line)
        hits = DECIMAL.findall(line) + MEASURE.findall(line)
        if hits:
            found.append(f"line ~{number}: {hits} in {line.strip()[:100]!r}")
    return found


@pytest.mark.parametrize("doc", OWN_DOCS)
def test_every_quoted_figure_appears_in_its_source(doc):
    problems = [p for q in quotes((REPO / doc).read_text(), doc) for p in check(q)]
    assert not problems, "\n".join(problems) + (
        "\n(a source under runs/ is your own local run: update the quote if it is newer, else delete the stale run)"
        if any("runs/" in p for p in problems) else "")


@pytest.mark.parametrize("doc", OWN_DOCS)
def test_no_figure_is_retyped_outside_a_quote(doc):
    text = (REPO / doc).read_text()
    found = unquoted_figures(text)
    assert not found, (f"{doc} has figures outside a '<!-- figures from SOURCE -->' quote (quote them from "
                       f"BENCHMARKS.md or a file a named command writes, or add a non-figure to ALLOWED):\n"
                       + "\n".join(found))


def test_readme_quotes_every_benchmark_it_cites_from_benchmarks_md():
    cited = {s for q in quotes((REPO / "README.md").read_text(), "README.md") for s in q.sources}
    assert {"BENCHMARKS.md#optimizers", "BENCHMARKS.md#selection", "BENCHMARKS.md#kv_cache"} <= cited, cited


def test_a_retyped_benchmark_figure_is_reported():
    # a real line of BENCHMARKS.md's optimizers section passes; the same row with one decimal retyped (its last
    # digit changed, as a terminal's rounding would) is reported, naming the retyped figure
    source = read_source("BENCHMARKS.md#optimizers")
    row = next(line for line in source.splitlines() if len(decimals(line)) >= 2)
    assert check(Quote("real", ["BENCHMARKS.md#optimizers"], None, row + "\n")) == []
    token = DECIMAL.findall(row)[1]
    retyped = token[:-1] + str((int(token[-1]) + 1) % 10)
    while retyped in source:  # a figure that happens to appear elsewhere in the section would still be found
        retyped = retyped[:-1] + str((int(retyped[-1]) + 1) % 10)
    problems = check(Quote("retyped", ["BENCHMARKS.md#optimizers"], None, row.replace(token, retyped, 1) + "\n"))
    assert len(problems) == 1 and norm(retyped) in problems[0], problems


def test_an_uncommitted_source_must_name_a_script_that_writes_it():
    orphan = Quote("doc", ["runs/experiments/rlkv/table.md"], "python tools/experiments/nope.py", "| a | 0.999 |\n")
    assert "must name the script" in check(orphan)[0]
    wrong = Quote("doc", ["runs/experiments/rlkv/tabel.md"], "python tools/experiments/rlkv.py", "| a | 0.999 |\n")
    assert "does not write a file named tabel.md" in check(wrong)[0]


def test_code_is_not_a_figure_but_tables_and_prose_are():
    text = "| s | 0.5 |\n|---|---|\n`lr=0.05` and\n```bash\nrun --x 1.5\n```\nit took 75 s, 1.39× faster\n"
    assert unquoted_figures(text) == ["line ~1: ['0.5'] in '| s | 0.5 |'",
                                      "line ~7: ['1.39', '75 s'] in 'it took 75 s, 1.39× faster'"]
