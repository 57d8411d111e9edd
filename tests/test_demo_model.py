"""The demo's trained sentiment model: the shipped labelled sample, and a tiny BERT fine-tuned on it offline."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from swapless.manager.demo.models import TrainingReport, build_trained_demo_sentiment, train_text_classifier
from swapless.manager.demo.sample import SAMPLE_PATH, SENTIMENT_LABELS, read_sample, sample_jsonl, sample_reviews
from swapless.manager.demo.tiny import build_text_classifier, vocabulary

NEGATIVE_TEXT = "This movie is awful and the ending made no sense."
POSITIVE_TEXT = "The hotel was wonderful and we will come back."


# -- the sample ---------------------------------------------------------------------------------------------------


def test_shipped_sample_is_the_generators_output() -> None:
    assert SAMPLE_PATH.read_bytes() == sample_jsonl(sample_reviews()).encode("utf-8")
    assert read_sample() == sample_reviews()


def test_sample_has_300_balanced_distinct_reviews() -> None:
    records = read_sample()
    assert len(records) == 300
    assert [record["id"] for record in records] == [f"r{index:04d}" for index in range(1, 301)]
    assert all(set(record) == {"id", "text", "label"} for record in records)
    counts = Counter(record["label"] for record in records)
    assert set(counts) == set(SENTIMENT_LABELS)
    assert abs(counts["NEGATIVE"] - counts["POSITIVE"]) <= 30
    assert len({record["text"] for record in records}) == 300


def test_second_review_is_the_awful_movie() -> None:
    second = read_sample()[1]
    assert second["id"] == "r0002"
    assert second["text"].startswith("This movie is awful")
    assert second["label"] == "NEGATIVE"


def test_generator_is_deterministic_and_seeded() -> None:
    assert sample_reviews(50, seed=3) == sample_reviews(50, seed=3)
    assert sample_reviews(50, seed=3) != sample_reviews(50, seed=4)
    assert sample_reviews(50, seed=4)[1]["text"].startswith("This movie is awful")


def test_sample_words_are_whole_vocabulary_words(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    known = set(vocabulary())
    words = {word.strip(".,").lower() for record in read_sample() for word in record["text"].split()}
    assert sorted(words - known) == []
    assert vocabulary() == vocabulary()

    tokenizer = AutoTokenizer.from_pretrained(str(untrained_sentiment(tmp_path)))
    for record in read_sample():
        tokens = tokenizer.tokenize(record["text"])
        assert not [token for token in tokens if token.startswith("##") or token == tokenizer.unk_token], record


# -- training -----------------------------------------------------------------------------------------------------


def untrained_sentiment(directory: Path) -> Path:
    """An untrained sentiment model in ``directory`` (for the checks that need no training)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return build_text_classifier(directory, labels=SENTIMENT_LABELS, seed=1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TrainingReport]:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    directory = tmp_path_factory.mktemp("sentiment")
    report = build_trained_demo_sentiment(directory)
    print(
        f"\ntrained the demo sentiment model: {report.epochs} epochs in {report.seconds:.2f} s,"
        f" train accuracy {report.train_accuracy:.3f} on {report.examples} examples"
    )
    return directory, report


@pytest.fixture(scope="module")
def classifier(trained: tuple[Path, TrainingReport]) -> Any:
    from transformers import pipeline

    directory, _ = trained
    return pipeline("text-classification", model=str(directory), tokenizer=str(directory), device="cpu")


def test_training_fits_the_sample(trained: tuple[Path, TrainingReport]) -> None:
    directory, report = trained
    assert report.examples == 300
    assert report.train_accuracy >= 0.95
    assert 1 <= report.epochs <= 12  # stopped on the accuracy or after a dozen epochs, never by the clock
    assert (directory / "model.safetensors").exists() and (directory / "vocab.txt").exists()


def test_trained_model_reads_the_obvious_reviews(classifier: Any) -> None:
    negative, positive = classifier([NEGATIVE_TEXT, POSITIVE_TEXT])
    print(f"\n{NEGATIVE_TEXT!r} -> {negative}\n{POSITIVE_TEXT!r} -> {positive}")
    assert negative["label"] == "NEGATIVE"
    assert positive["label"] == "POSITIVE"


def test_trained_model_generalises_to_held_out_reviews(classifier: Any) -> None:
    seen = {record["text"] for record in read_sample()}
    held_out = [record for record in sample_reviews(200, seed=7) if record["text"] not in seen]
    assert len(held_out) >= 150
    outputs = classifier([record["text"] for record in held_out])
    right = sum(output["label"] == record["label"] for output, record in zip(outputs, held_out, strict=True))
    accuracy = right / len(held_out)
    print(f"\nheld-out accuracy {accuracy:.3f} on {len(held_out)} reviews")
    assert accuracy >= 0.9


def test_trained_model_loads_with_auto_classes(trained: tuple[Path, TrainingReport]) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    directory, _ = trained
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForSequenceClassification.from_pretrained(str(directory)).eval()
    assert [model.config.id2label[index] for index in range(2)] == SENTIMENT_LABELS
    with torch.no_grad():
        logits = model(**tokenizer([NEGATIVE_TEXT, POSITIVE_TEXT], padding=True, return_tensors="pt")).logits
    assert logits.argmax(dim=-1).tolist() == [0, 1]


def test_training_rejects_unknown_or_mismatched_labels(tmp_path: Path) -> None:
    directory = untrained_sentiment(tmp_path)
    with pytest.raises(ValueError, match="not among"):
        train_text_classifier(directory, [{"text": "good", "label": "MAYBE"}], labels=SENTIMENT_LABELS)
    with pytest.raises(ValueError, match="has labels"):
        train_text_classifier(directory, [{"text": "good", "label": "ham"}], labels=["ham", "spam"])
    with pytest.raises(ValueError, match="no records"):
        train_text_classifier(directory, [], labels=SENTIMENT_LABELS)


def test_a_seconds_budget_stops_new_epochs(tmp_path: Path) -> None:
    """With a budget, the first epoch past it is the last (a zero budget: one epoch, however fast the machine; the
    full sample takes three without one)."""
    report = train_text_classifier(untrained_sentiment(tmp_path), sample_reviews(), labels=SENTIMENT_LABELS,
                                   seconds_budget=0.0)
    assert report.epochs == 1
