"""The public API: the names embedders and auditors use, each resolving lazily to its definition."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import specround

PUBLIC_NAMES = {
    # errors
    "SpecroundError",
    "InputError",
    "StaleCoordinateError",
    "PublishConflictError",
    "StaleGenerationError",
    "InjectedFaultError",
    "EventLogError",
    "LogIntegrityError",
    # configuration
    "PAD_ID",
    "Layout",
    "TerminalKind",
    "ProcessorChain",
    "sampling_chain",
    "FaultPlan",
    "FaultPoint",
    # requests and their published state
    "RequestConfig",
    "RequestState",
    "SpeculativeCommit",
    "RoundCoordinate",
    # the controller and its step API
    "RoundController",
    "Step",
    "StepResult",
    "PendingStep",
    "RoundInput",
    "RoundProposal",
    "RoundVerification",
    "RoundResult",
    "RoundStatus",
    "KvInstruction",
    # event logs
    "EventLog",
    "MemoryEventLog",
    "SqlEventLog",
    # audit and replay
    "audit_log",
    "AuditReport",
    "AuditFinding",
    "replay_log",
    "verify_chain",
}

# Internals that left the top level, and the module each is still imported from.
INTERNALS = {
    "inverse_cdf": "specround.sampling.exact",
    "decide": "specround.sampling.exact",
    "decide_from_uniforms": "specround.sampling.exact",
    "accepts": "specround.sampling.exact",
    "uniforms": "specround.sampling.rng",
    "extract_verification": "specround.sampling.layouts",
    "visibility_mask": "specround.sampling.layouts",
    "SamplerBatch": "specround.sampling.types",
    "SamplerDecision": "specround.sampling.types",
    "Stream": "specround.sampling.types",
    "SoftmaxBackend": "specround.sampling.softmax",
    "build_processor": "specround.sampling.processors",
    "TargetModel": "specround.statemachine.model_ports",
    "Proposer": "specround.statemachine.model_ports",
}


def test_all_is_the_documented_surface() -> None:
    assert set(specround.__all__) == PUBLIC_NAMES
    assert len(specround.__all__) == len(PUBLIC_NAMES)  # no duplicates


def test_all_matches_the_export_table() -> None:
    assert set(specround.__all__) == set(specround._EXPORTS)


@pytest.mark.parametrize("name", sorted(INTERNALS))
def test_internals_are_not_top_level_but_stay_importable(name: str) -> None:
    assert name not in specround.__all__
    with pytest.raises(AttributeError):
        getattr(specround, name)
    assert hasattr(importlib.import_module(INTERNALS[name]), name)


def test_every_public_class_and_function_has_a_docstring() -> None:
    for name in specround.__all__:
        value = getattr(specround, name)
        if callable(value):
            assert (value.__doc__ or "").strip(), name


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
