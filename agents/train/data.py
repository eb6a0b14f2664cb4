"""JSONL -> tokenized training rows (with an optional on-disk cache) and the padding collator.

Rows are ``{"text": ...}`` (every token is trained on) or
``{"prompt": ..., "completion": ...}`` (prompt tokens are masked to -100 in the
labels, so only the completion is trained on). The tokenizer's BOS (if its
post-processor adds one) starts each row and EOS ends it. Rows are cut at
``max_seq_len`` tokens; a row left with no trained token is dropped.

torch is imported inside functions only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.wire.words import plural

CACHE_VERSION = 1
IGNORE_INDEX = -100


class DataError(Exception):
    """The dataset cannot be used; str() is one line naming the file (and line)."""


def read_rows(path: Path) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot read dataset: {exc.strerror or exc}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON: {exc}") from None
            if isinstance(row, dict) and isinstance(row.get("text"), str):
                rows.append({"text": row["text"]})
            elif isinstance(row, dict) and isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
                rows.append({"prompt": row["prompt"], "completion": row["completion"]})
            else:
                raise DataError(f'{path}:{lineno}: expected {{"text": "..."}} or {{"prompt": "...", "completion": "..."}}')
    if not rows:
        raise DataError(f"{path}: the dataset has no rows")
    return rows


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash that changes whenever the tokenizer would tokenize differently."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(type(tokenizer).__name__.encode())
    h.update(json.dumps({k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())}).encode())
    h.update(f"{tokenizer.bos_token_id}/{tokenizer.eos_token_id}/{tokenizer.pad_token_id}".encode())
    return h.hexdigest()


def tokenize_rows(rows: list[dict[str, str]], tokenizer: Any, max_seq_len: int) -> tuple[list[list[int]], list[list[int]], int]:
    """-> (input_ids per row, labels per row, rows dropped)."""
    eos = tokenizer.eos_token_id
    tail = [eos] if eos is not None else []
    texts = [r["text"] for r in rows if "text" in r]
    prompts = [r["prompt"] for r in rows if "prompt" in r]
    completions = [r["completion"] for r in rows if "prompt" in r]
    text_ids = iter(tokenizer(texts, add_special_tokens=True)["input_ids"]) if texts else iter(())
    prompt_ids = iter(tokenizer(prompts, add_special_tokens=True)["input_ids"]) if prompts else iter(())
    completion_ids = iter(tokenizer(completions, add_special_tokens=False)["input_ids"]) if prompts else iter(())
    all_ids: list[list[int]] = []
    all_labels: list[list[int]] = []
    dropped = 0
    for row in rows:
        if "text" in row:
            ids = list(next(text_ids)) + tail
            labels = list(ids)
        else:
            p = list(next(prompt_ids))
            c = list(next(completion_ids)) + tail
            ids = p + c
            labels = [IGNORE_INDEX] * len(p) + c
        ids, labels = ids[:max_seq_len], labels[:max_seq_len]
        # the first label is never predicted (the model shifts labels by one)
        if len(ids) < 2 or all(label == IGNORE_INDEX for label in labels[1:]):
            dropped += 1
            continue
        all_ids.append(ids)
        all_labels.append(labels)
    return all_ids, all_labels, dropped


class TokenizedDataset:
    """Rows stored flat (two 1-D int tensors + offsets); items are dicts of lists."""

    def __init__(self, ids: Any, labels: Any, offsets: Any):
        self.ids, self.labels, self.offsets = ids, labels, offsets

    @classmethod
    def from_lists(cls, ids: list[list[int]], labels: list[list[int]]) -> TokenizedDataset:
        import torch

        offsets = [0]
        for row in ids:
            offsets.append(offsets[-1] + len(row))
        flat_ids = torch.tensor([t for row in ids for t in row], dtype=torch.int64)
        flat_labels = torch.tensor([t for row in labels for t in row], dtype=torch.int64)
        return cls(flat_ids, flat_labels, torch.tensor(offsets, dtype=torch.int64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return {"input_ids": self.ids[a:b], "labels": self.labels[a:b]}

    def token_count(self) -> int:
        return int(self.ids.numel())


def build_dataset(
    dataset: Path, tokenizer: Any, max_seq_len: int, cache: Path | None, log: Callable[[str], object] = print
) -> TokenizedDataset:
    """Tokenize ``dataset`` or reuse ``cache`` when the dataset file (size and
    mtime), the tokenizer and max_seq_len are unchanged."""
    import torch

    st = dataset.stat()
    key = {
        "version": CACHE_VERSION,
        "dataset": str(dataset.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "max_seq_len": max_seq_len,
    }
    cache_file = None
    if cache is not None:
        cache_file = cache / "tokenized.pt" if cache.is_dir() or not cache.suffix else cache
        if cache_file.is_file():
            try:
                saved = torch.load(cache_file, weights_only=True)
                if saved.get("key") == key:
                    log(f"cetlab-train: reusing the tokenized dataset in {cache_file}")
                    return TokenizedDataset(saved["ids"], saved["labels"], saved["offsets"])
                log(f"cetlab-train: {cache_file} is stale (dataset or tokenizer changed); tokenizing again")
            except Exception as exc:
                log(f"cetlab-train: ignoring unreadable cache {cache_file}: {exc}")

    rows = read_rows(dataset)
    ids, labels, dropped = tokenize_rows(rows, tokenizer, max_seq_len)
    if not ids:
        raise DataError(f"{dataset}: no row has a token left to train on within max_seq_len={max_seq_len}")
    if dropped:
        log(
            f"cetlab-train: dropped {dropped} of {plural(len(rows), 'row')} with nothing to train on within max_seq_len={max_seq_len}"
        )
    data = TokenizedDataset.from_lists(ids, labels)

    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}.tmp")
        torch.save({"key": key, "ids": data.ids, "labels": data.labels, "offsets": data.offsets}, tmp)
        os.replace(tmp, cache_file)
        log(f"cetlab-train: saved the tokenized dataset to {cache_file}")
    return data


class PadCollator:
    """Right-pads a batch: input_ids with pad_id, labels with -100; adds attention_mask."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        width = max(len(f["input_ids"]) for f in features)
        n = len(features)
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        for i, f in enumerate(features):
            k = len(f["input_ids"])
            input_ids[i, :k] = torch.as_tensor(f["input_ids"])
            labels[i, :k] = torch.as_tensor(f["labels"])
            attention[i, :k] = 1
        return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}
