"""ModelStore and the models file: validation errors name the entry and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swapless.config.errors import ConfigError, UnknownModel
from swapless.config.settings import DEFAULT_MODELS_FILE
from swapless.manager import ModelEngine, ModelStore


def write(tmp_path: Path, models: object) -> Path:
    path = tmp_path / "models.json"
    path.write_text(json.dumps(models))
    return path


def entry(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {"id": "m1", "name": "bert", "type": "text", "framework": "transformers"}
    base.update(fields)
    return base


def test_shipped_registry_has_the_four_original_models() -> None:
    store = ModelStore.from_file(DEFAULT_MODELS_FILE, ModelEngine().frameworks)
    assert [spec.framework for spec in store] == ["transformers", "transformers", "torchvision", "triton"]
    assert store.get("sentiment").name == "distilbert-base-uncased-finetuned-sst-2-english"
    assert store.get("spam").name == "mrm8488/bert-tiny-finetuned-sms-spam-detection"
    assert store.get("mobilenet").name == "mobilenet_v2"
    assert store.get("densenet").name == "densenet_onnx"
    assert store.resolve("sentiment") == "550e8400-e29b-41d4-a716-446655440000"


def test_unknown_model_lists_known_ids_and_is_a_key_error(tmp_path: Path) -> None:
    store = ModelStore.from_file(write(tmp_path, {"models": [entry(), entry(id="m2")]}))
    with pytest.raises(KeyError) as caught:
        store.get("m3")
    assert isinstance(caught.value, UnknownModel)
    assert str(caught.value) == "unknown model 'm3' (known: m1, m2)"


def test_unknown_key_names_entry_and_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        ModelStore.from_file(write(tmp_path, {"models": [entry(), entry(id="m2", colour="red")]}))
    message = str(caught.value)
    assert "models[1] (id 'm2'), field 'colour'" in message
    assert "Extra inputs are not permitted" in message


def test_duplicate_id(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"models\[1\] \(id 'm1'\): duplicate id"):
        ModelStore.from_file(write(tmp_path, {"models": [entry(), entry()]}))


def test_unknown_framework_lists_known_frameworks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        ModelStore.from_file(write(tmp_path, {"models": [entry(framework="onnx")]}), ModelEngine().frameworks)
    assert "models[0] (id 'm1'), field 'framework'" in str(caught.value)
    assert "unknown framework 'onnx' (known: " in str(caught.value)
    assert "transformers" in str(caught.value)


def test_missing_path_names_entry_and_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        ModelStore.from_file(write(tmp_path, {"models": [entry(path="weights/nowhere")]}))
    assert "models[0] (id 'm1'), field 'path'" in str(caught.value)
    assert str(tmp_path / "weights" / "nowhere") in str(caught.value)


def test_relative_path_is_resolved_against_the_models_file(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    store = ModelStore.from_file(write(tmp_path, {"models": [entry(path="weights")]}))
    assert store.get("m1").path == tmp_path / "weights"


def test_bad_type_and_missing_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"models\[0\] \(id 'm1'\), field 'type'"):
        ModelStore.from_file(write(tmp_path, {"models": [entry(type="audio")]}))
    bad = entry()
    del bad["name"]
    with pytest.raises(ConfigError, match=r"models\[0\] \(id 'm1'\), field 'name': Field required"):
        ModelStore.from_file(write(tmp_path, {"models": [bad]}))


def test_not_json_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "models.json"
    path.write_text("{ nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelStore.from_file(path)
    with pytest.raises(ConfigError, match="models file not found; set SWAPLESS_MODELS_FILE or --models"):
        ModelStore.from_file(tmp_path / "absent.json")


def test_aliases_resolve_and_may_not_collide(tmp_path: Path) -> None:
    store = ModelStore.from_file(write(tmp_path, {"models": [entry(aliases=["sentiment"])]}))
    assert store.get("sentiment").id == "m1"
    assert "sentiment" in store and "m1" in store and "m2" not in store
    with pytest.raises(ConfigError, match="alias 'm1' is already used"):
        ModelStore.from_file(write(tmp_path, {"models": [entry(), entry(id="m2", aliases=["m1"])]}))


def test_dtype_is_one_of_three_and_not_for_triton(tmp_path: Path) -> None:
    assert ModelStore.from_file(write(tmp_path, {"models": [entry(dtype="float16")]})).get("m1").dtype == "float16"
    with pytest.raises(
        ConfigError, match=r"models\[0\] \(id 'm1'\), field 'dtype': .*'float32', 'float16' or 'bfloat16'"
    ):
        ModelStore.from_file(write(tmp_path, {"models": [entry(dtype="float8")]}))
    with pytest.raises(ConfigError, match="dtype is for transformers and torchvision models"):
        ModelStore.from_file(write(tmp_path, {"models": [entry(framework="triton", dtype="float16")]}))
