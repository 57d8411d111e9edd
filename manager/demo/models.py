"""The demo models: a few tiny classifiers built offline, and a sentiment model trained in seconds on the demo's
labelled sample so that its labels mean something. Nothing is downloaded; ``build_demo_models`` writes them all
and a ``models.json``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swapless.manager.demo.sample import SENTIMENT_LABELS, sample_reviews
from swapless.manager.demo.tiny import build_image_classifier, build_text_classifier, write_models_file

__all__ = [
    "DEMO_VARIANTS",
    "IMAGE_MODEL_ID",
    "TEXT_MODELS",
    "TrainingReport",
    "build_demo_models",
    "build_trained_demo_sentiment",
    "train_lora_adapter",
    "train_text_classifier",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingReport:
    """What ``train_text_classifier`` did.

    Attributes:
        epochs: passes over the records.
        seconds: wall time of the training loop (loading and saving excluded).
        train_accuracy: accuracy on the training records after the last epoch, in eval mode.
        examples: how many records it trained on.
    """

    epochs: int
    seconds: float
    train_accuracy: float
    examples: int


# Training settings. On the shipped sample the tiny preset reaches 100% in 2-3 epochs (about 2 s on 2 cores).
_MAX_EPOCHS = 12
_BATCH_SIZE = 16
_LEARNING_RATE = 1e-3
_WEIGHT_DECAY = 0.01
_TARGET_ACCURACY = 1.0
_MAX_THREADS = 4


def train_text_classifier(
    directory: Path,
    records: list[dict[str, Any]],
    *,
    labels: list[str],
    seconds_budget: float | None = None,
    seed: int = 0,
) -> TrainingReport:
    """Fine-tune the sequence classifier saved in ``directory`` on ``records`` and save it back there.

    Trains with AdamW on the CPU in small shuffled batches until every record is right, after a dozen epochs, or once
    ``seconds_budget`` is spent; without a budget the result depends on the seed alone.

    Args:
        directory: a local checkpoint (as ``tiny.build_text_classifier`` saves one).
        records: ``{"text": ..., "label": ...}`` dicts; other keys are ignored.
        labels: the class names in class-index order; they must match the model's ``id2label``.
        seconds_budget: wall time after which no new epoch starts (None: none).
        seed: torch seed for the shuffling and the dropout.

    Returns:
        A ``TrainingReport``.

    Raises:
        ValueError: no records, a record whose label is not in ``labels``, or ``labels`` that are not the model's.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    index_of = _label_index(records, labels)
    directory = Path(directory)
    tokenizer: Any = AutoTokenizer.from_pretrained(str(directory))
    model: Any = AutoModelForSequenceClassification.from_pretrained(str(directory))
    model_labels = [model.config.id2label[index] for index in range(model.config.num_labels)]
    if model_labels != list(labels):
        raise ValueError(f"the model in {directory} has labels {model_labels}, not {labels}")

    epochs, seconds, accuracy = _fit(model, tokenizer, records, index_of, model.parameters(), _LEARNING_RATE, seed,
                                     seconds_budget)

    model.eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    report = TrainingReport(epochs=epochs, seconds=seconds, train_accuracy=accuracy, examples=len(records))
    logger.info(
        "trained %s: %d epochs in %.1f s, train accuracy %.3f on %d examples",
        directory,
        report.epochs,
        report.seconds,
        report.train_accuracy,
        report.examples,
    )
    return report


def train_lora_adapter(
    base: Path, directory: Path, records: list[dict[str, Any]], *, labels: list[str], seed: int = 0, rank: int = 4,
) -> TrainingReport:
    """Train a LoRA adapter (rank ``rank`` on the attention's query and value layers, with its own head) over the
    classifier in ``base``, and save it to ``directory`` as PEFT writes one. Same loop as ``train_text_classifier``.

    Raises:
        ValueError: no records, or a record whose label is not in ``labels``.
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from swapless.manager.frameworks.adapter_checks import quiet_peft

    index_of = _label_index(records, labels)
    tokenizer: Any = AutoTokenizer.from_pretrained(str(base))
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["query", "value"], modules_to_save=["classifier"],
                        task_type="SEQ_CLS")
    with quiet_peft():
        model: Any = get_peft_model(AutoModelForSequenceClassification.from_pretrained(str(base)), config)
    trained = [p for p in model.parameters() if p.requires_grad]  # the adapter's matrices and its head
    epochs, seconds, accuracy = _fit(model, tokenizer, records, index_of, trained, 5 * _LEARNING_RATE, seed, None)
    model.save_pretrained(str(directory))
    report = TrainingReport(epochs=epochs, seconds=seconds, train_accuracy=accuracy, examples=len(records))
    logger.info("trained adapter %s: %d epochs in %.1f s, train accuracy %.3f", directory, epochs, seconds, accuracy)
    return report


#: The demo's variant of ``sentiment`` (an adapter trained over it): id -> its labels for NEGATIVE and POSITIVE.
DEMO_VARIANTS: dict[str, list[str]] = {"sentiment-stars": ["1 star", "5 stars"]}


def _label_index(records: list[dict[str, Any]], labels: list[str]) -> dict[str, int]:
    """Label -> class index, every record's label checked (ValueError: none, or one not in ``labels``)."""
    if not records:
        raise ValueError("no records to train on")
    index_of = {label: index for index, label in enumerate(labels)}
    unknown = sorted({str(record["label"]) for record in records} - set(index_of))
    if unknown:
        raise ValueError(f"labels {unknown} are not among {labels}")
    return index_of


