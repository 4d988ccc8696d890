"""The public API: every exported name resolves, lazily, to the object its module defines."""

from __future__ import annotations

import importlib
import subprocess
import sys

import specround


def test_all_matches_the_export_table() -> None:
    assert set(specround.__all__) == set(specround._EXPORTS)


def test_every_public_name_resolves_to_its_definition() -> None:
    for name, module in specround._EXPORTS.items():
        assert getattr(specround, name) is getattr(importlib.import_module(module), name), name


def test_importing_the_package_does_not_load_the_database_layer() -> None:
    code = "import sys, specround; print('sqlalchemy' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_unknown_names_raise_attribute_error() -> None:
    try:
        specround.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
