"""The training run: tokenizer + causal LM + LoRA (peft) on transformers' Trainer, reporting progress.

``run(config)`` returns the process exit status:

* 0 - trained to max_steps / epochs, or stopped early by SIGTERM / a first
  Ctrl-C (a checkpoint is saved at the step it stopped at; progress says
  ``finished`` with ``stop_reason`` set);
* 1 - training failed (progress ``failed``; the traceback goes to stderr);
* 2 - the dataset, model folder or an option cannot be used (one line on
  stderr, progress ``failed``);
* 130 - interrupted twice (the second signal is not waited on).

torch, transformers and peft are imported here, inside functions.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.train.config import ConfigError, TrainConfig
from agents.train.data import DataError
from agents.train.precision import PrecisionPlan, PrecisionRefused, compute_dtype, device_capability, plan_precision
from agents.train.progress import clean_number, read_progress, write_progress
from agents.wire.words import plural

if TYPE_CHECKING:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments


def step_line(figures: dict[str, Any]) -> str:
    """One logged step as a line of the job's log: `cetlab-train: step 50/2000  loss 0.0024  lr 2.43e-04 ...`."""

    def num(value: Any, spec: str, missing: str = "-") -> str:
        return missing if value is None else format(value, spec)

    line = f"cetlab-train: step {figures['step']}/{figures['max_steps']}  loss {num(figures['loss'], '.4g', 'NaN')}"
    line += f"  lr {num(figures['learning_rate'], '.3g')}  grad_norm {num(figures['grad_norm'], '.3g')}  epoch {num(figures['epoch'], '.4g')}"
    if figures.get("samples_per_s") is not None:
        line += f"  {figures['samples_per_s']:.3g} samples/s"
    return line


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Reporter:
    """Holds the progress document and writes it (atomically) on every change."""

    def __init__(self, path: Path, started: float):
        self.path = path
        self.started = started
        self.doc: dict[str, Any] = {"pid": os.getpid(), "state": "starting", "step": 0, "checkpoints": []}

    def update(self, **changes: Any) -> None:
        self.doc.update(changes)
        self.doc["elapsed_s"] = round(time.monotonic() - self.started, 3)
        if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 speaks for the run
            return
        try:
            write_progress(self.path, self.doc)
        except OSError as exc:  # progress is best effort; never kill a run over it
            log(f"cetlab-train: cannot write progress to {self.path}: {exc}")

    def carry_checkpoints(self, output_dir: Path) -> None:
        """Keep the checkpoints a previous run in the same output_dir reported, if still on disk."""
        output_dir = output_dir.resolve()
        old = read_progress(self.path) or {}
        known = [
            c
            for c in old.get("checkpoints") or []
            if isinstance(c, dict)
            and isinstance(c.get("path"), str)
            and Path(c["path"]).parent == output_dir
            and Path(c["path"]).is_dir()
        ]
        paths = {c["path"] for c in known}
        for folder in sorted(output_dir.glob("checkpoint-*"), key=_step_of):
            if folder.is_dir() and str(folder) not in paths and _step_of(folder) >= 0:
                known.append({"step": _step_of(folder), "path": str(folder), "save_s": None, "at": folder.stat().st_mtime})
        self.doc["checkpoints"] = sorted(known, key=lambda c: c.get("step") or 0)


