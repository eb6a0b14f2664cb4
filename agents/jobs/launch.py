"""Launching a recipe's process: every check first (params, GPUs, program, output folder), then the runner that outlives
the agent (agents/jobs/runner.py); a refused start leaves no process and no folder behind."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import psutil

from agents.gpusupport.port import GpuSupportPort
from agents.jobs import recipes
from agents.jobs.job import Job
from agents.jobs.node import NodeLaunch
from agents.jobs.refind import keep_on_disk
from agents.orchestra.port import ModelsPort
from agents.runtime.procfiles import LOG_KEEP, LOG_MAX_BYTES
from agents.train.progress import ENV_VAR as PROGRESS_ENV
from agents.wire.lab.model import Trainer
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.states import JobState
from agents.wire.words import plural

if TYPE_CHECKING:
    from agents.jobs.component import JobsComponent

log = logging.getLogger("cetlab.jobs")


def create_time(pid: int) -> float | None:
    try:
        created: float = psutil.Process(pid).create_time()
        return created
    except psutil.Error:
        return None


def recipe_env(recipe: Trainer, job_id: str, output_dir: str) -> dict[str, str]:
    """The environment of a recipe's process: the agent's, the recipe's own, and the GPUs it may see."""
    env = dict(os.environ)
    # torchrun's grace for its workers after SIGTERM (its default is 30 s): the recipe's own
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(max(1, int(recipe.stop_grace_s)))
    env.update({k: recipes.expand(v, job_id, output_dir) for k, v in recipe.env.items()})
    env["PATH"] = recipes.search_path(env)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA numbers GPUs as NVML does (PCI order), not fastest first
    env["CUDA_VISIBLE_DEVICES"] = recipes.visible_devices(recipe.gpus)  # none: no GPU, not every GPU
    env["CETLAB_JOB_ID"] = job_id
    env["PYTHONUNBUFFERED"] = "1"  # log lines as they happen, not when a buffer fills
    return env


def check_gpus(jobs: JobsComponent, recipe: Trainer) -> None:
    """The recipe's GPUs exist and no active job or model holds one of them."""
    core = jobs.core
    latest = core.latest
    count = len(latest.gpus) if latest is not None and latest.gpu_backend != "none" else None
    for index in recipe.gpus:
        if count is not None and index >= count:
            raise RemoteError(
                ErrorCode.UNAVAILABLE, f"recipe {recipe.name} wants GPU {index}, {core.machine.name} has {plural(count, 'GPU')}"
            )
    for other in jobs.jobs.values():
        taken = sorted(set(other.gpus) & set(recipe.gpus))
        if other.active and taken:
            raise RemoteError(
                ErrorCode.CONFLICT,
                f"GPU {','.join(map(str, taken))} is taken by job {other.id} ({other.recipe}, {other.state}); stop it first or pick other GPUs",
                {"job": other.id},
            )
    pool = core.find(ModelsPort)
    for model in pool.holding_gpus() if pool is not None else []:
        taken = sorted(set(model.gpus) & set(recipe.gpus))
        if taken:
            raise RemoteError(
                ErrorCode.CONFLICT,
                f"GPU {','.join(map(str, taken))} holds model {model.name} ({model.state}); "
                f"`cetlab sleep {model.name}` or `cetlab cold {model.name}` first, or pick other GPUs",
                {"model": model.name},
            )


