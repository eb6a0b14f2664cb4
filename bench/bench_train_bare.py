"""What cetlab-train's bookkeeping costs: steps/s of a bare transformers Trainer vs cetlab-train.

Both train the same LoRA on the same tiny model and data (the demo recipe,
logging every step, saving every --save-steps); the bare run has no progress
callback, no signal handling and no progress file.

    python bench/bench_train_bare.py [--steps 300] [--save-steps 50] [--rounds 2] [--workdir DIR]

Prints one JSON line: steps/s for each and cetlab-train's overhead in percent.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def bare(config, steps: int) -> None:
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    from agents.train.data import PadCollator, build_dataset

    if config.cpu_threads:
        torch.set_num_threads(config.cpu_threads)
    transformers.set_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(config.base_model)
    data = build_dataset(Path(config.dataset), tokenizer, config.max_seq_len, None, log=lambda m: None)
    base_model = AutoModelForCausalLM.from_pretrained(config.base_model, dtype=torch.float32)
    model = get_peft_model(
        base_model,
        LoraConfig(
            r=config.lora.r,
            lora_alpha=config.lora.alpha,
            lora_dropout=config.lora.dropout,
            target_modules=config.lora.target_modules,
            modules_to_save=config.lora.modules_to_save or None,
            task_type="CAUSAL_LM",
        ),
    )
    args = TrainingArguments(
        output_dir=str(config.output_dir),
        per_device_train_batch_size=config.per_device_batch_size,
        max_steps=steps,
        learning_rate=config.learning_rate,
        warmup_steps=config.warmup_steps,
        logging_steps=1,
        save_steps=config.save_steps,
        save_total_limit=config.save_total_limit,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        remove_unused_columns=False,
        disable_tqdm=True,
        seed=config.seed,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=PadCollator(tokenizer.pad_token_id))
    trainer.train()


def cetlab(config, steps: int) -> None:
    from agents.train.progress import read_progress
    from agents.train.trainer import run

    assert run(config) == 0
    doc = read_progress(config.progress_file)
    assert doc and doc["state"] == "finished" and doc["step"] == steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--save-steps", type=int, default=50)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args()

    import contextlib
    import io

    from agents.train.config import load_config
    from agents.train.tiny import ensure_demo

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-train-"))
    config_path = ensure_demo(work / "demo")
    common = {"max_steps": args.steps, "save_steps": args.save_steps, "logging_steps": 1}
    best: dict[str, float] = {}
    # alternate, best of --rounds each: the first run in a process pays for warm-up,
    # and a shared machine adds noise. Each is timed whole: load + tokenize + train + saves.
    for i in range(args.rounds):
        for kind in ("bare", "cetlab"):
            config = load_config(config_path, {**common, "output_dir": str(work / f"{kind}-{i}")}, env={})
            with contextlib.redirect_stdout(io.StringIO()):  # the Trainer prints every log
                t0 = time.perf_counter()
                (bare if kind == "bare" else cetlab)(config, args.steps)
                rate = args.steps / (time.perf_counter() - t0)
            best[kind] = max(best.get(kind, 0.0), rate)
    result = {
        "steps": args.steps,
        "rounds": args.rounds,
        "bare_steps_per_s": round(best["bare"], 2),
        "cetlab_steps_per_s": round(best["cetlab"], 2),
        "cetlab_overhead_pct": round(100 * (best["bare"] / best["cetlab"] - 1), 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
