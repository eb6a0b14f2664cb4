"""Trainer recipes: typed launch parameters, the argv they build, and the checks before a start."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from agents.wire.catalogue.jobs import RecipeInfo, RecipeParam
from agents.wire.lab.model import Lab, Trainer, TrainerParam
from agents.wire.lab.queue import gpu_misfit, may_run_on
from agents.wire.protocol import ErrorCode, GpuSample, RemoteError

MAX_STR_PARAM = 4096
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _bad(message: str) -> RemoteError:
    return RemoteError(ErrorCode.INVALID_PARAMS, message)


def coerce_param(param: TrainerParam, value: Any) -> int | float | str | bool:
    """One launch value, checked against its declaration; strings (from `--set k=v`) are parsed."""
    name = param.name
    if param.type == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise _bad(f"param {name}: expected true or false, got {value!r}")
    if param.type in ("int", "float"):
        number: int | float
        if isinstance(value, bool):
            raise _bad(f"param {name}: expected a number, got {value!r}")
        try:
            if param.type == "int":
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError
                number = int(value) if not isinstance(value, str) else int(value.strip(), 10)
            else:
                number = float(value)
        except (TypeError, ValueError):
            raise _bad(f"param {name}: expected {'an integer' if param.type == 'int' else 'a number'}, got {value!r}") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise _bad(f"param {name}: expected a finite number, got {value!r}")
        if param.min is not None and number < param.min:
            raise _bad(f"param {name}: {number} is below the minimum {param.min:g}")
        if param.max is not None and number > param.max:
            raise _bad(f"param {name}: {number} is above the maximum {param.max:g}")
        return number
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise _bad(f"param {name}: expected a string, got {value!r}")
    text = str(value)
    if param.type == "choice":
        if text not in param.choices:
            raise _bad(f"param {name}: {text!r} is not one of {', '.join(param.choices)}")
        return text
    # a value that looks like an option would be read as one by the trainer's parser
    if text.startswith("-") or "\x00" in text or len(text) > MAX_STR_PARAM:
        raise _bad(f"param {name}: a string may not start with '-', hold NUL or exceed {MAX_STR_PARAM} characters")
    return text


def resolve_params(recipe: Trainer, given: dict[str, Any]) -> dict[str, Any]:
    """Defaults overlaid with the operator's values, every value checked; unknown names refused."""
    declared = {p.name: p for p in recipe.params}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        known = ", ".join(declared) or "none"
        raise _bad(f"recipe {recipe.name} has no param {', '.join(unknown)} (params: {known})")
    values: dict[str, Any] = {}
    for name, param in declared.items():
        value = given.get(name, param.default)
        if value is not None:
            values[name] = coerce_param(param, value)
    return values


def flag_of(param: TrainerParam) -> str:
    return param.flag or "--" + param.name.replace("_", "-")


def param_args(recipe: Trainer, values: dict[str, Any]) -> list[str]:
    """`flag value` pairs in declaration order; a bool is its bare flag when true, absent when false."""
    args: list[str] = []
    for param in recipe.params:
        if param.name not in values:
            continue
        value = values[param.name]
        if param.type == "bool":
            args += [flag_of(param)] if value else []
        else:
            args += [flag_of(param), repr(value) if isinstance(value, float) else str(value)]
    return args


def expand(text: str, job_id: str, output_dir: str | None = None) -> str:
    """The agent's own placeholders in recipe strings: {job_id} and {output_dir}; nothing from the wire."""
    text = text.replace("{job_id}", job_id)
    return text.replace("{output_dir}", output_dir) if output_dir is not None else text


def search_path(env: dict[str, str]) -> str:
    """PATH for finding commands: the job's PATH, then the folder of the agent's Python (its console scripts)."""
    parts = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p]
    here = str(Path(sys.executable).parent)
    return os.pathsep.join(parts + ([here] if here not in parts else []))


def find_program(program: str, cwd: Path, path: str) -> str | None:
    """Absolute path of an executable program, as exec would find it, or None."""
    if os.sep in program:
        candidate = (cwd / program) if not os.path.isabs(program) else Path(program)
        return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None
    return shutil.which(program, path=path)


