"""Serving a checkpoint: an adapter loaded into a warm model, or the weights (merged if need be) as a new model."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.checkpoints.catalog import RunCatalog
from agents.checkpoints.discovery import Run, safe_name
from agents.checkpoints.parsing import Checkpoint
from agents.checkpoints.records import ServedRecord, ServedRecords
from agents.orchestra.port import ModelsPort, ModelView
from agents.runtime.children import OFFLINE, minimal_env, run_helper
from agents.runtime.core import AgentCore
from agents.runtime.rpc import Peer
from agents.wire.catalogue.checkpoints import Served
from agents.wire.events import Notice
from agents.wire.lab.model import Model
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.base import ServingMode
from agents.wire.sections.models import Serving
from agents.wire.states import MODEL_ENGINE_UP, ModelState

if TYPE_CHECKING:
    from agents.wire.catalogue.checkpoints import ServeParams

log = logging.getLogger("cetlab.checkpoints")


def merge_adapter(base: str, adapter: str, out: str) -> None:
    """Merge a PEFT adapter into a copy of its base model (peft merge_and_unload); runs in a child process."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = Path(out)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    merged.save_pretrained(tmp)
    tokenizer_from = adapter if (Path(adapter) / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def gguf_adapter_refusal(model: str, engine: str, why: str) -> str:
    """Why a trained (PEFT) adapter cannot be served on a llama.cpp model, and what can serve it."""
    return (
        f"{model} runs engine {engine}, which loads only GGUF adapters, at start (--lora); this PEFT adapter was not "
        f"converted ({why}). Serve it on a vllm model of the same base (--model), or merged on the CPU with "
        "transformers (leave --model out)"
    )


CONVERT_TIMEOUT_S = 600.0  # llama.cpp's adapter converter: seconds for a LoRA adapter, minutes at the most
MERGE_TIMEOUT_S = 3600.0  # peft's merge of an adapter into its base: a 70B base on a slow disk takes long


class CheckpointServing:
    """Serving checkpoints through the model pool's port (ModelsPort); the records of what is served are its own."""

    def __init__(self, core: AgentCore, catalog: RunCatalog, served: ServedRecords) -> None:
        self.core = core
        self.catalog = catalog
        self.served = served
        self.tasks: list[asyncio.Task[None]] = []  # bring-ups running in the background

    def _pool(self) -> ModelsPort:
        pool = self.core.find(ModelsPort)
        if pool is None:
            raise RemoteError(ErrorCode.UNAVAILABLE, f"no model pool on {self.core.machine.name}")
        return pool

    def _record(self, path: str, model: str, mode: ServingMode, state: Any, **extra: Any) -> ServedRecord:
        record = self.served[path] = ServedRecord(Serving(model=model, mode=mode, state=state), **extra)
        return record

    async def serve(self, peer: Peer, params: ServeParams) -> Served:
        run, ckpt = await self.catalog.complete(params.run, params.step)
        pool = self._pool()
        named = pool.view(params.model) if params.model else None
        if ckpt.kind == "adapter":
            target = named or (pool.adapter_host(Path(ckpt.base_model)) if ckpt.base_model else None)
            why_merged = None
            if target is not None and target.spec.adapter_format == "gguf":
                return self._start_gguf_adapter(peer, run, ckpt, pool, target)
            if target is not None and target.spec.hot_adapters:
                # vLLM refuses some adapters (modules_to_save, rank, no --enable-lora): merge those instead of failing
                why_merged = pool.adapter_problem(target.name, Path(ckpt.path))
                if why_merged is None:
                    return await self._load_adapter(peer, run, ckpt, pool, target)
                named = target
            base = str(named.path) if named is not None else ckpt.base_model
            if not base or not Path(base).is_dir():
                raise RemoteError(
                    ErrorCode.UNAVAILABLE,
                    f"the adapter's base model {base!r} is not a folder on {self.core.machine.name}; "
                    "name a warm model of the same base with --model",
                )
            return self._start_runtime(peer, run, ckpt, pool, template=named, merge_base=base, why_merged=why_merged)
        if ckpt.kind == "full":
            return self._start_runtime(peer, run, ckpt, pool, template=named, merge_base=None)
        raise RemoteError(ErrorCode.UNAVAILABLE, f"checkpoint {ckpt.step} of {run.name} holds no model or adapter weights")

    async def _load_adapter(self, peer: Peer, run: Run, ckpt: Checkpoint, pool: ModelsPort, slot: ModelView) -> Served:
        if slot.state != ModelState.WARM or slot.engine_serial is None:
            raise RemoteError(
                ErrorCode.CONFLICT,
                f"{slot.name} is {slot.state}; warm it first (`cetlab warm {slot.name}`), then serve the adapter",
            )
        name = safe_name(f"{run.name}-step{ckpt.step}")
        await pool.load_adapter(slot.name, name, ckpt.path)
        self._record(ckpt.path, slot.name, "adapter", ModelState.WARM, engine_serial=slot.engine_serial, adapter=name)
        self.catalog.event(run, ckpt, "serve", peer.who, {"model": slot.name, "mode": "adapter", "adapter": name})
        await self.catalog.rescan()
        base_matches = ckpt.base_model is not None and Path(ckpt.base_model).resolve() == slot.path.resolve()
        return Served(
            run=run.name,
            step=ckpt.step,
            mode="adapter",
            model=slot.name,
            served_name=name,
            endpoint=slot.endpoint,
            state=ModelState.WARM,
            base_matches=base_matches,
            simulated=slot.spec.simulated,
        )

    def _start_runtime(
        self,
        peer: Peer,
        run: Run,
        ckpt: Checkpoint,
        pool: ModelsPort,
        template: ModelView | None,
        merge_base: str | None,
        why_merged: str | None = None,
    ) -> Served:
        """A new model entry for this checkpoint (weights as they are, or the adapter merged into its base), warmed in the background.

        ``why_merged`` says why an adapter meant for a warm vLLM model is merged instead (vLLM cannot hot-load it).

        Over 80 lines: the steps of bringing a checkpoint up, in order, each refusal naming its fix.
        """
        name = safe_name(f"{run.name}-step{ckpt.step}")
        existing = pool.find_view(name)
        if any(m.name == name for m in self.core.lab.models):
            raise RemoteError(
                ErrorCode.CONFLICT, f"lab.yaml already has a model named {name}; rename the run's folder or that model"
            )
        if existing is not None and (existing.state in MODEL_ENGINE_UP or existing.busy):
            return self._runtime_served(run, ckpt, existing, "merged" if merge_base else "full")
        record = self.served.get(ckpt.path)
        if record is not None and record.serving.state == "merging":
            return Served(run=run.name, step=ckpt.step, mode=record.serving.mode, model=name, state="merging", endpoint=None)
        # --model lends its engine, GPUs and VRAM estimate; else `transformers serve` on the CPU
        engine = template.model.engine if template is not None else "transformers"
        spec = template.spec if template is not None else pool.engine_spec(engine)
        if "hf" not in spec.model_formats:  # a checkpoint (and a merge) is a Hugging Face folder
            raise RemoteError(
                ErrorCode.UNAVAILABLE,
                f"{template.name if template else engine} runs engine {engine}, which loads "
                f"{'/'.join(spec.model_formats)} files, not a checkpoint folder: serve it with "
                "--model naming a vllm or transformers model of the same base (or leave --model out: transformers on the CPU)",
            )
        gpus = list(template.model.gpus) if template is not None else []
        weights = Path(ckpt.path) if merge_base is None else self.core.state_dir / "checkpoints" / "merged" / name
        model = Model(
            name=name,
            path=str(weights),
            engine=engine,
            machine=self.core.machine.name,
            gpus=gpus,
            vram_gib=template.model.vram_gib if template is not None else None,
            args=list(template.model.args) if template is not None else [],
        )
        if template is not None:
            model = model.model_copy(update={"sim": template.model.sim})  # a sim template lends its delays too
        mode: ServingMode = "merged" if merge_base else "full"
        served = self._record(ckpt.path, name, mode, "merging" if merge_base else ModelState.LOADING).serving

        async def bring_up() -> None:
            try:
                if merge_base is not None:  # merged anew each time: the checkpoint may have been rewritten since
                    await self._merge(merge_base, ckpt.path, weights)
                pool.remove_model(name)  # a previous serving of this checkpoint, at rest or failed
                pool.add_model(model, weights)
                served.state = ModelState.LOADING
                view = await pool.bring_up(name)
                served.state = view.state
                if view.state == ModelState.FAILED:
                    served.error = view.error.message if view.error is not None else None
            except (RemoteError, RuntimeError, OSError) as exc:
                served.state, served.error = ModelState.FAILED, str(exc)
                log.warning("serving %s failed: %s", ckpt.path, exc)
                self.core.notify(Notice(level="error", message=f"serving {run.name} step {ckpt.step} failed: {exc}"))

        self._background(bring_up(), name)
        detail: dict[str, Any] = {"model": name, "mode": mode, "engine": engine}
        if why_merged is not None:
            detail["why_merged"] = why_merged
        self.catalog.event(run, ckpt, "serve", peer.who, detail)
        return Served(
            run=run.name,
            step=ckpt.step,
            mode=mode,
            model=name,
            engine=engine,
            why_merged=why_merged,
            state=served.state,
            endpoint=None,
            simulated=spec.simulated,
        )

    def _start_gguf_adapter(self, peer: Peer, run: Run, ckpt: Checkpoint, pool: ModelsPort, template: ModelView) -> Served:
        """llama.cpp: the PEFT adapter converted to GGUF (llama.cpp's convert_lora_to_gguf.py), then a new model: the
        template's GGUF started with `--lora` that file, the adapter applied once it is warm. Refused when it cannot convert.

        Over 80 lines: convert, place and start, in order, each refusal naming its fix."""
        spec = template.spec
        base = ckpt.base_model
        if not base or not (Path(base) / "config.json").is_file():
            raise RemoteError(
                ErrorCode.UNAVAILABLE,
                gguf_adapter_refusal(
                    template.name,
                    spec.name,
                    f"the converter reads the base's config.json, and the adapter's base {base!r} is no such folder "
                    f"on {self.core.machine.name}",
                ),
            )
        name = safe_name(f"{run.name}-step{ckpt.step}")
        if any(m.name == name for m in self.core.lab.models):
            raise RemoteError(
                ErrorCode.CONFLICT, f"lab.yaml already has a model named {name}; rename the run's folder or that model"
            )
        existing = pool.find_view(name)
        if existing is not None and (existing.state in MODEL_ENGINE_UP or existing.busy):
            return self._runtime_served(run, ckpt, existing, "gguf-adapter")
        conversion = pool.lora_conversion(
            Path(ckpt.path), Path(base), self.core.state_dir / "checkpoints" / "gguf" / f"{name}.gguf"
        )
        if conversion is None:
            raise RemoteError(
                ErrorCode.UNAVAILABLE,
                gguf_adapter_refusal(
                    template.name,
                    spec.name,
                    f"llama.cpp's convert_lora_to_gguf.py is not on {self.core.machine.name}: make llama-server",
                ),
            )
        out = conversion.out
        model = template.model.model_copy(
            update={"name": name, "served_name": None, "port": None, "args": [*template.model.args, "--lora", str(out)]}
        )
        served = self._record(ckpt.path, name, "gguf-adapter", "converting").serving

        async def bring_up() -> None:
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                done = await run_helper(conversion.argv, timeout_s=CONVERT_TIMEOUT_S, env=conversion.env)
                if done.returncode != 0:
                    lines = done.output.decode(errors="replace").strip().splitlines()
                    why = (
                        f"did not finish within {CONVERT_TIMEOUT_S:g} s"
                        if done.timed_out
                        else "failed: " + (lines[-1] if lines else f"exit {done.returncode}")
                    )
                    raise RuntimeError(gguf_adapter_refusal(template.name, spec.name, "convert_lora_to_gguf.py " + why))
                pool.remove_model(name)
                pool.add_model(model, template.path)
                served.state = ModelState.LOADING
                view = await pool.bring_up(name)
                if view.state == ModelState.WARM and view.engine_serial is not None:
                    await pool.load_adapter(name, name, str(out))  # named at start, applied now (scale 1)
                view = pool.view(name)
                served.state = view.state
                if view.state == ModelState.FAILED:
                    served.error = view.error.message if view.error is not None else None
            except (RemoteError, RuntimeError, OSError) as exc:
                message = exc.message if isinstance(exc, RemoteError) else str(exc)
                served.state, served.error = ModelState.FAILED, message
                log.warning("serving %s failed: %s", ckpt.path, message)
                self.core.notify(Notice(level="error", message=f"serving {run.name} step {ckpt.step} failed: {message}"))

        self._background(bring_up(), name)
        detail: dict[str, Any] = {"model": name, "mode": "gguf-adapter", "engine": spec.name, "adapter_gguf": str(out)}
        self.catalog.event(run, ckpt, "serve", peer.who, detail)
        return Served(
            run=run.name,
            step=ckpt.step,
            mode="gguf-adapter",
            model=name,
            engine=spec.name,
            adapter_gguf=str(out),
            state="converting",
            endpoint=None,
            simulated=spec.simulated,
        )

    def _background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        self.tasks = [t for t in self.tasks if not t.done()]
        self.tasks.append(asyncio.create_task(work, name=f"serve-{name}"))

    @staticmethod
    def _runtime_served(run: Run, ckpt: Checkpoint, slot: ModelView, mode: str) -> Served:
        return Served(
            run=run.name,
            step=ckpt.step,
            mode=mode,
            model=slot.name,
            engine=slot.model.engine,
            state=slot.state,
            endpoint=slot.endpoint,
            simulated=slot.spec.simulated,
        )

    async def _merge(self, base: str, adapter: str, out: Path) -> None:
        """peft merge_and_unload in a child process: torch stays out of the agent."""
        out.parent.mkdir(parents=True, exist_ok=True)
        code = "import sys; from agents.checkpoints.serving import merge_adapter; merge_adapter(*sys.argv[1:])"
        python_path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
        done = await run_helper(
            [sys.executable, "-c", code, base, adapter, str(out)],
            timeout_s=MERGE_TIMEOUT_S,
            env=minimal_env({**OFFLINE, **python_path}),  # the base is a local folder: nothing to fetch
        )
        if done.timed_out:
            raise RuntimeError(f"merging the adapter into {base} did not finish within {MERGE_TIMEOUT_S:g} s")
        if done.returncode != 0:
            raise RuntimeError(f"merging the adapter into {base} failed: {done.output.decode(errors='replace').strip()[-300:]}")
