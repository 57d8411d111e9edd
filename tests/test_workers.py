"""TransformerWorker and TorchVisionWorker on small real models with random weights.

The models come from ``tests.tinymodels`` (built once per session, saved like real checkpoints) and reach the
workers through the real config path: ``ModelStore.from_file(models.json)`` and ``ModelEngine``. Expected outputs
are computed here with plain transformers / torchvision code, one input at a time.
"""

from __future__ import annotations

import base64
import io
import re
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from swapless.config.errors import InputError, ModelLoadError
from swapless.manager.frameworks.engine import ModelEngine
from swapless.manager.frameworks.torchvision_worker import TorchVisionWorker
from swapless.manager.frameworks.transformers_worker import TransformerWorker
from swapless.manager.frameworks.worker import ModelWorker, WorkerLimits
from swapless.manager.registry.store import ModelStore
from tests.tinymodels import TEXT_MODELS, encode_image

pytestmark = pytest.mark.images

# The session fixtures ``tiny_models_dir`` and ``models_file`` come from tests.tinymodels (see conftest.py).

TOLERANCE = 1e-5
TEXTS = [
    "i love this movie",
    "terrible",
    "win a free prize now, click here to claim your cash!",
    "the government and the minister said the economy is in a good season for the market this year",
    "Hello World",
    # Longer than the tiny tokenizer's 128 tokens: the worker must truncate exactly like a direct call.
    " ".join(["the team won the match and the league"] * 30),
    "qwzxv blorp",
]
IMAGES = [
    encode_image(10),
    encode_image(11, size=(32, 80)),
    encode_image(12, size=(300, 200), fmt="JPEG"),
    encode_image(13, size=(17, 17), fmt="WEBP"),
    encode_image(14, size=(224, 224), fmt="BMP"),
]


# -- helpers ------------------------------------------------------------------------------------------------------


def build_worker(models_file: Path, model_id: str, limits: WorkerLimits | None = None) -> ModelWorker:
    """An unloaded worker for ``model_id``, built the way the service builds it."""
    engine = ModelEngine(limits)
    store = ModelStore.from_file(models_file, engine.frameworks)
    return engine.build(store.get(model_id))


def expected_rows(probabilities: torch.Tensor, labels: Sequence[str], k: int) -> list[dict[str, Any]]:
    """The ``k`` best labels of one probability vector, best first."""
    scores, indices = probabilities.topk(min(k, probabilities.shape[-1]))
    return [{"label": labels[i], "score": s} for s, i in zip(scores.tolist(), indices.tolist(), strict=True)]


def assert_rows_close(actual: list[list[dict[str, Any]]], expected: list[list[dict[str, Any]]]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert [row["label"] for row in got] == [row["label"] for row in want]
        for got_row, want_row in zip(got, want, strict=True):
            assert set(got_row) == {"label", "score"}
            assert isinstance(got_row["score"], float)
            assert got_row["score"] == pytest.approx(want_row["score"], abs=TOLERANCE)


def assert_sorted_rows(rows: list[dict[str, Any]], k: int, known_labels: Sequence[str]) -> None:
    assert len(rows) == k
    scores = [row["score"] for row in rows]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= score <= 1.0 for score in scores)
    assert {row["label"] for row in rows} <= set(known_labels)


def torch_module(worker: ModelWorker) -> torch.nn.Module:
    """The loaded torch module of an in-process worker (its public ``model`` attribute)."""
    assert isinstance(worker, TransformerWorker | TorchVisionWorker)
    module: torch.nn.Module = worker.model
    return module