def nproc(recipe: Trainer) -> int:
    return recipe.nproc_per_node or len(recipe.gpus)


def build_argv(
    recipe: Trainer,
    values: dict[str, Any],
    job_id: str,
    output_dir: str,
    torchrun: str = "torchrun",
    rendezvous: list[str] | None = None,
) -> list[str]:
    """The full command line: the recipe's argv (placeholders expanded), its declared flags, under torchrun if asked.

    ``rendezvous``: torchrun's arguments for one node of a multi-node job; default a standalone single node.
    """
    command = [expand(arg, job_id, output_dir) for arg in recipe.command] + param_args(recipe, values)
    if recipe.launcher != "torchrun":
        return command
    launch = [torchrun, *(rendezvous or ["--standalone", "--nnodes", "1"]), "--nproc-per-node", str(nproc(recipe))]
    # torchrun runs a .py script with Python itself; anything else (a console script, a binary) as is
    return launch + (command if command[0].endswith(".py") else ["--no-python", *command])


def visible_devices(gpus: list[int]) -> str:
    return ",".join(str(i) for i in gpus)


def find_recipe(lab: Lab, name: str, machine: str) -> Trainer:
    for recipe in lab.trainers:
        if recipe.name == name:
            if not may_run_on(recipe, machine):
                where = ", ".join(recipe.need.machines) if recipe.need is not None else recipe.machine
                raise RemoteError(ErrorCode.NOT_FOUND, f"recipe {name} runs on {where}, not on {machine}")
            return recipe
    names = ", ".join(r.name for r in lab.trainers if may_run_on(r, machine)) or "none"
    raise RemoteError(ErrorCode.NOT_FOUND, f"no recipe named {name!r} on {machine} (recipes here: {names})")


def placed(recipe: Trainer, gpus: list[int] | None, machine: str, found: list[GpuSample]) -> Trainer:
    """The recipe on the GPUs the lab queue chose (a recipe by need), each checked against its need here; a recipe
    by need without them is refused with the command that queues it, and one with GPU numbers takes no others."""
    if recipe.need is None:
        if gpus is not None and sorted(gpus) != sorted(recipe.gpus):
            raise RemoteError(
                ErrorCode.INVALID_PARAMS, f"recipe {recipe.name} names its GPUs ({recipe.gpus}); it takes no others"
            )
        return recipe
    if gpus is None:
        raise RemoteError(
            ErrorCode.INVALID_PARAMS,
            f"recipe {recipe.name} asks for {recipe.need.describe()}: `cetlab train {recipe.name}` queues it and picks its GPUs",
        )
    if len(set(gpus)) != recipe.need.gpus:
        raise RemoteError(ErrorCode.INVALID_PARAMS, f"recipe {recipe.name} needs {recipe.need.gpus} distinct GPUs, given {gpus}")
    by_index = {g.index: g for g in found}
    for index in gpus:
        gpu = by_index.get(index)
        problem = gpu_misfit(recipe.need, gpu) if gpu is not None else f"{machine} has no GPU {index}"
        if problem is not None:
            raise RemoteError(ErrorCode.CONFLICT, f"recipe {recipe.name} asks for {recipe.need.describe()}: {problem}")
    return recipe.model_copy(update={"gpus": sorted(gpus)})


def recipe_info(recipe: Trainer) -> RecipeInfo:
    """A recipe as the console's launch form needs it."""
    return RecipeInfo(
        name=recipe.name,
        machine=recipe.machine,
        gpus=recipe.gpus,
        nodes=[node.machine for node in recipe.nodes],
        launcher=recipe.launcher,
        nproc_per_node=nproc(recipe) if recipe.launcher == "torchrun" else None,
        command=recipe.command,
        output_dir=recipe.output_dir,
        params=[RecipeParam.model_validate({**p.model_dump(mode="json"), "flag": flag_of(p)}) for p in recipe.params],
    )
