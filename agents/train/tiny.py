"""A tiny random Llama and its tokenizer, made on the spot (no downloads), and the demo recipe.

``make_tiny_model(dir)`` trains a byte-level BPE tokenizer on a small built-in
corpus, builds a 2-layer Llama (hidden 64, 4 heads) sized to its vocabulary and
saves both with ``save_pretrained``; the result loads with
``AutoTokenizer`` / ``AutoModelForCausalLM`` and has a chat template, so
``transformers serve`` can answer chat completions with it.

``ensure_demo(dir)`` lays out a self-contained demo recipe: the tiny model,
the demo dataset and a ``train.yaml`` for it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

TINY_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
}
TOKENIZER_VOCAB = 640

# ---------------------------------------------------------------------------- the demo dataset

CAPITALS = [
    ("France", "Paris"),
    ("Germany", "Berlin"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Portugal", "Lisbon"),
    ("Japan", "Tokyo"),
    ("China", "Beijing"),
    ("India", "Delhi"),
    ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Chile", "Santiago"),
    ("Canada", "Ottawa"),
    ("Mexico", "Mexico City"),
    ("Norway", "Oslo"),
    ("Sweden", "Stockholm"),
    ("Finland", "Helsinki"),
    ("Poland", "Warsaw"),
    ("Greece", "Athens"),
    ("Austria", "Vienna"),
    ("Ireland", "Dublin"),
    ("Cuba", "Havana"),
    ("Russia", "Moscow"),
    ("Turkey", "Ankara"),
    ("Iran", "Tehran"),
]
WORDS = [
    "cat",
    "dog",
    "sun",
    "moon",
    "tree",
    "river",
    "stone",
    "bread",
    "lamp",
    "door",
    "fish",
    "bird",
    "cloud",
    "rain",
    "snow",
    "wind",
    "fire",
    "milk",
    "salt",
    "ship",
    "road",
    "hill",
    "leaf",
    "rose",
    "star",
    "ring",
    "bell",
    "coin",
    "book",
    "pen",
]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def demo_rows(n_per_task: int = 50, seed: int = 0) -> list[dict[str, str]]:
    """The demo dataset: short prompt/completion pairs from four learnable patterns
    (single-digit sums, capitals, the next letter, upper-casing), shuffled."""
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    for _ in range(n_per_task):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"prompt": f"Add: {a} + {b} =", "completion": f" {a + b}"})
    for i in range(n_per_task):
        country, city = CAPITALS[i % len(CAPITALS)] if i < len(CAPITALS) else rng.choice(CAPITALS)
        rows.append({"prompt": f"Capital of {country}:", "completion": f" {city}"})
    for i in range(n_per_task):
        k = i % 25 if i < 25 else rng.randrange(25)
        rows.append({"prompt": f"Next letter after {LETTERS[k]}:", "completion": f" {LETTERS[k + 1]}"})
    for i in range(n_per_task):
        word = WORDS[i % len(WORDS)] if i < len(WORDS) else rng.choice(WORDS)
        rows.append({"prompt": f"Uppercase: {word} ->", "completion": f" {word.upper()}"})
    rng.shuffle(rows)
    return rows


def demo_jsonl() -> str:
    return "".join(json.dumps(row) + "\n" for row in demo_rows())


DEMO_YAML = """\
# The cetlab-train demo recipe: a LoRA fine-tune of a tiny random Llama on
# {dataset}. The model is made on the spot the first time (make_tiny_if_missing).
# Relative paths resolve against this file's folder.
base_model: {base_model}
make_tiny_if_missing: true
dataset: {dataset}
output_dir: {output_dir}
max_seq_len: 64

lora:
  r: 16
  alpha: 32
  dropout: 0.0
  target_modules: all-linear
  # the model is random, so also train the embeddings and the output head in full
  modules_to_save: [embed_tokens, lm_head]

per_device_batch_size: 16
grad_accumulation: 1
max_steps: 300
learning_rate: 3.0e-3
lr_scheduler: linear
warmup_steps: 10
save_steps: 50
save_total_limit: 3
logging_steps: 5
seed: 0
# one CPU thread: fastest for a model this small, and immune to other processes on the cores
cpu_threads: 1
resume_from_checkpoint: null
"""

# ---------------------------------------------------------------------------- the tiny model

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model learns simple patterns.
Hello! How are you today? I am fine, thank you. What is your name? My name is Tiny.
The capital of a country is the city where its government sits. Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18.
Letters: a b c d e f g h i j k l m n o p q r s t u v w x y z. A B C D E F G H I J K L M N O P Q R S T U V W X Y Z.
user assistant system: You are a helpful assistant. Answer briefly.
"""


def _corpus() -> list[str]:
    lines = _CORPUS.splitlines()
    for row in demo_rows():
        lines.append(row["prompt"] + row["completion"])
    for country, city in CAPITALS:
        lines.append(f"The capital of {country} is {city}.")
    for word in WORDS:
        lines.append(f"{word} {word.upper()} {word.capitalize()}")
    return lines


def build_tokenizer() -> Any:
    """A byte-level BPE tokenizer trained on the built-in corpus, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=[UNK, BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    tokenizer_class: Any = PreTrainedTokenizerFast  # unannotated in transformers
    fast = tokenizer_class(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK, model_max_length=512)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "tokenizer.json").is_file() and any(path.glob("*.safetensors"))


def make_tiny_model(dir: str | os.PathLike[str], seed: int = 0, shape: dict[str, int] | None = None) -> Path:
    """Create the tiny Llama + tokenizer in ``dir`` (skipped when already there). Returns ``dir``.

    ``shape`` replaces TINY_SHAPE's LlamaConfig sizes (the GPU check makes a ~150M-parameter one).
    """
    target = Path(dir).expanduser().resolve()
    if _is_model_dir(target):
        return target
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    sizes: dict[str, Any] = dict(shape or TINY_SHAPE)  # LlamaConfig's size arguments
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        **sizes,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    generation_config: Any = GenerationConfig  # unannotated in transformers
    model.generation_config = generation_config(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=32,
    )
    # build next to the target, then move it in place: a half-made model is never seen there
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists() and not any(target.iterdir()):
            target.rmdir()
        try:
            os.replace(tmp, target)
        except OSError:
            if not _is_model_dir(target):  # someone else did not finish it either
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_demo(dir: str | os.PathLike[str]) -> Path:
    """Lay out the demo recipe in ``dir``: tiny-llama/ (the model), train.jsonl and
    train.yaml (each only if missing). Returns the path of train.yaml."""
    root = Path(dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    make_tiny_model(root / "tiny-llama")
    data = root / "train.jsonl"
    if not data.exists():
        data.write_text(demo_jsonl(), encoding="utf-8")
    config = root / "train.yaml"
    if not config.exists():
        config.write_text(DEMO_YAML.format(base_model="tiny-llama", dataset="train.jsonl", output_dir="out"), encoding="utf-8")
    return config
