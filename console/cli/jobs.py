"""`cetlab train`, `jobs`, `stop`, `logs`: launch trainer recipes and watch them from scripts."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import time
import unicodedata
from collections.abc import Mapping

from agents.runtime.waits import within
from agents.wire.catalogue.jobs import (
    JOBS_GET,
    JOBS_KILL,
    JOBS_LIST,
    JOBS_LOGS,
    JOBS_START,
    JOBS_STOP,
    JobListParams,
    JobParams,
    LogsParams,
    StartParams,
    StopParams,
)
from agents.wire.catalogue.method import request
from agents.wire.catalogue.queue import QUEUE_LIST, QUEUE_SUBMIT, QueueListParams, SubmitParams
from agents.wire.events import LogEvent, PushEvent
from agents.wire.lab.queue import scheduler_machine
from agents.wire.protocol import ErrorCode, RemoteError
from agents.wire.sections.jobs import JobDetail, JobInfo, JobNode
from agents.wire.sections.queue import ENTRY_WAITING, EntryState, QueueEntry
from agents.wire.states import JOB_ACTIVE, JobState
from agents.wire.words import plural
from console.cli.main import Context, say
from console.cli.queue import entry_line
from console.lab.replies import Answers, not_reached, sent
from widgets.format import NA, fmt, fmt_duration, machines_text, placement

EXIT_OK, EXIT_FAILED = 0, 1
QUEUE_POLL_S = 1.0  # `cetlab train --follow` of a queued job: how often it asks the queue whether it started


def state_text(job: JobInfo | JobNode) -> str:
    state = str(job.state)
    if state in ("exited", "failed") and job.exit_code is not None:
        state = f"{state}({job.exit_code})"
    return state + (" GPU-STARVED" if isinstance(job, JobInfo) and job.starved else "")


def step_text(job: JobInfo) -> str:
    if job.step is None:
        return NA
    return f"{job.step}/{job.max_steps}" if job.max_steps else str(job.step)


def jobs_human(jobs: list[JobInfo], errors: Mapping[str, RemoteError]) -> str:
    rows = [("JOB", "MACHINE", "RECIPE", "GPUS", "PREC", "STATE", "STEP", "LOSS", "SAMPLES/S", "ETA", "ELAPSED")]
    for job in jobs:
        rows.append(
            (
                job.id,
                machines_text(job.machine, [n.machine for n in job.nodes]),
                job.recipe,
                ",".join(map(str, job.gpus)) or NA,
                job.precision or NA,
                state_text(job),
                step_text(job),
                fmt(job.loss, ".4f"),
                fmt(job.samples_per_s, ".1f"),
                fmt_duration(job.eta_s) if job.state in JOB_ACTIVE else NA,
                fmt_duration(job.elapsed_s),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if len(rows) == 1:
        lines.append("(no jobs)")
    lines += not_reached(errors)  # OFFLINE, or a bad reply
    return "\n".join(lines)


def _shown_arg(arg: str) -> str:
    """One argument as a shell would take it back; control and bidi characters as $'\\n' / $'\\u202e' escapes."""
    if not any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in arg):
        return shlex.quote(arg)
    escaped = "".join("\\" + c if c in "\\'" else c if c.isprintable() else repr(c)[1:-1] for c in arg)
    return f"$'{escaped}'"


def shown_argv(argv: list[str]) -> str:
    """A command line for the terminal: one line, no character that could forge output or reorder text."""
    return " ".join(_shown_arg(str(arg)) for arg in argv)


def job_human(job: JobInfo) -> str:
    where = placement(job.machine, job.gpus, [n.machine for n in job.nodes])
    lines = [f"job {job.id} ({job.recipe}) on {where}: {state_text(job)}"]
    if isinstance(job, JobDetail) and job.argv:
        lines.append("  " + shown_argv(job.argv))
    lines.append(f"  log: {job.log_path}")
    for node in job.nodes:
        lines.append(f"  node {node.machine} GPU {','.join(map(str, node.gpus)) or NA}: {state_text(node)}")
    if job.precision:
        lines.append(f"  precision: {job.precision}")
    lines += [f"  note: {note}" for note in job.notes]
    if job.error:
        lines.append(f"  error: {job.error}")
    return "\n".join(lines)


def job_machine(ctx: Context, job_id: str) -> str:
    """Job ids are <machine>-<n>, unique across the lab."""
    machine, _, n = job_id.rpartition("-")
    names = {m.name for m in ctx.lab.machines}
    if machine not in names or not n.isdigit():
        raise RemoteError(
            ErrorCode.NOT_FOUND,
            f"no job {job_id!r}: job ids look like <machine>-<n>, e.g. {next(iter(names))}-1 (see `cetlab jobs`)",
        )
    return machine


def parse_sets(items: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RemoteError(ErrorCode.INVALID_PARAMS, f"--set expects key=value, got {item!r}")
        params[key.strip()] = value
    return params


FOLLOW_POLL_S = 2.0  # a follow without new lines looks at the link (and at a multi-node job's nodes) this often
NODES_SAID_S = 10.0  # while a multi-node job's nodes start, their states are said when they change and at least this often


def nodes_line(job: JobInfo, waited_s: float) -> str:
    """A multi-node job's nodes while they start (torchrun's imports and rendezvous print nothing for a while)."""
    states = ", ".join(f"{node.machine} {node.state}" for node in job.nodes)
    return f"waiting for the nodes to start ({fmt_duration(waited_s)}): {states}"


async def follow(ctx: Context, machine: str, job_id: str, tail_lines: int, offset: int | None = None) -> int:
    """Print the log's tail, then every new line until the job ends; the job's outcome is the exit code."""
    queue: asyncio.Queue[LogEvent] = asyncio.Queue()

    def on_event(name: str, _event: str, data: PushEvent) -> None:
        if name == machine and isinstance(data, LogEvent) and data.job == job_id:
            queue.put_nowait(data)

    ctx.client.on_event = on_event
    params = LogsParams(id=job_id, tail_lines=tail_lines, follow=True, **({"offset": offset} if offset is not None else {}))
    first = await request(ctx.client, machine, JOBS_LOGS, params)

    def emit(line: str) -> None:
        if ctx.args.json:
            print(json.dumps({"job": job_id, "line": line}), flush=True)
        else:
            say(line, flush=True)

    for line in first.lines:
        emit(line)
    state: JobState | None = first.state
    exit_code: int | None = None
    started = time.monotonic()
    said: tuple[str, float] | None = None  # the nodes' states last said, and when
    quiet = not first.lines  # no line of the trainer yet: the nodes are still starting
    while state in JOB_ACTIVE:
        try:
            data = await within(queue.get(), FOLLOW_POLL_S)
        except TimeoutError:
            if not ctx.state.machines[machine].online:
                raise RemoteError(ErrorCode.DISCONNECTED, f"lost {machine} while following {job_id}") from None
            if quiet and not ctx.args.json:  # nothing from the trainer yet: a multi-node job says how its nodes are
                job = await request(ctx.client, machine, JOBS_GET, JobParams(id=job_id))
                quiet = len(job.nodes) > 1 and job.state == JobState.STARTING
                states = ",".join(node.state for node in job.nodes)
                if quiet and (said is None or said[0] != states or time.monotonic() - said[1] >= NODES_SAID_S):
                    say(nodes_line(job, time.monotonic() - started), flush=True)
                    said = (states, time.monotonic())
            continue
        quiet = quiet and not data.lines
        for line in data.lines:
            emit(line)
        if data.ended:
            state, exit_code = data.state, data.exit_code
    if exit_code is None:
        job = await request(ctx.client, machine, JOBS_GET, JobParams(id=job_id))
        state, exit_code = job.state, job.exit_code
    return EXIT_OK if state == JobState.EXITED and exit_code == 0 else EXIT_FAILED


async def cmd_train(ctx: Context) -> int:
    recipe = next((r for r in ctx.lab.trainers if r.name == ctx.args.recipe), None)
    if recipe is None:
        names = ", ".join(r.name for r in ctx.lab.trainers) or "none"
        raise RemoteError(ErrorCode.NOT_FOUND, f"no recipe named {ctx.args.recipe!r} in {ctx.lab.source} (recipes: {names})")
    params = parse_sets(ctx.args.set)
    if ctx.args.now and recipe.need is None:  # its own machine and GPUs, now or refused: the queue is not asked
        job: JobDetail = await request(ctx.client, recipe.machine, JOBS_START, StartParams(recipe=recipe.name, params=params))
    else:
        keeper = scheduler_machine(ctx.lab)
        submit = SubmitParams(recipe=recipe.name, params=params, priority=ctx.args.priority, now=ctx.args.now)
        entry = await request(ctx.client, keeper, QUEUE_SUBMIT, submit)
        if entry.job_id is None and not ctx.args.follow:
            ctx.out(sent(entry), lambda _: f"queued: {entry_line(entry)}")
            return EXIT_OK
        if entry.job_id is None:
            say(f"queued: {entry_line(entry)}", flush=True)
            entry = await started(ctx, keeper, entry)
            if entry.job_id is None or entry.machine is None:
                say(f"cetlab: {entry_line(entry)}", err=True)
                return EXIT_FAILED
        assert entry.job_id is not None and entry.machine is not None
        job = await request(ctx.client, entry.machine, JOBS_GET, JobParams(id=entry.job_id))
        recipe = recipe.model_copy(update={"machine": entry.machine})
    if ctx.args.follow:
        if ctx.args.json:
            print(json.dumps(sent(job)), flush=True)
        else:
            say(job_human(job), flush=True)
        # a multi-node job: the first node's log (rank 0 speaks for the run); its outcome there is the job's
        return await follow(ctx, recipe.machine, job.id, 0, offset=0)
    ctx.out(sent(job), lambda _: job_human(job))
    return EXIT_OK


async def started(ctx: Context, keeper: str, entry: QueueEntry) -> QueueEntry:
    """Wait until the queue has started the entry's job (or it ended without one), watching the keeper's list."""
    while entry.state in ENTRY_WAITING or (entry.state is EntryState.STARTING and entry.job_id is None):
        await asyncio.sleep(QUEUE_POLL_S)
        listing = await request(ctx.client, keeper, QUEUE_LIST, QueueListParams())
        entry = next((e for e in listing.root if e.id == entry.id), entry)
    return entry


async def cmd_jobs(ctx: Context) -> int:
    answers = Answers.of(await ctx.request_all(JOBS_LIST, JobListParams(limit=ctx.args.limit)))
    # a node of a multi-node job is a row of its coordinator's job ("nodes"), not a job of its own
    jobs = [job for reply in answers.replies.values() for job in reply.root if not job.node_rank]
    jobs.sort(key=lambda j: j.started_at, reverse=True)
    if not ctx.args.all:
        jobs = [j for j in jobs if j.state in JOB_ACTIVE] + [j for j in jobs if j.state not in JOB_ACTIVE][:10]
    offline = answers.messages()
    ctx.out({"jobs": [sent(j) for j in jobs], "offline": offline}, lambda _: jobs_human(jobs, answers.errors))
    return EXIT_OK if answers.replies else EXIT_FAILED


async def cmd_stop(ctx: Context) -> int:
    machine = job_machine(ctx, ctx.args.job)
    if ctx.args.kill:
        job = await request(ctx.client, machine, JOBS_KILL, JobParams(id=ctx.args.job))
    else:
        grace = {"grace_s": ctx.args.grace} if ctx.args.grace is not None else {}
        job = await request(ctx.client, machine, JOBS_STOP, StopParams(id=ctx.args.job, **grace))
    ctx.out(sent(job), lambda _: job_human(job))
    return EXIT_OK


async def cmd_logs(ctx: Context) -> int:
    machine = ctx.args.node or job_machine(ctx, ctx.args.job)
    if ctx.args.follow:
        return await follow(ctx, machine, ctx.args.job, ctx.args.tail)
    logs = await request(ctx.client, machine, JOBS_LOGS, LogsParams(id=ctx.args.job, tail_lines=ctx.args.tail))
    ctx.out(sent(logs), lambda _: "\n".join(logs.lines))
    if logs.cut:  # on stderr: the lines on stdout stay the log's own
        say(
            f"cetlab: the tail is cut: {len(logs.lines)} of the {plural(ctx.args.tail, 'line')} asked (a tail reads at most 8 MiB); "
            f"the whole log is {logs.path} on {machine}",
            err=True,
        )
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("train", help="start a trainer recipe from lab.yaml: at once when what it needs is free, else queued")
    p.add_argument("recipe", help="a name under trainers: in lab.yaml")
    p.add_argument("--now", action="store_true", help="start now or be refused (never queued)")
    p.add_argument("--priority", type=int, help="higher starts first (default: the recipe's priority:, else 0)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a declared param of the recipe (repeatable)")
    p.add_argument("--follow", "-f", action="store_true", help="print the log until the job ends; exit 0 only if it exits 0")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("jobs", help="training jobs of every machine")
    p.add_argument("--all", action="store_true", help="every finished job too, not just the last 10")
    p.add_argument("--limit", type=int, default=100, help="per machine (default 100)")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("stop", help="stop a job: SIGTERM, then SIGKILL after the grace period")
    p.add_argument("job", help="job id, <machine>-<n>")
    p.add_argument("--grace", type=float, help="seconds before SIGKILL (default: the recipe's stop_grace_s)")
    p.add_argument("--kill", action="store_true", help="SIGKILL now")
    p.set_defaults(func=cmd_stop)

    p = sub.add_parser("logs", help="a job's log")
    p.add_argument("job", help="job id, <machine>-<n>")
    p.add_argument("--tail", type=int, default=100, help="lines (default 100)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")
    p.add_argument("--node", metavar="MACHINE", help="a multi-node job: this node's log (default: the first node's)")
    p.set_defaults(func=cmd_logs)