def tensor_bytes(module: torch.nn.Module) -> int:
    """Parameter and buffer bytes of a module, each tensor once."""
    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def direct_text(model_dir: Path, texts: Sequence[str]) -> tuple[list[list[dict[str, Any]]], list[str]]:
    """Expected top-5 rows for ``texts``, each run alone through plain transformers code; and the label names."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    rows = []
    with torch.inference_mode():
        for text in texts:
            encoded = tokenizer(text, truncation=True, max_length=tokenizer.model_max_length, return_tensors="pt")
            rows.append(expected_rows(torch.softmax(model(**encoded).logits[0], dim=-1), labels, 5))
    return rows, labels


def direct_vision(weights_file: Path, images: Sequence[str]) -> tuple[list[list[dict[str, Any]]], list[str]]:
    """Expected top-5 rows for base64 ``images``, each run alone through plain torchvision code; and the labels."""
    import torchvision
    from PIL import Image
    from safetensors.torch import load_file

    weights = torchvision.models.MobileNet_V2_Weights.DEFAULT
    model = torchvision.models.mobilenet_v2(weights=None, num_classes=1000)
    model.load_state_dict(load_file(str(weights_file)))
    model.eval()
    transform = weights.transforms()
    labels = list(weights.meta["categories"])
    rows = []
    with torch.inference_mode():
        for image in images:
            pixels = Image.open(io.BytesIO(base64.b64decode(image))).convert("RGB")
            logits = model(transform(pixels).unsqueeze(0))[0]
            rows.append(expected_rows(torch.softmax(logits, dim=-1), labels, 5))
    return rows, labels


@pytest.fixture(scope="module")
def loaded(models_file: Path) -> Iterator[dict[str, ModelWorker]]:
    """One loaded worker per tiny model, with default limits, shared by the read-only tests of this module."""
    workers = {model_id: build_worker(models_file, model_id) for model_id in ("sentiment", "spam", "topic", "vision")}
    for worker in workers.values():
        worker.load()
    yield workers
    for worker in workers.values():
        worker.unload()


# -- the models themselves ----------------------------------------------------------------------------------------


def test_models_file_lists_the_tiny_models(models_file: Path) -> None:
    store = ModelStore.from_file(models_file, ModelEngine().frameworks)
    assert store.ids() == ["sentiment", "spam", "topic", "vision"]
    assert [spec.framework for spec in store] == ["transformers", "transformers", "transformers", "torchvision"]
    for spec in store:
        assert spec.path is not None and spec.path.is_absolute() and spec.path.exists()
    assert isinstance(build_worker(models_file, "topic"), TransformerWorker)
    assert isinstance(build_worker(models_file, "vision"), TorchVisionWorker)


@pytest.mark.parametrize("model_id", list(TEXT_MODELS))
def test_tokenizer_has_the_generated_vocabulary(tiny_models_dir: Path, model_id: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_models_dir / model_id))
    assert len(tokenizer) == 3000
    assert tokenizer.model_max_length == 128
    first = tokenizer("i love this movie")["input_ids"]
    second = tokenizer("win a free prize now")["input_ids"]
    assert first != second
    assert tokenizer.unk_token_id not in first + second
    assert tokenizer.convert_ids_to_tokens(first) == ["[CLS]", "i", "love", "this", "movie", "[SEP]"]
    # Unknown lowercase words split into word pieces instead of becoming [UNK].
    assert tokenizer.unk_token_id not in tokenizer("qwzxv blorp")["input_ids"]


# -- text ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_id", list(TEXT_MODELS))
def test_text_batch_matches_direct_calls_one_by_one(
    loaded: dict[str, ModelWorker], tiny_models_dir: Path, model_id: str
) -> None:
    worker = loaded[model_id]
    expected, labels = direct_text(tiny_models_dir / model_id, TEXTS)
    assert labels == TEXT_MODELS[model_id][1]

    outputs = worker.predict([worker.prepare(text) for text in TEXTS])

    assert len(outputs) == len(TEXTS)
    for rows in outputs:
        # top_k defaults to 5, capped at the number of labels (2 or 4 here).
        assert_sorted_rows(rows, min(5, len(labels)), labels)
        assert sum(row["score"] for row in rows) == pytest.approx(1.0, abs=TOLERANCE)
    assert_rows_close(outputs, expected)


def test_different_texts_give_different_scores(loaded: dict[str, ModelWorker]) -> None:
    worker = loaded["sentiment"]
    outputs = worker.predict(TEXTS)
    scores = [{row["label"]: row["score"] for row in rows}["POSITIVE"] for rows in outputs]
    assert len({round(score, 7) for score in scores}) == len(TEXTS)


def test_text_max_batch_size_gives_the_same_answers(loaded: dict[str, ModelWorker], models_file: Path) -> None:
    small = build_worker(models_file, "topic", WorkerLimits(max_batch_size=2))
    assert small.batch_size == 2
    small.load()
    try:
        assert_rows_close(small.predict(TEXTS), loaded["topic"].predict(TEXTS))
    finally:
        small.unload()


def test_text_top_k_from_the_models_entry(models_file: Path) -> None:
    engine = ModelEngine()
    spec = ModelStore.from_file(models_file, engine.frameworks).get("topic").model_copy(update={"top_k": 1})
    worker = engine.build(spec)
    worker.load()
    try:
        outputs = worker.predict(["the team won the match"])
    finally:
        worker.unload()
    assert len(outputs) == 1 and len(outputs[0]) == 1
    assert outputs[0][0]["label"] in TEXT_MODELS["topic"][1]


# -- images -------------------------------------------------------------------------------------------------------


def test_image_batch_matches_direct_calls_one_by_one(loaded: dict[str, ModelWorker], tiny_models_dir: Path) -> None:
    worker = loaded["vision"]
    expected, labels = direct_vision(tiny_models_dir / "vision" / "mobilenet_v2.safetensors", IMAGES)
    assert len(labels) == 1000 and labels[0] == "tench"

    outputs = worker.predict([worker.prepare(image) for image in IMAGES])

    assert len(outputs) == len(IMAGES)
    for rows in outputs:
        assert_sorted_rows(rows, 5, labels)
    assert_rows_close(outputs, expected)
    assert outputs[0] != outputs[1]


def test_image_data_url_prefix_is_accepted(loaded: dict[str, ModelWorker]) -> None:
    worker = loaded["vision"]
    plain, prefixed = worker.predict([worker.prepare(IMAGES[0]), worker.prepare("data:image/png;base64," + IMAGES[0])])
    assert_rows_close([prefixed], [plain])


def test_image_max_batch_size_gives_the_same_answers(loaded: dict[str, ModelWorker], models_file: Path) -> None:
    small = build_worker(models_file, "vision", WorkerLimits(max_batch_size=2))
    small.load()
    try:
        outputs = small.predict([small.prepare(image) for image in IMAGES])
    finally:
        small.unload()
    reference = loaded["vision"]
    assert_rows_close(outputs, reference.predict([reference.prepare(image) for image in IMAGES]))


# -- memory and the load / unload cycle ---------------------------------------------------------------------------


@pytest.mark.parametrize("model_id", ["sentiment", "topic", "vision"])
def test_unload_frees_the_model_and_load_works_again(models_file: Path, model_id: str) -> None:
    worker = build_worker(models_file, model_id)
    inputs = TEXTS[:3] if model_id != "vision" else IMAGES[:2]
    assert worker.memory_bytes == 0

    worker.load()
    size = tensor_bytes(torch_module(worker))
    assert size > 0
    assert worker.memory_bytes == size
    before = worker.predict([worker.prepare(value) for value in inputs])
    module = weakref.ref(torch_module(worker))

    worker.unload()
    assert worker.memory_bytes == 0
    assert module() is None, "the torch module is still referenced after unload()"
    worker.unload()  # safe to call twice
    assert worker.memory_bytes == 0

    worker.load()
    try:
        assert worker.memory_bytes == size
        assert_rows_close(worker.predict([worker.prepare(value) for value in inputs]), before)
    finally:
        worker.unload()


@pytest.mark.parametrize(
    ("model_id", "problem"), [("sentiment", "does not exist"), ("vision", "No such file or directory")]
)
def test_missing_model_path_is_a_load_error_naming_the_model(
    models_file: Path, tmp_path: Path, model_id: str, problem: str
) -> None:
    engine = ModelEngine()
    spec = ModelStore.from_file(models_file, engine.frameworks).get(model_id)
    missing = tmp_path / "gone" / (spec.path.name if spec.path else "model")
    worker = engine.build(spec.model_copy(update={"path": missing}))

    with pytest.raises(ModelLoadError) as caught:
        worker.load()

    assert caught.value.model_id == model_id
    assert str(caught.value).startswith(f"could not load model {model_id!r}: ")
    assert str(missing) in str(caught.value)
    assert problem in str(caught.value)
    assert worker.memory_bytes == 0


def test_weights_file_without_a_state_dict_is_a_load_error_naming_the_model(models_file: Path, tmp_path: Path) -> None:
    engine = ModelEngine()
    spec = ModelStore.from_file(models_file, engine.frameworks).get("vision")
    weights = tmp_path / "weights.pt"
    torch.save([1, 2, 3], weights)
    worker = engine.build(spec.model_copy(update={"path": weights}))

    with pytest.raises(ModelLoadError) as caught:
        worker.load()

    assert str(caught.value) == f"could not load model 'vision': {weights} does not hold a state dict"


class _PlantsAMarker:
    """A pickle whose loading creates a file: what a malicious weights file would do with real code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (Path.touch, (self.marker,))


