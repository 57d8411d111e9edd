"""Variants as adapters over one base: the models file, the start-up checks, mixed-adapter passes against each
adapter's model run alone, the adapter slots, and a real worker serving variants from one load of their base."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from swapless.config.errors import ConfigError
from swapless.manager import ModelStore, WorkerLimits
from swapless.manager.demo.tiny import build_lora_adapter, build_text_classifier, write_models_file
from swapless.manager.frameworks.adapter_checks import adapter_reserve, quiet_peft
from swapless.manager.frameworks.transformers_worker import TransformerWorker

LABELS = ["neg", "pos"]
TEXTS = ["the cat sat on the mat", "good", "a b c d e f g", "hello world again", "rain", "the end of it all"]


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny base and three adapters over it (two with their own head), and a base of another size."""
    root = tmp_path_factory.mktemp("adapters")
    base = build_text_classifier(root / "base", labels=LABELS, seed=0)
    paths = {"base": base, "other": build_text_classifier(root / "other", preset="mini", labels=LABELS, seed=1)}
    for k in range(3):
        paths[f"a{k}"] = build_lora_adapter(base, root / f"a{k}", seed=10 + k, rank=4, head=k != 2)
    paths["a3"] = build_lora_adapter(base, root / "a3", seed=13, rank=2, targets=("key", "dense"))  # another shape
    paths["big"] = build_lora_adapter(paths["other"], root / "big", seed=20, rank=4)
    paths["root"] = root
    return paths


def models_file(family: dict[str, Path], variants: list[dict[str, Any]], name: str = "models") -> Path:
    base = {"id": "base", "name": "tiny", "type": "text", "framework": "transformers", "path": str(family["base"])}
    directory = family["root"] / name
    directory.mkdir(exist_ok=True)
    return write_models_file(directory, [base, *variants])


def variant(k: int, **extra: Any) -> dict[str, Any]:
    return {"id": f"v{k}", "base": "base", "adapter": f"../a{k}", **extra}


