"""Routes over model versions and input types: the pure policy (``swapless.manager.registry.routing``) and the store's
checks of route entries. No Redis, no workers."""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from swapless.config.errors import ConfigError, InputError, UnknownModel
from swapless.manager.registry.routing import input_type, pick, shadows_of
from swapless.manager.registry.specs import InputType
from swapless.manager.registry.store import ModelStore

pytestmark = pytest.mark.images

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 64).decode()


def _models(tmp_path: Path, *routes: dict[str, Any]) -> Path:
    entries = [
        {"id": "sentiment-v1", "name": "a", "type": "text", "framework": "fake"},
        {"id": "sentiment-v2", "name": "b", "type": "text", "framework": "fake", "aliases": ["sv2"]},
        {"id": "sentiment-v3", "name": "c", "type": "text", "framework": "fake"},
        {"id": "vision", "name": "d", "type": "image", "framework": "fake"},
        *routes,
    ]
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": entries}))
    return path


def test_a_split_of_10000_jobs_follows_the_weights_within_1_5_points() -> None:
    weights = {"sentiment-v1": 90, "sentiment-v2": 10}
    counts = Counter(pick(weights, f"job-{i}") for i in range(10_000))
    assert abs(counts["sentiment-v1"] / 100 - 90) <= 1.5 and abs(counts["sentiment-v2"] / 100 - 10) <= 1.5, counts
    three = {"a": 1, "b": 2, "c": 5}  # any positive numbers
    counts = Counter(pick(three, f"job-{i}") for i in range(10_000))
    for target, weight in three.items():
        assert abs(counts[target] / 100 - 100 * weight / 8) <= 1.5, counts


def test_a_sticky_key_keeps_its_version_and_only_the_moved_share_moves() -> None:
    keys = [f"user-{i}" for i in range(10_000)]
    before = {key: pick({"v1": 90, "v2": 10}, key) for key in keys}
    assert before == {key: pick({"v2": 10, "v1": 90}, key) for key in keys}  # the same weights: the same picks
    after = {key: pick({"v1": 50, "v2": 50}, key) for key in keys}
    moved = [key for key in keys if before[key] != after[key]]
    assert all(before[key] == "v1" and after[key] == "v2" for key in moved)  # only towards the grown version
    assert abs(len(moved) / 100 - 40) <= 1.5  # the share that moved: 40 points of traffic
    # a third version added: keys move only to it
    added = {key: pick({"v1": 50, "v2": 50, "v3": 25}, key) for key in keys}
    assert all(added[key] in (after[key], "v3") for key in keys)


def test_shadow_copies_take_their_share_stably() -> None:
    picked = [shadows_of({"v3": 5}, f"job-{i}") for i in range(10_000)]
    assert abs(sum(1 for p in picked if p == ("v3",)) / 100 - 5) <= 1.5
    assert picked == [shadows_of({"v3": 5}, f"job-{i}") for i in range(10_000)]


def test_an_input_s_type_is_read_from_the_input() -> None:
    assert input_type("what a lovely day") is InputType.TEXT
    assert input_type(PNG) is InputType.IMAGE
    assert input_type("data:image/png;base64," + PNG) is InputType.IMAGE
    assert input_type("photos/cat.jpg") is InputType.IMAGE
    assert input_type("aGVsbG8gd29ybGQgaGVsbG8gd29ybGQ=") is InputType.TEXT  # base64, but of no image
    assert input_type(5) is None and input_type("  ") is None


def test_the_store_resolves_routes_by_weight_key_and_type(tmp_path: Path) -> None:
    store = ModelStore.from_file(_models(
        tmp_path,
        {"id": "sentiment", "route": {"sentiment-v1": 90, "sv2": 10}, "shadow": {"sentiment-v3": 100}},
        {"id": "classify", "by_type": {"text": "sentiment", "image": "vision"}},
    ))
    assert store.is_route("sentiment") and not store.is_route("sentiment-v1")
    served = store.route("sentiment", "hi", "user-7")
    assert served.model_id in ("sentiment-v1", "sentiment-v2") and served.shadows == ("sentiment-v3",)
    assert served.via == ("sentiment",)
    assert store.route("sentiment", "hi", "user-7") == served  # sticky
    assert store.route("sv2", "hi", "k").model_id == "sentiment-v2"  # an alias passes through, canonical
    overridden = store.route("sentiment", "hi", "user-7", overrides={"sentiment": {"sv2": 1}})
    assert overridden.model_id == "sentiment-v2"
    assert store.route("classify", PNG, "k").model_id == "vision"
    text = store.route("classify", "hello", "k")
    assert text.model_id in ("sentiment-v1", "sentiment-v2") and text.via == ("classify", "sentiment")
    with pytest.raises(InputError, match="route 'classify' takes text or image inputs, not a number input"):
        store.route("classify", 5, "k")
    with pytest.raises(UnknownModel, match=r"known: .*classify"):
        store.route("nope", "x", "k")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"id": "r", "route": {"ghost": 1}}, "models[4] (id 'r'), field 'route': unknown target 'ghost'"),
        ({"id": "r", "route": {"sentiment-v1": 0}}, "route weights must be positive numbers, not sentiment-v1=0"),
        ({"id": "r", "route": {"sentiment-v1": -2}}, "route weights must be positive numbers"),
        ({"id": "r", "route": {}}, "'route' names no target"),
        ({"id": "r", "route": {"sentiment-v1": 1, "vision": 1}}, "mixes text and image models"),
        ({"id": "r", "by_type": {"text": "vision"}}, "the 'text' branch goes to 'vision', which takes image inputs"),
        (
            {"id": "sentiment-v1", "route": {"sentiment-v2": 1}},
            "id is already used by a model, an alias or another route",
        ),
        ({"id": "sv2", "route": {"sentiment-v1": 1}}, "id is already used by a model, an alias or another route"),
        ({"id": "r", "route": {"sentiment-v1": 1}, "shadow": {"sentiment-v2": 150}}, "shadow shares are percents"),
        ({"id": "r", "route": {"sentiment-v1": 1}, "by_type": {"text": "sentiment-v1"}}, "either 'route'"),
        ({"id": "r", "route": {"sentiment-v1": 1}, "weights": 3}, "field 'weights': Extra inputs are not permitted"),
    ],
)
def test_each_bad_route_is_an_error_naming_the_entry_and_field(
    tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        ModelStore.from_file(_models(tmp_path, entry))
    assert message in str(caught.value)
    assert "models[4] (id" in str(caught.value)


def test_routes_that_cycle_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"routes form a cycle: a -> b -> a"):
        ModelStore.from_file(
            _models(tmp_path, {"id": "a", "route": {"b": 1}}, {"id": "b", "route": {"a": 1, "sentiment-v1": 1}})
        )
