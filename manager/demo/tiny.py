"""Small real models built offline with random weights, for the tests, the benchmark and ``swapless demo``.

Real transformers and torchvision architectures, saved the way real checkpoints are (``save_pretrained``,
safetensors), so the workers' real loading code runs on them. Their labels are meaningless.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import random
from pathlib import Path
from typing import Any

__all__ = [
    "TEXT_PRESETS",
    "build_image_classifier",
    "build_lora_adapter",
    "build_lora_adapters",
    "build_text_classifier",
    "encode_image",
    "vocabulary",
    "write_models_file",
]

#: Layer sizes of the text presets, after google/bert_uncased_L-*_H-*, distilbert-base and bert-base.
#: ``max_length`` is the tokenizer's ``model_max_length`` (tokens).
TEXT_PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"layers": 2, "hidden": 128, "heads": 2, "intermediate": 512, "positions": 512, "max_length": 128},
    "mini": {"layers": 4, "hidden": 256, "heads": 4, "intermediate": 1024, "positions": 512, "max_length": 256},
    "distilbert": {"layers": 6, "hidden": 768, "heads": 12, "intermediate": 3072, "positions": 512, "max_length": 512},
    "base": {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072, "positions": 512, "max_length": 512},
}

_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# Real words, so that test sentences tokenize into whole words; the rest of the vocabulary is pseudo-words.
_WORDS = """
a about after again all also an and any are as at away back bad be because been before being best better big
book both but buy by call came can car cash city claim click come could day did do does done down each even
every fast film find first for free from game get give go goes good great had has have he her here him his home
how i if in into is it its just know last late latest league like little long look love made make man many match
me message money more most movie much must my never new news next no not now of off offer old on one only or
other our out over own people phone play player price prize really right said same say science see she should
show so some still story stock study such take team than that the their them then there these they thing think
this time to today too two up us use very want was way we week well were what when where which who why will win
winner with won work world would year yes you your amazing awful boring brilliant cheap company dreadful economy
election exciting fantastic government hate horrible market minister network planet research scored season
space terrible urgent wonderful
album annoying battery beautiful broke coffee delicious delivery disappointing end ending excellent food fun happy
honest hotel kind lot loved lovely minute music penny perfect poor recommend restaurant room rude sad sense service
slow staff start ugly useless waste worst worth
"""

_SUFFIXES = ["s", "ed", "ing", "ly", "er", "est", "ion", "ness", "ment", "able", "ful", "less"]
_ONSETS = [*"bcdfghklmnprstvwz", "br", "ch", "cl", "dr", "fl", "gr", "pl", "sh", "st", "th", "tr"]
_VOWELS = [*"aeiou", "ai", "ea", "io", "ou"]


def vocabulary(size: int = 3000) -> list[str]:
    """A deterministic WordPiece vocabulary of ``size`` entries.

    It holds the BERT special tokens, every lowercase letter, digit and ASCII punctuation mark (alone and as a
    ``##`` continuation, so no lowercase ASCII word is ever ``[UNK]``), common suffixes, a few hundred real
    English words, and consonant-vowel pseudo-words up to ``size``.
    """
    tokens: list[str] = list(_SPECIAL_TOKENS)
    seen = set(tokens)

    def add(token: str) -> None:
        if token not in seen and len(tokens) < size:
            seen.add(token)
            tokens.append(token)

    for char in "abcdefghijklmnopqrstuvwxyz0123456789" + "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~":
        add(char)
    for char in "abcdefghijklmnopqrstuvwxyz0123456789":
        add("##" + char)
    for suffix in _SUFFIXES:
        add("##" + suffix)
    for word in _WORDS.split():
        add(word)
    syllables = [onset + vowel for onset, vowel in itertools.product(_ONSETS, _VOWELS)]
    for first, second in itertools.product(syllables, syllables):
        if len(tokens) >= size:
            break
        add(first + second)
    return tokens


def build_text_classifier(
    directory: Path,
    *,
    arch: str = "bert",
    preset: str = "tiny",
    labels: list[str],
    seed: int = 0,
    vocab_size: int = 3000,
) -> Path:
    """Save a random-weight sequence classifier and its tokenizer to ``directory`` (created if missing).

    Args:
        directory: where ``config.json``, ``model.safetensors`` and the tokenizer files go.
        arch: ``bert`` (BertForSequenceClassification) or ``distilbert`` (DistilBertForSequenceClassification).
        preset: layer sizes from ``TEXT_PRESETS`` (``tiny``, ``mini``, ``distilbert``, ``base``).
        labels: class names, in class-index order; they become ``id2label`` / ``label2id``.
        seed: torch seed for the random weights.
        vocab_size: entries in the generated vocabulary (30522 gives the parameter count of the real
            bert-base-uncased / distilbert-base-uncased vocabularies).

    Returns:
        ``directory``, loadable with ``AutoTokenizer.from_pretrained`` and
        ``AutoModelForSequenceClassification.from_pretrained``.

    Raises:
        ValueError: unknown ``arch`` or ``preset``, or fewer than two labels.
    """
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertTokenizer,
        DistilBertConfig,
        DistilBertForSequenceClassification,
        DistilBertTokenizer,
    )

    if arch not in ("bert", "distilbert"):
        raise ValueError(f"unknown arch {arch!r} (known: bert, distilbert)")
    if preset not in TEXT_PRESETS:
        raise ValueError(f"unknown preset {preset!r} (known: {', '.join(TEXT_PRESETS)})")
    if len(labels) < 2:
        raise ValueError(f"a classifier needs at least two labels, got {labels!r}")
    dims = TEXT_PRESETS[preset]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    vocab = vocabulary(vocab_size)
    vocab_file = directory / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    id2label = dict(enumerate(labels))
    label2id = {label: index for index, label in id2label.items()}

    config: Any
    model: Any
    tokenizer: Any
    torch.manual_seed(seed)
    if arch == "bert":
        config = BertConfig(
            vocab_size=len(vocab),
            hidden_size=dims["hidden"],
            num_hidden_layers=dims["layers"],
            num_attention_heads=dims["heads"],
            intermediate_size=dims["intermediate"],
            max_position_embeddings=dims["positions"],
            id2label=id2label,
            label2id=label2id,
        )
        model = BertForSequenceClassification(config)
        # transformers 5 ignores ``vocab_file=`` here and keeps a 5-token vocabulary; ``vocab=`` takes the file.
        tokenizer = BertTokenizer(vocab=str(vocab_file), model_max_length=dims["max_length"])
    else:
        config = DistilBertConfig(
            vocab_size=len(vocab),
            dim=dims["hidden"],
            n_layers=dims["layers"],
            n_heads=dims["heads"],
            hidden_dim=dims["intermediate"],
            max_position_embeddings=dims["positions"],
            id2label=id2label,
            label2id=label2id,
        )
        model = DistilBertForSequenceClassification(config)
        tokenizer = DistilBertTokenizer(vocab=str(vocab_file), model_max_length=dims["max_length"])
    model.eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build_image_classifier(directory: Path, *, arch: str = "mobilenet_v2", seed: int = 0) -> Path:
    """Save a random-weight torchvision classifier (1000 ImageNet classes) as ``directory/<arch>.safetensors``.

    Args:
        directory: where the weights file goes (created if missing).
        arch: a torchvision builder name (``mobilenet_v2``, ``resnet18``, ``resnet50``, ...).
        seed: torch seed for the random weights.

    Returns:
        The path of the safetensors file.
    """
    import torch
    import torchvision
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = torchvision.models.get_model(arch, weights=None, num_classes=1000)
    _spread_outputs(model)
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    path = directory / f"{arch}.safetensors"
    save_file(state, str(path))
    return path


def _spread_outputs(model: Any) -> None:
    """Make a freshly initialised classifier give distinct outputs for distinct images.

    torchvision's init leaves every batch norm as the identity, and the features shrink to nothing through the
    blocks; running statistics from one pass over random inputs, and wider final layers, keep outputs input-dependent.
    """
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a plain average over the calibration batch
    model.train()
    with torch.no_grad():
        model(torch.randn(8, 3, 96, 96))
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.normal_(module.weight, 0.0, 0.05)
    for norm in norms:
        norm.momentum = 0.1
    model.eval()


def encode_image(seed: int, size: tuple[int, int] = (64, 48), fmt: str = "PNG") -> str:
    """A base64 string of a random RGB image of ``size`` (width, height) in ``fmt``; the same for the same seed."""
    from PIL import Image

    width, height = size
    pixels = random.Random(seed).randbytes(width * height * 3)
    buffer = io.BytesIO()
    Image.frombytes("RGB", (width, height), pixels).save(buffer, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def write_models_file(directory: Path, entries: list[dict[str, Any]]) -> Path:
    """Write ``{"models": entries}`` to ``directory/models.json`` and return its path."""
    path = Path(directory) / "models.json"
    path.write_text(json.dumps({"models": entries}, indent=2) + "\n", encoding="utf-8")
    return path


def build_lora_adapter(
    base: Path, directory: Path, *, seed: int = 0, rank: int = 8, targets: tuple[str, ...] = ("query", "value"),
    head: bool = True, scale: float = 0.2,
) -> Path:
    """Save a random LoRA adapter over the classifier in ``base`` to ``directory``, as PEFT's ``save_pretrained`` does.

    Its weights are drawn (normal, ``scale``) rather than zero, so that each adapter answers differently.

    Returns:
        ``directory``, with ``adapter_config.json`` and ``adapter_model.safetensors``.
    """
    return build_lora_adapters(base, [(Path(directory), seed)], rank=rank, targets=targets, head=head,
                               scale=scale)[0]


def build_lora_adapters(
    base: Path, adapters: list[tuple[Path, int]], *, rank: int = 8, targets: tuple[str, ...] = ("query", "value"),
    head: bool = True, scale: float = 0.2,
) -> list[Path]:
    """``build_lora_adapter`` for many ``(directory, seed)`` pairs over one load of ``base``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    from swapless.manager.frameworks.adapter_checks import quiet_peft

    model = AutoModelForSequenceClassification.from_pretrained(base)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets),
                        modules_to_save=["classifier"] if head else None, task_type="SEQ_CLS")
    with quiet_peft():
        wrapped = get_peft_model(model, config)
    drawn = [(name, p) for name, p in wrapped.named_parameters() if "lora_" in name or "modules_to_save" in name]
    for directory, seed in adapters:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, parameter in drawn:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
        wrapped.save_pretrained(str(directory))
    return [Path(directory) for directory, _ in adapters]
