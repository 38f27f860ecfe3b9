"""What the docs say about the code and the repository, checked where it can drift mechanically:
the lanes docs/architecture.md names, the packages of its layout, what `make lint` runs, and every
link and file path in README.md and docs/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()


def _names_on_line(text: str, start: str) -> tuple[str, ...]:
    """The code spans of the line that starts with ``start``, after its first one (which names
    the constant the line lists)."""
    (line,) = [ln for ln in text.splitlines() if ln.startswith(start)]
    return tuple(re.findall(r"`([^`]+)`", line)[1:])


def test_the_lanes_architecture_md_names_are_the_codes() -> None:
    from agents.intake import RUNNER_LANES
    from gpu_kernels.stages import LANES as STAGE_LANES

    assert _names_on_line(ARCHITECTURE, "- The runner's lanes") == RUNNER_LANES
    assert _names_on_line(ARCHITECTURE, "- The stage lanes") == STAGE_LANES


def _layout_block() -> str:
    section = ARCHITECTURE.split("## Packages and what each may import", 1)[1]
    return section.split("```", 2)[1]


def test_the_layout_names_every_top_level_package_and_only_those() -> None:
    named = set(re.findall(r"(?<![\w/])([a-z_]+)/(?= |$)", _layout_block(), flags=re.MULTILINE))
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert named == packages, "docs/architecture.md's package diagram and the repository's packages differ"


def test_every_subpackage_architecture_md_names_exists() -> None:
    for ref in set(re.findall(r"`((?:agents|blobio|gpu_kernels|lightbox|schemas|streams)/[\w/]*\w(?:\.py)?)/?`",
                              ARCHITECTURE)):
        assert (ROOT / ref).exists(), f"docs/architecture.md names {ref}, which does not exist"


def test_make_lint_is_what_the_docs_say() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    tools = re.findall(r"\$\(BIN\)/([\w-]+)", recipe)
    assert tools == ["ruff", "mypy", "lint-imports"]
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            if "make lint" in line and "#" in line:  # a command listing with its comment
                comment = line.split("#", 1)[1]
                assert all(word in comment for word in ("ruff", "mypy", "import-linter")), (doc.name, line)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_and_path_in_the_docs_exists(doc: Path) -> None:
    text = doc.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        assert dest.exists(), f"{doc.name} links to {target}, which does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{doc.name} links to {target}: no such heading"
    for path in set(re.findall(r"(?<![\w/.~-])((?:bench|tests|infra)/[\w/.*-]*[\w*])", text)):
        if "*" in path or path.endswith("/results") or "/results/" in path:
            continue  # globs and benchmark output folders
        made_from = ROOT / (path + ".example")  # a git-ignored file made from its example
        assert (ROOT / path).exists() or made_from.exists(), f"{doc.name} names {path}, which does not exist"


def test_dated_results_name_their_date_machine_and_commit() -> None:
    import json

    for path in sorted((ROOT / "bench" / "history").glob("*.json")):
        doc = json.loads(path.read_text())
        assert doc["command"].startswith("PYTHONPATH=. ") and (ROOT / doc["bench"]).is_file(), path.name
        for run in doc["runs"]:
            assert re.fullmatch(r"2\d{3}-\d\d-\d\d", run["date"]) and run["machine"], run
            assert re.fullmatch(r"[0-9a-f]{7,40}", run["recorded_in"]), run
            assert run["classes"] and all(v > 0 for c in run["classes"].values() for v in c.values()), run
