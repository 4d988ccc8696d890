"""The checked-in JSON Schemas in specs/schemas are exactly what the models generate."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from specround.cli import app
from specround.specs_schemas import SCHEMA_MODELS, check_schemas, main, schema_documents, write_schemas

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "specs" / "schemas"


def test_checked_in_schemas_match_the_models() -> None:
    problems = check_schemas(SCHEMAS)
    assert problems == [], "\n".join(problems) + "\nregenerate with: specround schemas"


def test_every_model_has_a_schema_with_its_fields() -> None:
    documents = {name: json.loads(text) for name, text in schema_documents().items()}
    assert set(documents) == {f"{name}.schema.json" for name in SCHEMA_MODELS} | {"event.schema.json"}
    for name, model in SCHEMA_MODELS.items():
        schema = documents[f"{name}.schema.json"]
        assert schema["$id"] == f"specround:{name}"
        assert set(schema["properties"]) == set(model.model_fields), name
        required = {field for field, info in model.model_fields.items() if info.is_required()}
        assert set(schema.get("required", [])) == required, name
    kinds = set(documents["event.schema.json"]["discriminator"]["mapping"])
    assert kinds == {"request_opened", "round_ready", "round_verified", "round_decided", "round_staged",
                     "round_published"}  # fmt: skip


def test_the_check_catches_drift(tmp_path: Path) -> None:
    write_schemas(tmp_path)
    assert check_schemas(tmp_path) == [] and main(["--check", str(tmp_path)]) == 0
    stale = tmp_path / "round_decided.schema.json"
    stale.write_text(stale.read_text().replace('"accepted"', '"accepted_count"'))
    (tmp_path / "round_old.schema.json").write_text("{}")
    (tmp_path / "rng_counters.schema.json").unlink()
    problems = check_schemas(tmp_path)
    assert len(problems) == 3 and main(["--check", str(tmp_path)]) == 1
    runner = CliRunner()
    assert runner.invoke(app, ["schemas", str(tmp_path), "--check"]).exit_code == 1
    assert runner.invoke(app, ["schemas", str(tmp_path)]).exit_code == 0
    (tmp_path / "round_old.schema.json").unlink()
    assert runner.invoke(app, ["schemas", str(tmp_path), "--check"]).exit_code == 0
