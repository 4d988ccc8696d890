"""Every reference a reader meets in the code and docs resolves inside the repository.

Rules are cited by their anchor in specs/contract.md (``contract#<anchor>`` in code and JSON,
``contract.md#<anchor>`` links in Markdown). Section codes of the external specification text (``0x06C``)
and ``DESIGN §n`` references point outside the repository and must not come back.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "specs" / "contract.md"

SCANNED_DIRS = ("specround", "specs", "docs", "tests")
SCANNED_FILES = ("README.md", "CONTRIBUTING.md")
SUFFIXES = {".py", ".md", ".json", ".toml", ".txt", ".ini", ".mako", ".html"}

SECTION_CODE = re.compile(r"\b0x0[0-9][0-9A-Z]?\b")
"""A section code such as ``0x06C``, ``0x03`` or ``0x04G`` (not a hex literal like ``0x03707344``)."""
DESIGN_REF = re.compile(r"DESIGN\s*§|DESIGN\.md")
ANCHOR_REF = re.compile(r"contract(?:\.md)?#([A-Za-z0-9_-]+)")
ANCHOR_DEF = re.compile(r'<a id="([a-z0-9-]+)"></a>')


def scanned_files() -> list[Path]:
    """Every text file of the scanned places, this test excluded (it names the patterns it forbids)."""
    found = [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    for directory in SCANNED_DIRS:
        found += [p for p in (ROOT / directory).rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    this = Path(__file__).resolve()
    return sorted(p for p in found if p.resolve() != this and "__pycache__" not in p.parts)


def relative(path: Path) -> str:
    """The repository-relative path with forward slashes."""
    return path.relative_to(ROOT).as_posix()


def defined_anchors() -> set[str]:
    """The explicit anchors of specs/contract.md."""
    return set(ANCHOR_DEF.findall(CONTRACT.read_text(encoding="utf-8")))


def test_no_section_codes_or_design_references_remain() -> None:
    offending = []
    for path in scanned_files():
        name = relative(path)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if SECTION_CODE.search(line) or DESIGN_REF.search(line):
                offending.append(f"{name}:{number}: {line.strip()}")
    assert offending == [], "cite specs/contract.md anchors instead:\n" + "\n".join(offending)


def test_every_cited_anchor_exists_in_the_contract() -> None:
    anchors = defined_anchors()
    missing = []
    for path in scanned_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            where = f"{relative(path)}:{number}"
            missing += [f"{where}: {a}" for a in ANCHOR_REF.findall(line) if a not in anchors]
    assert missing == [], "anchors not defined in specs/contract.md:\n" + "\n".join(missing)


def test_contract_anchors_are_unique_and_each_rule_names_where_it_is_enforced() -> None:
    text = CONTRACT.read_text(encoding="utf-8")
    ids = ANCHOR_DEF.findall(text)
    assert len(ids) == len(set(ids)), sorted({a for a in ids if ids.count(a) > 1})
    group_names_a_path = False
    for block in re.split(r"^(?=##+ )", text, flags=re.M)[1:]:
        heading = block.splitlines()[0]
        assert ANCHOR_DEF.search(heading), f"heading without a stable anchor: {heading}"
        names_a_path = "`specround/" in block or "`tests/" in block
        if heading.startswith("## "):
            group_names_a_path = names_a_path
        else:
            assert names_a_path or group_names_a_path, f"no module named for: {heading}"


def test_the_code_actually_cites_the_contract() -> None:
    cited = {a for p in scanned_files() if p != CONTRACT for a in ANCHOR_REF.findall(p.read_text("utf-8"))}
    # Nearly every section is cited from the code or the other specs; at least the rule families are.
    assert {"staging", "fenced-publication", "sampler-law", "time-ledger", "failure-lab"} <= cited
    assert len(cited & defined_anchors()) >= 35


def test_every_path_the_contract_names_exists() -> None:
    named = set(re.findall(r"`((?:specround|tests)/[A-Za-z0-9_/.]*)`", CONTRACT.read_text(encoding="utf-8")))
    assert named, "the contract names no modules"
    assert sorted(p for p in named if not (ROOT / p).exists()) == []