def _step_of(folder: Path) -> int:
    try:
        return int(folder.name.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return -1


class StopFlag:
    """SIGTERM / SIGINT: the first asks for a clean stop, the second acts at once."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._pid = os.getpid()
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        self._pid = os.getpid()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:
            return  # a forked dataloader worker: the trainer process shuts it down
        name = signal.Signals(signum).name
        if self.signal_name is not None:
            raise KeyboardInterrupt(f"second {name}")
        self.signal_name = name
        log(f"cetlab-train: {name}: stopping after this step (a checkpoint will be saved); send it again to stop at once")


def agreed_stop(signal_name: str | None, device: Any) -> str | None:
    """The stop signal any rank has seen (None: none has), so that every rank stops at the same step.

    Ranks get SIGTERM at slightly different moments; one that stopped alone would leave the
    others waiting in the next collective. One all-reduce (MAX of the signal number) per step.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return signal_name
    flag = torch.tensor([signal.Signals[signal_name].value if signal_name else 0], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    value = int(flag.item())
    return signal.Signals(value).name if value else None


def make_callback(reporter: Reporter, stop: StopFlag, samples_per_step: int) -> TrainerCallback:
    """Over 80 lines: the callback class is defined inside, so transformers is imported only when a run trains."""
    from transformers import TrainerCallback

    class ProgressCallback(TrainerCallback):
        """Writes progress on train begin, every log, around every save; honours the StopFlag."""

        def __init__(self) -> None:
            self.t0 = self.last_t = time.monotonic()
            self.step0 = self.last_step = 0
            self.last_tokens = 0
            self.save_t0: float | None = None

        def on_train_begin(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
        ) -> TrainerControl:
            self.t0 = self.last_t = time.monotonic()
            self.step0 = self.last_step = state.global_step
            self.last_tokens = state.num_input_tokens_seen or 0
            reporter.update(state="running", step=state.global_step, max_steps=state.max_steps, epoch=state.epoch)
            if stop.signal_name:
                control.should_training_stop = True
            return control

        def on_step_end(
            self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
        ) -> TrainerControl:
            signal_name = agreed_stop(stop.signal_name, args.device)
            if signal_name and not reporter.doc.get("stop_reason"):
                reporter.doc["stop_reason"] = f"signal:{signal_name}"
                control.should_training_stop = True
                control.should_save = True
            if control.should_training_stop:
                control.should_log = True  # report the loss of the last steps too
            if control.should_save:
                reporter.update(state="saving", step=state.global_step, epoch=state.epoch)
                self.save_t0 = time.monotonic()
            return control

        def on_log(
            self,
            args: TrainingArguments,
            state: TrainerState,
            control: TrainerControl,
            logs: dict[str, Any] | None = None,
            **kwargs: Any,
        ) -> TrainerControl:
            logs = logs or {}
            if "loss" not in logs:  # the end-of-training summary
                if logs.get("train_runtime") is not None:
                    log(
                        f"cetlab-train: trained {plural(state.global_step, 'step')}, train_runtime {logs['train_runtime']:.3f}s"
                        f" (model load and imports excluded)"
                    )
                return control
            now = time.monotonic()
            changes: dict[str, Any] = {
                "step": state.global_step,
                "max_steps": state.max_steps,
                "epoch": clean_number(state.epoch),
                "loss": clean_number(logs.get("loss")),
                "learning_rate": clean_number(logs.get("learning_rate")),
                "grad_norm": clean_number(logs.get("grad_norm")),
            }
            if changes["loss"] is None and reporter.doc.get("diverged_at_step") is None:
                changes["diverged_at_step"] = state.global_step  # a NaN/inf loss: the run diverged here
            steps, dt = state.global_step - self.last_step, now - self.last_t
            if steps > 0 and dt > 0:
                tokens = state.num_input_tokens_seen or 0
                changes["samples_per_s"] = round(steps * samples_per_step / dt, 3)
                changes["tokens_per_s"] = round((tokens - self.last_tokens) / dt, 3) if tokens else None
                self.last_tokens = tokens
            done, total = state.global_step - self.step0, now - self.t0
            if done > 0 and total > 0:
                changes["eta_s"] = round(max(state.max_steps - state.global_step, 0) * total / done, 3)
            self.last_step, self.last_t = state.global_step, now
            reporter.update(**changes)
            log(step_line(changes))
            if self.save_t0 is not None:
                self.save_t0 = time.monotonic()  # the save has not started yet; do not count the log
            return control

        def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
            now = time.monotonic()
            save_s = now - self.save_t0 if self.save_t0 is not None else None
            self.save_t0 = None
            if args.output_dir is None:  # run_training always gives one (cfg.output_dir): no folder, no checkpoint to name
                return control
            path = Path(args.output_dir).resolve() / f"checkpoint-{state.global_step}"
            entries = [c for c in reporter.doc["checkpoints"] if c.get("path") != str(path) and Path(c["path"]).is_dir()]
            entries.append(
                {
                    "step": state.global_step,
                    "path": str(path),
                    "save_s": round(save_s, 4) if save_s is not None else None,
                    "at": time.time(),
                }
            )
            log(f"cetlab-train: saved {path.name} in {save_s:.2f}s" if save_s is not None else f"cetlab-train: saved {path.name}")
            reporter.update(state="running", checkpoints=entries)
            # throughput is training throughput: take the save out of the current window
            self.last_t += time.monotonic() - now + (save_s or 0.0)
            return control

    return ProgressCallback()


def run(config: TrainConfig) -> int:
    """Train per ``config``; returns the exit status (see the module docstring)."""
    started = time.monotonic()
    reporter = Reporter(config.progress_path, started)
    reporter.carry_checkpoints(Path(config.output_dir))
    reporter.update(state="starting")
    stop = StopFlag()
    stop.install()
    try:
        _train(config, reporter, stop)
        reporter.update(state="finished", eta_s=0.0, stop_reason=reporter.doc.get("stop_reason") or "max_steps")
        log(f"cetlab-train: finished at step {reporter.doc.get('step')} (loss {reporter.doc.get('loss')})")
        return 0
    except (ConfigError, DataError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reporter.update(state="failed", error=message)
        log(f"cetlab-train: error: {exc}")
        return 2
    except KeyboardInterrupt as exc:
        reporter.update(state="failed", error=f"interrupted ({exc or 'SIGINT'})")
        log("cetlab-train: interrupted")
        return 130
    except Exception as exc:
        traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        reporter.update(state="failed", error=message)
        log(f"cetlab-train: failed: {message}")
        return 1
    finally:
        stop.uninstall()


def _precision_plan(cfg: TrainConfig, reporter: Reporter) -> PrecisionPlan:
    """The run's precision for the device it trains on; notes go to the log and the progress file."""
    capability, name = device_capability()
    try:
        plan = plan_precision(cfg.precision, capability, tf32=cfg.tf32, torch_compile=cfg.torch_compile, device_name=name)
    except PrecisionRefused as exc:
        raise ConfigError(str(exc)) from None
    for note in plan.notes:
        log(f"cetlab-train: {note}")
    reporter.update(precision=plan.precision, notes=list(plan.notes))
    return plan


def _train(cfg: TrainConfig, reporter: Reporter, stop: StopFlag) -> None:
    base = Path(cfg.base_model)
    if cfg.make_tiny_if_missing and base.is_absolute() and not (base / "config.json").exists():
        from agents.train.tiny import make_tiny_model

        log(f"cetlab-train: creating the tiny demo model in {base}")
        make_tiny_model(base, seed=cfg.seed)

    import torch

    if cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    cuda = torch.cuda.is_available()
    _check_qlora(cfg, cuda)
    plan = _precision_plan(cfg, reporter)

    import transformers
    from transformers import Trainer
    from transformers.trainer_callback import PrinterCallback

    from agents.train.data import PadCollator, build_dataset

    transformers.set_seed(cfg.seed)
    tokenizer = _tokenizer(cfg)
    dataset = build_dataset(Path(cfg.dataset), tokenizer, cfg.max_seq_len, cfg.pretokenized_cache, log=log)
    log(f"cetlab-train: {plural(len(dataset), 'row')}, {plural(dataset.token_count(), 'token')} from {cfg.dataset}")
    trained = _lora_model(cfg, plan)
    output_dir = Path(cfg.output_dir)
    resume = _resume_from(cfg, output_dir)
    args = _training_args(cfg, plan, cuda, output_dir)
    samples_per_step = cfg.per_device_batch_size * cfg.grad_accumulation * max(args.world_size, 1)
    trainer = Trainer(
        model=trained,
        args=args,
        train_dataset=dataset,
        data_collator=PadCollator(tokenizer.pad_token_id),
        processing_class=tokenizer,
        callbacks=[make_callback(reporter, stop, samples_per_step)],
    )
    if stop.signal_name:
        reporter.doc["stop_reason"] = f"signal:{stop.signal_name}"
        log("cetlab-train: stopped before training began")
        return
    trainer.remove_callback(PrinterCallback)  # it prints each log as a Python dict; on_log above says it in words
    trainer.train(resume_from_checkpoint=resume)
    state = trainer.state
    reporter.doc.update(step=state.global_step, max_steps=state.max_steps, epoch=clean_number(state.epoch))


def _check_qlora(cfg: TrainConfig, cuda: bool) -> None:
    """qlora: true needs a CUDA GPU and bitsandbytes: said before anything loads."""
    if not cfg.qlora:
        return
    if not cuda:
        raise ConfigError(
            "qlora: true needs a CUDA GPU (4-bit bitsandbytes weights); none is visible here. Set qlora: false to train LoRA in full precision"
        )
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError("qlora: true needs the bitsandbytes package: pip install bitsandbytes")


def _tokenizer(cfg: TrainConfig) -> Any:
    """The base model's tokenizer, padding on the right with its pad token (its eos where it has none)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.base_model)
    except OSError as exc:
        raise ConfigError(f"base_model: cannot load a tokenizer from {cfg.base_model}: {str(exc).splitlines()[0]}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    if tokenizer.pad_token_id is None:
        raise ConfigError(f"base_model: the tokenizer in {cfg.base_model} has neither a pad nor an eos token")

    return tokenizer


def _lora_model(cfg: TrainConfig, plan: PrecisionPlan) -> Any:
    """The base model loaded as the precision plan says (4-bit for QLoRA), with the recipe's LoRA adapter on it."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    # fp16 keeps float32 master weights (autocast + loss scaling); bf16 trains in bf16 weights
    dtype = torch.bfloat16 if plan.precision == "bf16" else torch.float32
    model_kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": "sdpa" if cfg.sdpa else "eager"}
    if cfg.qlora:
        from transformers import BitsAndBytesConfig

        compute = compute_dtype(plan.precision)
        quantization: Any = BitsAndBytesConfig  # unannotated in transformers
        model_kwargs["quantization_config"] = quantization(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute
        )
        model_kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", torch.cuda.current_device()))}
    try:
        model = AutoModelForCausalLM.from_pretrained(cfg.base_model, **model_kwargs)
    except OSError as exc:
        raise ConfigError(f"base_model: cannot load a model from {cfg.base_model}: {str(exc).splitlines()[0]}") from None
    model.config.use_cache = False
    if cfg.qlora:
        prepare: Any = prepare_model_for_kbit_training  # unannotated in peft
        model = prepare(model, use_gradient_checkpointing=cfg.gradient_checkpointing)
    elif cfg.gradient_checkpointing:
        require_grads: Any = model.enable_input_require_grads  # unannotated in transformers
        require_grads()

    lora = LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,  # type: ignore[arg-type]  # peft annotates int; a float alpha scales the same (alpha / r)
        lora_dropout=cfg.lora.dropout,
        target_modules=cfg.lora.target_modules,
        modules_to_save=cfg.lora.modules_to_save or None,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with warnings.catch_warnings():
            # peft reads transformers' deprecated is_gradient_checkpointing: a FutureWarning at the top of every job's log
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
            trained = get_peft_model(model, lora)
    except ValueError as exc:
        raise ConfigError(f"lora: {str(exc).splitlines()[0]}") from None
    trainable = sum(p.numel() for p in trained.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trained.parameters())
    log(f"cetlab-train: {trainable:,} of {total:,} parameters trainable ({100 * trainable / max(total, 1):.2f}%)")

    return trained


def _resume_from(cfg: TrainConfig, output_dir: Path) -> str | None:
    """The checkpoint to resume from: the recipe's, the last in output_dir for `latest`, or None."""
    from transformers.trainer_utils import get_last_checkpoint

    resume = cfg.resume_from_checkpoint
    if resume == "latest":
        last_checkpoint: Any = get_last_checkpoint  # unannotated in transformers
        resume = last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
        log(
            f"cetlab-train: resuming from {resume}"
            if resume
            else f"cetlab-train: no checkpoint in {output_dir} yet; starting fresh"
        )
    elif resume:
        log(f"cetlab-train: resuming from {resume}")

    return resume


def _training_args(cfg: TrainConfig, plan: PrecisionPlan, cuda: bool, output_dir: Path) -> Any:
    """transformers' TrainingArguments from the recipe and the precision plan."""
    from transformers import TrainingArguments

    extra: dict[str, Any] = {}
    if cfg.gradient_checkpointing:
        import inspect

        # renamed activation_checkpointing in transformers 5
        name = (
            "activation_checkpointing"
            if "activation_checkpointing" in inspect.signature(TrainingArguments).parameters
            else "gradient_checkpointing"
        )
        extra[name] = True
        extra[f"{name}_kwargs"] = {"use_reentrant": False}
    return TrainingArguments(
        **extra,
        output_dir=str(output_dir),
        per_device_train_batch_size=cfg.per_device_batch_size,
        gradient_accumulation_steps=cfg.grad_accumulation,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.max_grad_norm,
        logging_strategy="steps",
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        bf16=plan.precision == "bf16",
        fp16=plan.precision == "fp16",
        tf32=True if plan.tf32 else None,
        torch_compile=plan.torch_compile,
        dataloader_num_workers=cfg.dataloader_workers,
        dataloader_pin_memory=cuda,
        seed=cfg.seed,
        use_cpu=not cuda,
        report_to="none",
        remove_unused_columns=False,
        include_num_input_tokens_seen="non_padding",
        disable_tqdm=not sys.stderr.isatty(),
    )