def test_a_weights_file_with_pickled_code_is_refused_and_the_code_never_runs(models_file: Path, tmp_path: Path) -> None:
    engine = ModelEngine()
    spec = ModelStore.from_file(models_file, engine.frameworks).get("vision")
    marker = tmp_path / "pickled-code-ran"
    weights = tmp_path / "weights.pt"
    torch.save({"features.0.0.weight": _PlantsAMarker(marker)}, weights)
    torch.load(str(weights), weights_only=False)  # the premise: a plain unpickling runs the code
    assert marker.exists()
    marker.unlink()
    worker = engine.build(spec.model_copy(update={"path": weights}))

    with pytest.raises(ModelLoadError) as caught:
        worker.load()

    assert str(caught.value) == (f"could not load model 'vision': {weights} holds pickled objects, not only tensors, "
                                 "and is refused (its code is never run); save the weights as safetensors, or as a "
                                 "plain state dict")
    assert not marker.exists()
    assert worker.memory_bytes == 0


def test_weights_of_another_architecture_are_a_load_error(models_file: Path) -> None:
    engine = ModelEngine()
    spec = ModelStore.from_file(models_file, engine.frameworks).get("vision")
    worker = engine.build(spec.model_copy(update={"name": "resnet18"}))

    with pytest.raises(ModelLoadError) as caught:
        worker.load()

    assert str(caught.value).startswith("could not load model 'vision': Error(s) in loading state_dict for ResNet")
    assert worker.memory_bytes == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_out_of_memory_on_load_reaches_the_cache_unwrapped(models_file: Path) -> None:
    # The cache evicts idle models and retries a load that ran out of memory; a ModelLoadError would stop that.
    worker = build_worker(models_file, "vision", WorkerLimits(device="cuda"))
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1e-5)  # far below mobilenet_v2's 14 MB on any GPU
    try:
        with pytest.raises(torch.OutOfMemoryError):
            worker.load()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        worker.unload()
    assert worker.memory_bytes == 0


