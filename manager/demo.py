"""A sentiment model for ``swapless demo`` that gives meaningful labels, trained offline in a few seconds.

The demo models of ``manager.tiny`` have random weights, so every review comes back with the same label. This
module ships a small labelled sample of reviews (``manager/data/reviews.jsonl``, written by ``sample_reviews``
from templates over the real words of ``manager.tiny.vocabulary()``) and fine-tunes the tiny ``sentiment`` BERT on
it with torch on the CPU. Nothing is downloaded: the model is built by ``manager.tiny.build_text_classifier`` and
saved back with ``save_pretrained``, so the workers load it like any other checkpoint.

Regenerate the shipped sample with ``python -m manager.demo`` (the output is the same every time).
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SAMPLE_PATH",
    "SAMPLE_SEED",
    "SENTIMENT_LABELS",
    "TrainingReport",
    "build_trained_demo_sentiment",
    "read_sample",
    "sample_jsonl",
    "sample_reviews",
    "train_text_classifier",
    "write_sample",
]

logger = logging.getLogger(__name__)

#: The shipped labelled sample, next to this module so it is found from an installed package too.
SAMPLE_PATH = Path(__file__).resolve().parent / "data" / "reviews.jsonl"
#: The seed ``SAMPLE_PATH`` was generated with.
SAMPLE_SEED = 2024
#: The sentiment classes, in class-index order.
SENTIMENT_LABELS = ["NEGATIVE", "POSITIVE"]

_SUBJECTS = [
    "The coffee",
    "This movie",
    "The hotel",
    "The food",
    "The service",
    "The book",
    "This phone",
    "The game",
    "The show",
    "The film",
    "The room",
    "The music",
    "The car",
    "The story",
    "The restaurant",
    "The delivery",
    "The battery",
    "This album",
]

#: What a review says about its subject, by label; each follows a subject ("The coffee" + " is amazing").
_CORES: dict[str, list[str]] = {
    "POSITIVE": [
        "is amazing",
        "is wonderful",
        "was brilliant",
        "was fantastic",
        "is great",
        "is really good",
        "was excellent",
        "is perfect",
        "was lovely",
        "is the best we have had",
        "was worth every penny",
        "is a lot of fun",
        "was beautiful",
        "is delicious",
    ],
    "NEGATIVE": [
        "is awful",
        "is terrible",
        "was horrible",
        "was dreadful",
        "is boring",
        "was a waste of money",
        "is really bad",
        "was the worst we have had",
        "is useless",
        "was disappointing",
        "is poor",
        "broke after one week",
        "was ugly",
        "is annoying",
    ],
}

#: What may follow the core, by label ("" ends the sentence there).
_TAILS: dict[str, list[str]] = {
    "POSITIVE": [
        "",
        "and i would buy it again",
        "and we will come back",
        "and the staff were kind",
        "and i loved every minute",
        "and it made me happy",
        "and i would recommend it",
        "and the ending was perfect",
        "from start to end",
        "to be honest",
    ],
    "NEGATIVE": [
        "",
        "and the ending made no sense",
        "and we will never come back",
        "and the staff were rude",
        "and i want my money back",
        "and it made me sad",
        "and i would not recommend it",
        "and it was slow",
        "from start to end",
        "to be honest",
    ],
}


def _sentence(rng: random.Random, label: str, subject: str | None = None, core: str | None = None) -> str:
    """One sentence of ``label``: a subject, a core phrase and maybe a tail, with a full stop."""
    subject = subject if subject is not None else rng.choice(_SUBJECTS)
    core = core if core is not None else rng.choice(_CORES[label])
    tail = rng.choice(_TAILS[label])
    return f"{subject} {core}{' ' + tail if tail else ''}."


def sample_reviews(n: int = 300, seed: int = SAMPLE_SEED) -> list[dict[str, str]]:
    """Generate ``n`` distinct labelled reviews, the same ones for the same ``n`` and ``seed``.

    Each review is one or two sentences of the same sentiment built from templates; the labels are shuffled and
    half of each (``n // 2`` NEGATIVE). The second review always opens with "This movie is awful" (NEGATIVE), so
    the demo's r0002 reads the same whatever the seed.

    Args:
        n: how many reviews (at least 2).
        seed: seed of the ``random.Random`` that picks labels and phrases.

    Returns:
        ``[{"id": "r0001", "text": ..., "label": "NEGATIVE" | "POSITIVE"}, ...]`` in id order.

    Raises:
        ValueError: ``n`` is below 2.
    """
    if n < 2:
        raise ValueError(f"a sample needs at least 2 reviews, got n={n}")
    rng = random.Random(seed)
    labels = ["NEGATIVE"] * (n // 2) + ["POSITIVE"] * (n - n // 2)
    rng.shuffle(labels)
    if labels[1] != "NEGATIVE":
        other = labels.index("NEGATIVE")
        labels[1], labels[other] = labels[other], labels[1]
    records: list[dict[str, str]] = []
    seen: set[str] = set()
    for index, label in enumerate(labels):
        while True:
            if index == 1:
                text = _sentence(rng, label, subject="This movie", core="is awful")
            else:
                text = _sentence(rng, label)
            if rng.random() < 0.4:
                text += " " + _sentence(rng, label)
            if text not in seen:
                break
        seen.add(text)
        records.append({"id": f"r{index + 1:04d}", "text": text, "label": label})
    return records


def sample_jsonl(records: list[dict[str, str]]) -> str:
    """The JSON-lines text of ``records``: one ``json.dumps`` object a line, in order, ending with a newline."""
    return "".join(json.dumps(record, ensure_ascii=True) + "\n" for record in records)


def write_sample(path: Path = SAMPLE_PATH, *, n: int = 300, seed: int = SAMPLE_SEED) -> Path:
    """Write ``sample_reviews(n, seed)`` as JSON lines to ``path`` (parent created if missing).

    Args:
        path: the file to write; by default the shipped sample.
        n: how many reviews.
        seed: the generator's seed.

    Returns:
        ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(sample_jsonl(sample_reviews(n, seed)), encoding="utf-8")
    return path


def read_sample(path: Path = SAMPLE_PATH) -> list[dict[str, str]]:
    """Read a JSON-lines sample of reviews (the shipped one by default).

    Args:
        path: the file to read.

    Returns:
        Its records, in file order.
    """
    with Path(path).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


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
    seconds_budget: float = 10.0,
    seed: int = 0,
) -> TrainingReport:
    """Fine-tune the sequence classifier saved in ``directory`` on ``records`` and save it back there.

    It loads the model and tokenizer with ``from_pretrained``, trains with AdamW on the CPU in small shuffled
    batches (seeded with ``seed``, at most a few threads), and after each epoch measures the accuracy on the
    records; it stops when every record is right, after a dozen epochs, or once ``seconds_budget`` is spent. The
    model (in eval mode) and tokenizer are then written back with ``save_pretrained``.

    Args:
        directory: a model saved by ``manager.tiny.build_text_classifier`` (or any local checkpoint).
        records: ``{"text": ..., "label": ...}`` dicts; other keys are ignored.
        labels: the class names in class-index order; they must match the model's ``id2label``.
        seconds_budget: wall time after which no new epoch starts.
        seed: torch seed for the shuffling and the dropout.

    Returns:
        A ``TrainingReport``.

    Raises:
        ValueError: no records, a record whose label is not in ``labels``, or ``labels`` that are not the model's.
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    if not records:
        raise ValueError("no records to train on")
    index_of = {label: index for index, label in enumerate(labels)}
    unknown = sorted({str(record["label"]) for record in records} - set(index_of))
    if unknown:
        raise ValueError(f"labels {unknown} are not among {labels}")
    directory = Path(directory)
    tokenizer: Any = AutoTokenizer.from_pretrained(str(directory))
    model: Any = AutoModelForSequenceClassification.from_pretrained(str(directory))
    model_labels = [model.config.id2label[index] for index in range(model.config.num_labels)]
    if model_labels != list(labels):
        raise ValueError(f"the model in {directory} has labels {model_labels}, not {labels}")

    threads = torch.get_num_threads()
    torch.set_num_threads(_training_threads())
    try:
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        encoded = tokenizer(
            [str(record["text"]) for record in records], padding=True, truncation=True, return_tensors="pt"
        )
        inputs = {name: tensor for name, tensor in encoded.items()}
        targets = torch.tensor([index_of[str(record["label"])] for record in records])
        optimizer = torch.optim.AdamW(model.parameters(), lr=_LEARNING_RATE, weight_decay=_WEIGHT_DECAY)

        start = time.perf_counter()
        epochs = 0
        accuracy = 0.0
        while epochs < _MAX_EPOCHS:
            model.train()
            for batch in torch.randperm(len(records), generator=generator).split(_BATCH_SIZE):
                optimizer.zero_grad()
                output = model(**{name: tensor[batch] for name, tensor in inputs.items()}, labels=targets[batch])
                output.loss.backward()
                optimizer.step()
            epochs += 1
            accuracy = _accuracy(model, inputs, targets)
            logger.debug("epoch %d: train accuracy %.3f", epochs, accuracy)
            if accuracy >= _TARGET_ACCURACY or time.perf_counter() - start >= seconds_budget:
                break
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)

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


def _training_threads() -> int:
    """Torch threads for training: half the usable CPUs, between 1 and a few.

    Half, because on a small shared machine (2 cores, something else busy) more threads than free cores makes
    OpenMP spin: two threads next to one busy process trained about four times slower than one.
    """
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
    """Build the demo's ``sentiment`` classifier in ``directory`` and train it on ``sample_reviews()``.

    The model is the ``tiny`` BERT that ``manager.tiny.build_demo_models`` builds for ``sentiment`` (same
    labels and seed), so it loads the same way; only its weights now mean something.

    Args:
        directory: where the model goes (created if missing).

    Returns:
        The ``TrainingReport`` of the training.
    """
    from transformers.utils import logging as hf_logging

    from manager.tiny import build_text_classifier

    hf_logging.disable_progress_bar()  # as build_demo_models: no "Loading weights" / "Writing model shards" bars
    build_text_classifier(directory, arch="bert", preset="tiny", labels=SENTIMENT_LABELS, seed=1)
    return train_text_classifier(directory, sample_reviews(), labels=SENTIMENT_LABELS)


if __name__ == "__main__":  # pragma: no cover - regenerates the shipped sample
    print(write_sample())
