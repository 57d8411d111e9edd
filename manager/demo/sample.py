"""The demo's sample: 300 short reviews, each labelled NEGATIVE or POSITIVE, generated from templates.

It ships as ``manager/demo/data/reviews.jsonl``; its words are in ``tiny.vocabulary()``. Regenerate it with
``python -m swapless.manager.demo.sample`` (the output is the same every time).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

__all__ = ["SAMPLE_PATH", "SAMPLE_SEED", "SENTIMENT_LABELS", "read_sample", "sample_jsonl", "sample_reviews",
           "write_sample"]

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
    """Generate ``n`` distinct labelled reviews, the same ones for the same ``n`` and ``seed``, half of each label.
    The second review always opens with "This movie is awful" (NEGATIVE).

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
            text = _sentence(rng, label, subject="This movie", core="is awful") if index == 1 else _sentence(rng, label)
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


if __name__ == "__main__":  # pragma: no cover - regenerates the shipped sample
    print(write_sample())
