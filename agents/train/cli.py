"""The cetlab-train command line.

    cetlab-train --config train.yaml [--max-steps N] [--learning-rate F] [--output-dir P]
                 [--resume-from-checkpoint P|latest] [--save-steps N] [--set key=value ...] [--check]
    cetlab-train make-tiny --out DIR [--seed N]
    cetlab-train demo [--dir DIR] [--run]

Exit status: 0 done (or stopped cleanly by SIGTERM), 1 training failed,
2 bad config / dataset / usage (one line on stderr), 130 interrupted twice.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from agents.wire.entry import quiet_pipe

EXIT_USAGE = 2


def _error(message: str) -> int:
    for line in message.splitlines():
        print(f"cetlab-train: error: {line}", file=sys.stderr)
    return EXIT_USAGE


def _train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cetlab-train",
        description="LoRA / QLoRA supervised fine-tuning configured by a YAML file. "
        "Other commands: 'cetlab-train make-tiny --out DIR', 'cetlab-train demo [--dir DIR] [--run]'.",
    )
    p.add_argument("--config", "-c", required=True, help="the trainer's YAML config")
    p.add_argument("--max-steps", type=int, help="override max_steps")
    p.add_argument("--learning-rate", type=float, help="override learning_rate")
    p.add_argument("--output-dir", help="override output_dir (relative to the current directory)")
    p.add_argument("--resume-from-checkpoint", help="a checkpoint folder, 'latest', or 'none'")
    p.add_argument("--save-steps", type=int, help="override save_steps")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any key, e.g. --set lora.r=16 (value read as YAML); repeatable",
    )
    p.add_argument("--check", action="store_true", help="validate the config, print it resolved as JSON, and exit")
    return p


def _fail_progress(message: str) -> None:
    """A broken config still tells the agent why, when it named a progress file."""
    from agents.train.progress import ENV_VAR, write_progress

    path = os.environ.get(ENV_VAR)
    if path:
        try:
            write_progress(path, {"state": "failed", "error": message.splitlines()[0]})
        except OSError:
            pass


def train_main(argv: list[str]) -> int:
    from agents.train.config import ConfigError, load_config, parse_override

    args = _train_parser().parse_args(argv)
    try:
        overrides: dict[str, Any] = dict(parse_override(item) for item in args.set)
        flags = {
            "max_steps": args.max_steps,
            "learning_rate": args.learning_rate,
            "output_dir": args.output_dir,
            "save_steps": args.save_steps,
        }
        overrides.update({k: v for k, v in flags.items() if v is not None})
        if args.resume_from_checkpoint is not None:
            value = args.resume_from_checkpoint
            overrides["resume_from_checkpoint"] = None if value.lower() in ("", "none", "null") else value
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        _fail_progress(str(exc))
        return _error(str(exc))
    if args.check:
        print(json.dumps(config.model_dump(mode="json"), indent=2))
        return 0
    from agents.train.trainer import run

    try:
        return run(config)
    finally:
        _leave_process_group()


def _leave_process_group() -> None:
    """End torchrun's process group before the interpreter exits: left to the interpreter's shutdown, gloo's threads
    are torn down in no set order and a finished rank could abort ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def make_tiny_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="cetlab-train make-tiny", description="Create the tiny random Llama + tokenizer (no downloads)."
    )
    p.add_argument("--out", required=True, help="folder to create it in (skipped if already there)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from agents.train.tiny import make_tiny_model

    print(make_tiny_model(args.out, seed=args.seed))
    return 0


def demo_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="cetlab-train demo", description="Lay out the demo recipe (tiny model, dataset, train.yaml); optionally run it."
    )
    p.add_argument("--dir", default=".cetlab-demo", help="where to put it (default: ./.cetlab-demo)")
    p.add_argument("--run", action="store_true", help="train it right away")
    args = p.parse_args(argv)
    from agents.train.tiny import ensure_demo

    config = ensure_demo(Path(args.dir))
    print(config)
    if args.run:
        return train_main(["--config", str(config)])
    return 0


@quiet_pipe
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "make-tiny":
        return make_tiny_main(argv[1:])
    if argv and argv[0] == "demo":
        return demo_main(argv[1:])
    if argv and argv[0] == "--make-tiny":
        return make_tiny_main(["--out", *argv[1:2], *argv[2:]])
    return train_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