def _fit(model: Any, tokenizer: Any, records: list[dict[str, Any]], index_of: dict[str, int], parameters: Any,
         learning_rate: float, seed: int, seconds_budget: float | None) -> tuple[int, float, float]:
    """Train ``parameters`` of ``model`` on ``records`` (AdamW, shuffled batches, a few threads) until every record
    is right, a dozen epochs, or ``seconds_budget``; returns (epochs, seconds, train accuracy)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(_training_threads())
    try:
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        encoded = tokenizer([str(r["text"]) for r in records], padding=True, truncation=True, return_tensors="pt")
        inputs = dict(encoded.items())
        targets = torch.tensor([index_of[str(r["label"])] for r in records])
        optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=_WEIGHT_DECAY)
        start, epochs, accuracy = time.perf_counter(), 0, 0.0
        while epochs < _MAX_EPOCHS:
            model.train()
            for batch in torch.randperm(len(records), generator=generator).split(_BATCH_SIZE):
                optimizer.zero_grad()
                model(**{name: tensor[batch] for name, tensor in inputs.items()}, labels=targets[batch]).loss.backward()
                optimizer.step()
            epochs += 1
            accuracy = _accuracy(model, inputs, targets)
            logger.debug("epoch %d: train accuracy %.3f", epochs, accuracy)
            if accuracy >= _TARGET_ACCURACY or (
                seconds_budget is not None and time.perf_counter() - start >= seconds_budget
            ):
                break
        return epochs, time.perf_counter() - start, accuracy
    finally:
        torch.set_num_threads(threads)


def _training_threads() -> int:
    """Torch threads for training: half the usable CPUs, between 1 and a few (more makes OpenMP spin)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(_MAX_THREADS, cpus // 2))


def _accuracy(model: Any, inputs: dict[str, Any], targets: Any) -> float:
    """The share of ``targets`` that ``model`` (switched to eval mode) predicts right on ``inputs``."""
    import torch

    model.eval()
    with torch.no_grad():
        predictions = torch.cat(
            [
                model(**{name: tensor[batch] for name, tensor in inputs.items()}).logits.argmax(dim=-1)
                for batch in torch.arange(len(targets)).split(64)
            ]
        )
    return float((predictions == targets).float().mean())


def build_trained_demo_sentiment(directory: Path) -> TrainingReport:
    """Build the demo's ``sentiment`` classifier in ``directory`` (created if missing) and train it on the sample.

    Returns:
        The ``TrainingReport`` of the training.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # as build_demo_models: no "Loading weights" / "Writing model shards" bars
    build_text_classifier(directory, arch="bert", preset="tiny", labels=SENTIMENT_LABELS, seed=1)
    return train_text_classifier(directory, sample_reviews(), labels=SENTIMENT_LABELS)


#: The text models of ``build_demo_models``: id -> (arch, labels, seed). All use the ``tiny`` preset.
TEXT_MODELS: dict[str, tuple[str, list[str], int]] = {
    "sentiment": ("bert", ["NEGATIVE", "POSITIVE"], 1),
    "spam": ("bert", ["ham", "spam"], 2),
    "topic": ("distilbert", ["world", "sports", "business", "science"], 3),
}
IMAGE_MODEL_ID = "vision"


def build_demo_models(directory: Path, *, image: bool = True, trained: bool = False) -> Path:
    """Build the tiny models (``sentiment``, ``spam``, ``topic`` and, with ``image``, ``vision``) into ``directory``.

    Args:
        directory: where the models and ``models.json`` go (created if missing).
        image: also build the image model.
        trained: train ``sentiment`` on the demo's sample; the tests use random weights.

    Returns:
        The path of the ``models.json`` that lists them.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Writing model shards" bar per model is noise here
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    for model_id, (arch, labels, seed) in TEXT_MODELS.items():
        description = f"random-weight {arch} ({', '.join(labels)})"
        if trained and model_id == "sentiment":
            report = build_trained_demo_sentiment(root / model_id)
            description = (
                f"tiny {arch} (2 layers) trained {report.seconds:.1f} s on the {report.examples} labelled reviews of "
                f"the demo sample ({report.train_accuracy:.0%} right on them): a toy, not a real sentiment model"
            )
        else:
            build_text_classifier(root / model_id, arch=arch, preset="tiny", labels=labels, seed=seed)
        entries.append(
            {
                "id": model_id,
                "name": f"tiny-{arch}-{model_id}",
                "type": "text",
                "framework": "transformers",
                "version": "1",
                "description": description,
                "path": model_id,
            }
        )
    if trained:
        sample = sample_reviews()
        for variant_id, names in DEMO_VARIANTS.items():
            renamed = [{"text": r["text"], "label": names[SENTIMENT_LABELS.index(r["label"])]} for r in sample]
            report = train_lora_adapter(root / "sentiment", root / "adapters" / variant_id, renamed, labels=names)
            entries.append({
                "id": variant_id, "base": "sentiment", "adapter": f"adapters/{variant_id}", "labels": names,
                "description": f"LoRA adapter over sentiment, trained {report.seconds:.1f} s on the sample with its "
                               f"own labels ({report.train_accuracy:.0%} right on them)",
            })
    if image:
        weights = build_image_classifier(root / IMAGE_MODEL_ID, arch="mobilenet_v2", seed=4)
        entries.append(
            {
                "id": IMAGE_MODEL_ID,
                "name": "mobilenet_v2",
                "type": "image",
                "framework": "torchvision",
                "version": "1",
                "description": "random-weight mobilenet_v2 with the ImageNet categories",
                "path": str(weights.relative_to(root)),
                "weights": "DEFAULT",
            }
        )
    return write_models_file(root, entries)
