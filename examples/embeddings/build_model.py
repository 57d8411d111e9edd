"""Build a small sentence encoder offline and a models file that serves it, so the example runs with no download.

    python build_model.py DIRECTORY

writes ``DIRECTORY/encoder`` (a 2-layer BERT with random weights and a generated vocabulary, saved as any
checkpoint is) and ``DIRECTORY/models.json`` with one model, ``embedder``, of framework ``sentence-embedding``.
A real deployment points ``path`` at a downloaded encoder instead.
"""

from __future__ import annotations

import itertools
import json
import string
import sys
from pathlib import Path


def vocabulary() -> list[str]:
    """BERT's special tokens, every lowercase letter and digit (alone and as a ``##`` continuation, so no
    lowercase ASCII word is unknown), punctuation, and two-letter pieces."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = string.ascii_lowercase + string.digits
    tokens += list(chars) + list(string.punctuation) + [f"##{c}" for c in chars]
    tokens += ["".join(pair) for pair in itertools.product(string.ascii_lowercase, repeat=2)]
    return tokens


def build(directory: Path) -> Path:
    """The encoder and the models file under ``directory``; returns the models file's path."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    encoder = directory / "encoder"
    encoder.mkdir(parents=True, exist_ok=True)
    vocab = encoder / "vocab.txt"
    vocab.write_text("\n".join(vocabulary()) + "\n", encoding="utf-8")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocabulary()), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=128)
    BertModel(config).save_pretrained(encoder)
    BertTokenizer(vocab=str(vocab), model_max_length=128).save_pretrained(encoder)
    models = directory / "models.json"
    entry = {"id": "embedder", "name": "tiny-encoder", "type": "text", "framework": "sentence-embedding",
             "path": "encoder", "max_batch_size": 32}
    models.write_text(json.dumps({"models": [entry]}, indent=2) + "\n", encoding="utf-8")
    return models


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python build_model.py DIRECTORY")
    print(build(Path(sys.argv[1])))