# -- bad inputs ---------------------------------------------------------------------------------------------------

TEXT_MODEL_ERRORS = [
    (42, "this is a text model; send a string, not a number"),
    (None, "this is a text model; send a string, not null"),
    ({"text": "hi"}, "this is a text model; send a string, not an object"),
    (["hi"], "this is a text model; send a string, not a list"),
    ("", "empty text; send at least one non-blank character"),
    ("  \n\t ", "empty text; send at least one non-blank character"),
]


@pytest.mark.parametrize(("value", "problem"), TEXT_MODEL_ERRORS)
def test_bad_text_input(loaded: dict[str, ModelWorker], value: Any, problem: str) -> None:
    with pytest.raises(InputError) as caught:
        loaded["spam"].prepare(value)
    assert str(caught.value) == f"bad input for model 'spam': {problem}"
    assert caught.value.model_id == "spam"


def test_text_over_the_character_limit(models_file: Path) -> None:
    worker = build_worker(models_file, "sentiment", WorkerLimits(max_text_chars=20))
    assert worker.prepare("x" * 20) == "x" * 20
    with pytest.raises(InputError) as caught:
        worker.prepare("x" * 21)
    assert str(caught.value) == (
        "bad input for model 'sentiment': text of 21 characters is over the limit of 20 (SWAPLESS_MAX_TEXT_CHARS)"
    )


def _truncated(image: str, keep: int) -> str:
    return base64.b64encode(base64.b64decode(image)[:keep]).decode("ascii")


