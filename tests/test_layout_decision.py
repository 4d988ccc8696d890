"""The layout decision is written once: production code asks :mod:`specround.sampling.layouts` instead of
comparing layouts itself (the checkers under ``model_check/`` restate the contract on purpose, to check
it)."""

from __future__ import annotations

import ast
from pathlib import Path

import specround

PACKAGE = Path(specround.__file__).parent
DECIDES = Path("sampling/layouts.py")
INDEPENDENT = ("model_check",)


def _layout_comparisons(path: Path) -> list[int]:
    """Lines of ``path`` that compare something with a ``Layout`` member or a layout's name."""
    names = {"REPLAY_FRONTIER", "RETAINED_FRONTIER"}
    values = {"replay_frontier", "retained_frontier"}
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        for operand in (node.left, *node.comparators):
            named = isinstance(operand, ast.Attribute) and operand.attr in names
            literal = isinstance(operand, ast.Constant) and operand.value in values
            if named or literal:
                lines.append(node.lineno)
    return lines


def test_only_the_layouts_module_compares_layouts() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in INDEPENDENT:
            continue
        lines = _layout_comparisons(path)
        if lines:
            found[str(relative)] = lines
    assert list(found) == [str(DECIDES)], found
    assert len(found[str(DECIDES)]) == 1  # replays_frontier, the one decision
