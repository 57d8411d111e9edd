"""A producer: embed a few documents and a query through the queue, then rank the documents by cosine similarity.

    SWAPLESS_MODELS_FILE=DIRECTORY/models.json python search.py "the query"
"""

from __future__ import annotations

import sys

from swapless import Client

DOCUMENTS = [
    "the cat sat on the mat",
    "stock markets fell sharply today",
    "a recipe for lemon cake",
    "the dog chased the cat",
]


def rank(client: Client, query: str) -> list[tuple[float, str]]:
    """``(similarity, document)``, best first: one job per text, sent in one call and awaited together."""
    jobs = client.submit_jobs([("embedder", text) for text in [query, *DOCUMENTS]])
    results = client.gather(jobs, timeout=120)
    failed = next((stored for stored in results if stored.state != "SUCCESS"), None)
    if failed is not None:
        raise failed.value  # the worker's own error (an InputError, a ModelLoadError...), with its message
    query_vector, *vectors = (stored.value for stored in results)
    scores = [sum(q * d for q, d in zip(query_vector, vector, strict=True)) for vector in vectors]
    return sorted(zip(scores, DOCUMENTS, strict=True), reverse=True)


if __name__ == "__main__":
    for score, document in rank(Client(), " ".join(sys.argv[1:]) or "a cat"):
        print(f"{score:+.3f}  {document}")