def launch(
    jobs: JobsComponent, name: str, given: dict[str, Any], node: NodeLaunch | None = None, placed: Trainer | None = None
) -> Job:
    """Check everything, then launch; any problem is a typed error before a process exists. ``node``: one node of a multi-node job.

    Over 80 lines: each check before the process, in the order its refusals are documented, then the start."""
    core = jobs.core
    lab = core.lab
    recipe = node.recipe if node is not None else placed or recipes.find_recipe(lab, name, core.machine.name)
    values = recipes.resolve_params(recipe, given)
    check_gpus(jobs, recipe)
    job_id = node.job_id if node is not None else jobs.next_id()
    output_dir = lab.resolve(recipes.expand(recipe.output_dir, job_id))
    cwd = lab.resolve(recipe.cwd) if recipe.cwd else (lab.source.parent if lab.source else output_dir)
    if cwd != output_dir and not cwd.is_dir():
        raise RemoteError(ErrorCode.UNAVAILABLE, f"cwd {cwd} of recipe {name} is not a folder")
    env = recipe_env(recipe, job_id, str(output_dir)) | (node.env() if node is not None else {})
    program = recipes.expand(recipe.command[0], job_id, str(output_dir))
    found = recipes.find_program(program, cwd, env["PATH"])
    if found is None:
        raise RemoteError(
            ErrorCode.UNAVAILABLE,
            f"command {program!r} of recipe {name} not found or not executable on {core.machine.name} (PATH {env['PATH']})",
        )
    if (support := core.find(GpuSupportPort)) is not None:  # its torch has kernels for its GPUs, or a refusal with the fix
        support.check_job(name, recipe.gpus, str(found))
    torchrun = "torchrun"
    if recipe.launcher == "torchrun":
        installed = recipes.find_program("torchrun", cwd, env["PATH"])
        if installed is None:
            raise RemoteError(
                ErrorCode.UNAVAILABLE, f"recipe {name} uses torchrun, which is not installed on {core.machine.name}"
            )
        torchrun = installed
    try:  # last: a refused start leaves no empty folder behind
        output_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(output_dir, os.W_OK):
            raise PermissionError("permission denied")
    except OSError as exc:
        raise RemoteError(
            ErrorCode.UNAVAILABLE, f"output_dir {output_dir} of recipe {name} is not writable: {exc.strerror or exc}"
        ) from None
    argv = recipes.build_argv(
        recipe, values, job_id, str(output_dir), torchrun, node.torchrun_args() if node is not None else None
    )
    job_dir = jobs.jobs_dir / job_id
    job_dir.mkdir(parents=True, exist_ok=True)
    env[PROGRESS_ENV] = str(job_dir / "progress.json")
    job = Job(
        id=job_id,
        recipe=name,
        machine=core.machine.name,
        gpus=list(recipe.gpus),
        params=values,
        argv=argv,
        cwd=str(cwd),
        output_dir=str(output_dir),
        log_path=str(jobs.logs_dir / f"job-{job_id}.log"),
        job_dir=str(job_dir),
        started_at=time.time(),
        node_rank=node.rank if node is not None else None,
        coordinator=node.coordinator if node is not None else None,
    )
    with core.store.transaction() as db:
        db.execute("INSERT INTO jobs (id, recipe, record, state) VALUES (?, ?, ?, ?)", (job.id, name, job.record(), job.state))
    runner = [
        sys.executable,
        "-m",
        "agents.jobs.runner",
        "--job-dir",
        str(job_dir),
        "--log",
        job.log_path,
        "--log-max-bytes",
        str(LOG_MAX_BYTES),
        "--log-keep",
        str(LOG_KEEP),
        "--",
        *argv,
    ]
    try:
        with open(job_dir / "runner.err", "ab") as err:
            # a new session: the job is nobody's terminal child and survives the agent
            job.popen = subprocess.Popen(
                runner, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True
            )
    except OSError as exc:
        job.state, job.error, job.ended_at = JobState.FAILED, f"could not start the runner: {exc}", time.time()
        jobs.jobs[job.id] = job
        jobs.save(job)
        raise RemoteError(ErrorCode.UNAVAILABLE, job.error) from None
    job.runner_pid, job.runner_started = job.popen.pid, create_time(job.popen.pid)
    jobs.jobs[job.id] = job
    jobs.save(job)
    keep_on_disk(job)
    log.info("started job %s (%s): %s", job.id, name, " ".join(argv))
    return job
