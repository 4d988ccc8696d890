"""A module's file name says what it holds: no two modules of the package share a basename.

Two ``chain.py`` (a hash chain and a processor chain) or three ``stats.py`` make a reader open the wrong
file and make tracebacks, coverage tables and editor tabs ambiguous. Package markers (``__init__.py``,
``__main__.py``) are exempt, and so is each file of :data:`ALLOWED`, each with the reason its name is fixed.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import specround

PACKAGE = Path(specround.__file__).parent
ROOT = PACKAGE.parent

MARKERS = frozenset({"__init__.py", "__main__.py"})

ALLOWED: dict[str, str] = {
    "specround/hf/custom_generate/generate.py": (
        "transformers' custom_generate loads the entry point from a file named generate.py"
    ),
    "specround/model_check/mutants/processors.py": (
        "the mutants package has one module per family, named after what it mutates; "
        "hf/processors.py holds the real processors of a transformers config"
    ),
}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name not in MARKERS)


def _colliding(modules: list[Path]) -> dict[str, list[str]]:
    """Basenames shared by two or more modules, once the allowed files are set aside."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in modules:
        relative = path.relative_to(ROOT).as_posix()
        if relative not in ALLOWED:
            by_name[path.name].append(relative)
    return {name: paths for name, paths in by_name.items() if len(paths) > 1}


def test_no_two_modules_share_a_basename() -> None:
    """Every module basename of the package is unique (markers and the allowed files aside)."""
    assert _colliding(_modules()) == {}


def test_every_allowed_file_exists_and_still_collides() -> None:
    """An allow-list entry names a real module whose basename another module shares; stale entries fail."""
    modules = _modules()
    names = [p.name for p in modules]
    relatives = {p.relative_to(ROOT).as_posix() for p in modules}
    for allowed, reason in ALLOWED.items():
        assert allowed in relatives, allowed
        assert names.count(Path(allowed).name) > 1, f"{allowed} no longer collides; drop it from ALLOWED"
        assert reason


def test_the_scan_finds_a_collision() -> None:
    """The scan itself sees a shared basename (so an empty result above means something)."""
    fake = [PACKAGE / "a" / "stats.py", PACKAGE / "b" / "stats.py", PACKAGE / "c" / "other.py"]
    assert _colliding(fake) == {"stats.py": ["specround/a/stats.py", "specround/b/stats.py"]}