IMAGE_MODEL_ERRORS = [
    ({"image": IMAGES[0]}, "this is an image model; send a base64 string of a PNG/JPEG/WebP, not an object"),
    (7, "this is an image model; send a base64 string of a PNG/JPEG/WebP, not a number"),
    ("", "empty image; send a base64 string of a PNG/JPEG/WebP"),
    ("a photo of a cat", "image is not valid base64; this is an image model (did you send plain text or a file path?)"),
    (
        "/data/cat.png",
        ("'/data/cat.png' is not valid base64 and looks like a file path, but this worker reads no files: set "
         "SWAPLESS_INPUT_ROOT on the worker to a directory, and send paths under it"),
    ),
    (
        base64.b64encode(b"these bytes are not an image at all").decode("ascii"),
        "the bytes are not an image Pillow can read (PNG, JPEG, WEBP, GIF, BMP)",
    ),
]


@pytest.mark.parametrize(("value", "problem"), IMAGE_MODEL_ERRORS)
def test_bad_image_input(loaded: dict[str, ModelWorker], value: Any, problem: str) -> None:
    with pytest.raises(InputError) as caught:
        loaded["vision"].prepare(value)
    assert str(caught.value) == f"bad input for model 'vision': {problem}"


@pytest.mark.parametrize(
    ("image", "keep"),
    [
        (IMAGES[0], 4000),  # PNG cut inside its pixel data
        (IMAGES[0], 20),  # PNG cut inside its header
        (IMAGES[2], 300),  # JPEG cut inside its header
        (IMAGES[3], 30),  # WebP cut short
    ],
    ids=["png-data", "png-header", "jpeg-header", "webp"],
)
def test_truncated_image(loaded: dict[str, ModelWorker], image: str, keep: int) -> None:
    with pytest.raises(InputError) as caught:
        loaded["vision"].prepare(_truncated(image, keep))
    assert re.fullmatch(r"bad input for model 'vision': image data is truncated or corrupt \(.+\)", str(caught.value))


def test_image_over_the_pixel_limit(models_file: Path) -> None:
    worker = build_worker(models_file, "vision", WorkerLimits(max_image_pixels=64 * 48 - 1))
    worker.load()
    try:
        with pytest.raises(InputError) as caught:
            worker.prepare(encode_image(1, size=(64, 48)))
        assert str(caught.value) == (
            "bad input for model 'vision': image of 64x48 pixels is over the limit of 3071 pixels "
            "(SWAPLESS_MAX_IMAGE_PIXELS)"
        )
        assert worker.predict([worker.prepare(encode_image(1, size=(63, 48)))])[0]
    finally:
        worker.unload()


def test_image_over_the_byte_limit(models_file: Path) -> None:
    worker = build_worker(models_file, "vision", WorkerLimits(max_image_bytes=1000))
    image = encode_image(1)
    with pytest.raises(InputError) as caught:
        worker.prepare(image)
    assert str(caught.value) == (
        f"bad input for model 'vision': encoded image of about {len(image) * 3 // 4} bytes is over the limit of "
        "1000 bytes (SWAPLESS_MAX_IMAGE_BYTES)"
    )


@pytest.mark.parametrize("model_id", ["topic", "vision"])
def test_a_dtype_in_the_models_entry_is_applied_at_load(
    loaded: dict[str, ModelWorker], models_file: Path, model_id: str
) -> None:
    engine = ModelEngine()
    spec = ModelStore.from_file(models_file, engine.frameworks).get(model_id).model_copy(update={"dtype": "bfloat16"})
    worker = engine.build(spec)
    inputs = TEXTS[:3] if model_id != "vision" else IMAGES[:2]
    worker.load()
    try:
        module = torch_module(worker)
        assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
        assert worker.memory_bytes == tensor_bytes(module) < 0.6 * loaded[model_id].memory_bytes  # half of float32
        got = worker.predict([worker.prepare(value) for value in inputs])
    finally:
        worker.unload()
    want = loaded[model_id].predict([loaded[model_id].prepare(value) for value in inputs])
    for got_row, want_row in zip(got, want, strict=True):
        scores = [p["score"] for p in got_row]
        assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
        assert abs(got_row[0]["score"] - want_row[0]["score"]) < 0.05  # float32 scores of bfloat16 weights
