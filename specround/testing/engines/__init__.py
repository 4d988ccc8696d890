"""Engines shipped with the kit: a toy LM, a correct reference engine, and planted-bug engines."""

from specround.testing.engines.planted import EXPECTED_FAILURE, PlantedBug, PlantedBugEngine
from specround.testing.engines.reference import ReferenceEngine
from specround.testing.engines.toy import ToyLM

__all__ = ["EXPECTED_FAILURE", "PlantedBug", "PlantedBugEngine", "ReferenceEngine", "ToyLM"]