def reference(family: dict[str, Path], adapter: str | None, texts: list[str]) -> torch.Tensor:
    """The probabilities of the adapter's model run alone: a fresh base with only that adapter (or none)."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(family["base"])
    model = AutoModelForSequenceClassification.from_pretrained(family["base"]).eval()
    if adapter is not None:
        with quiet_peft():
            model = PeftModel.from_pretrained(model, family[adapter]).eval()
    with torch.inference_mode():
        encoded = tokenizer(texts, padding=True, return_tensors="pt")
        return torch.softmax(model(**encoded).logits.float(), dim=-1)


def loaded(store: ModelStore, limits: WorkerLimits | None = None) -> TransformerWorker:
    worker = TransformerWorker(store.get("base"), limits or WorkerLimits())
    worker.load()
    return worker


def scores(row: list[dict[str, Any]]) -> dict[str, float]:
    return {entry["label"]: entry["score"] for entry in row}


def test_variants_are_found_as_models_and_queued_with_their_base(family: dict[str, Path]) -> None:
    store = ModelStore.from_file(models_file(family, [variant(0, aliases=["fr"], labels=["non", "oui"]), variant(1)]))
    assert [spec.id for spec in store] == ["base"]  # what is placed, loaded and warmed: the base alone
    assert [v.id for v in store.variants("base")] == ["v0", "v1"]
    spec = store.get("fr")
    assert (spec.id, spec.base, spec.framework, spec.labels) == ("v0", "base", "transformers", ("non", "oui"))
    assert spec.adapter is not None and spec.adapter.resolve() == family["a0"].resolve()
    assert store.home("v1") == store.home("fr") == store.home("base") == "base"
    assert "v1" in store and store.resolve("fr") == "v0"


@pytest.mark.parametrize(("entry", "field", "says"), [
    ({"id": "v9", "base": "nope", "adapter": "../a0"}, "base", "unknown base model 'nope'"),
    ({"id": "base", "base": "base", "adapter": "../a0"}, None, "already used"),
    ({"id": "v9", "base": "base", "adapter": "../missing"}, "adapter", "does not exist"),
])
def test_a_bad_variant_entry_names_itself(family: dict[str, Path], entry: dict[str, Any], field: str | None,
                                          says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ModelStore.from_file(models_file(family, [entry], name=f"bad-{entry['id']}-{field}"))
    assert "v9" in str(caught.value) or "'base'" in str(caught.value)
    assert says in str(caught.value)


def test_an_adapter_of_another_base_size_or_label_count_is_refused_at_start_up(family: dict[str, Path]) -> None:
    store = ModelStore.from_file(models_file(family, [variant(0), {"id": "wrong", "base": "base", "adapter": "../big"}],
                                             name="mismatch"))
    with pytest.raises(ConfigError) as caught:
        adapter_reserve(store, 4)
    assert "variant 'wrong'" in str(caught.value) and "needs" in str(caught.value)

    store = ModelStore.from_file(models_file(family, [variant(0, labels=["a", "b", "c"])], name="labels"))
    with pytest.raises(ConfigError, match="3 labels for a head of 2 classes"):
        adapter_reserve(store, 4)

    store = ModelStore.from_file(models_file(family, [variant(0), variant(1), variant(2)], name="fine"))
    reserve, shapes = adapter_reserve(store, 2)
    assert set(shapes) == {"v0", "v1", "v2"} and shapes["v0"].rank == 4
    adapter_bytes = (family["a0"] / "adapter_model.safetensors").stat().st_size
    assert 0 < reserve["base"] < 3 * adapter_bytes  # two slots of the headed shape, one of the other


def test_a_mixed_batch_gives_each_input_its_own_adapters_answer(family: dict[str, Path]) -> None:
    store = ModelStore.from_file(models_file(family, [variant(0, labels=["non", "oui"]), variant(1), variant(2),
                                                      variant(3)]))
    worker = loaded(store)
    owners = [None, "v0", "v1", "v3", "v0", None]  # the base's own jobs ride in the same pass; v3 has another shape
    batch = [worker.prepare_for(store.get(o) if o else None, text) for o, text in zip(owners, TEXTS, strict=True)]
    rows = worker.predict(batch)
    for index, owner in enumerate(owners):
        expected = reference(family, None if owner is None else f"a{owner[1]}", [TEXTS[index]])[0]
        names = ["non", "oui"] if owner == "v0" else LABELS
        got = scores(rows[index])
        assert set(got) == set(names)
        for label_index, name in enumerate(names):
            assert got[name] == pytest.approx(float(expected[label_index]), abs=1e-5), (owner, TEXTS[index])
    assert worker.adapters is not None and worker.adapters.swap_ins == 3
    rows = worker.predict([worker.prepare_for(store.get("v2"), TEXTS[0])])  # without a head of its own: the base's
    expected = reference(family, "a2", [TEXTS[0]])[0]
    assert scores(rows[0])["pos"] == pytest.approx(float(expected[1]), abs=1e-5)
    plain = worker.predict([worker.prepare_for(None, text) for text in TEXTS[:2]])  # the base alone, as before
    base_ref = reference(family, None, TEXTS[:2])
    assert scores(plain[0])["pos"] == pytest.approx(float(base_ref[0][1]), abs=1e-5)


def test_more_variants_than_slots_run_in_turns_and_swap_in_from_host_memory(family: dict[str, Path]) -> None:
    store = ModelStore.from_file(models_file(family, [variant(0), variant(1)], name="slots"))
    worker = loaded(store, WorkerLimits(max_adapters=1))
    owners = ["v0", "v1", "v0", "v1"]
    rows = worker.predict([worker.prepare_for(store.get(o), t) for o, t in zip(owners, TEXTS, strict=False)])
    for index, owner in enumerate(owners):
        expected = reference(family, f"a{owner[1]}", [TEXTS[index]])[0]
        assert scores(rows[index])["pos"] == pytest.approx(float(expected[1]), abs=1e-5)
    assert worker.adapters is not None
    assert len(worker.adapters.resident()) == 1  # one slot: each variant came in its turn
    last = worker.adapters.resident()
    swaps = worker.adapters.swap_ins
    worker.predict([worker.prepare_for(store.get("v0"), "again")])
    assert worker.adapters.resident() == ["v0"]
    assert worker.adapters.swap_ins == swaps + (last != ["v0"])


def test_a_framework_without_adapters_fails_the_variants_job_alone(family: dict[str, Path]) -> None:
    from swapless.config.errors import InputError
    from swapless.manager.frameworks.worker import ModelWorker

    class Plain(ModelWorker):
        def load(self) -> None: ...
        def predict(self, batch: Any) -> list[Any]: return list(batch)
        def unload(self) -> None: ...

    store = ModelStore.from_file(models_file(family, [variant(0)], name="plain"))
    worker = Plain(store.get("base"))
    with pytest.raises(InputError, match="do not run adapters"):
        worker.prepare_for(store.get("v0"), "text")
    assert worker.prepare_for(None, "text") == "text"


def test_evicting_the_base_drops_its_adapters(family: dict[str, Path]) -> None:
    from swapless.manager import ModelEngine, ModelManager

    other = {"id": "other", "name": "tiny", "type": "text", "framework": "transformers", "path": str(family["other"])}
    path = models_file(family, [variant(0), other], name="evict")
    store = ModelStore.from_file(path)
    manager = ModelManager(store, ModelEngine(), max_models=1)
    with manager.use("base") as worker:
        worker.predict([worker.prepare_for(store.get("v0"), "text")])
        pool = worker.adapters
        assert pool is not None and pool.resident() == ["v0"]
    with manager.use("other"):
        pass
    assert manager.loaded_ids() == ["other"]
    assert worker.adapters is None  # unloaded with its base: slots and all


@pytest.mark.slow
def test_a_worker_serves_many_variants_from_one_load_of_their_base(
    family: dict[str, Path], swapless_env: dict[str, str], start_worker: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = models_file(family, [variant(0, labels=["non", "oui"]), variant(1), variant(2)], name="served")
    monkeypatch.setenv("SWAPLESS_MODELS_FILE", str(path))
    swapless_env["SWAPLESS_MODELS_FILE"] = str(path)
    from swapless.config.settings import get_settings
    from swapless.tasks.client import Client

    get_settings.cache_clear()
    worker = start_worker()
    client = Client()
    owners = ["v0", "v1", "v2", "base"] * 3
    jobs = client.submit_jobs([(o, TEXTS[i % len(TEXTS)]) for i, o in enumerate(owners)])
    results = client.gather(jobs, timeout=60)
    for index, (owner, stored) in enumerate(zip(owners, results, strict=True)):
        assert stored.model == owner
        result = stored.value
        adapter = None if owner == "base" else f"a{owner[1]}"
        expected = reference(family, adapter, [TEXTS[index % len(TEXTS)]])[0]
        names = ["non", "oui"] if owner == "v0" else LABELS
        assert scores(result)[names[1]] == pytest.approx(float(expected[1]), abs=1e-4), owner
    log = worker.log()
    assert log.count("loaded base (transformers)") == 1 and "loaded v" not in log
