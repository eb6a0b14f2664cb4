"""Jobs found again from their folders when state.db lost them (deleted, or corrupt and moved aside).

Each job's folder (``<state>/jobs/<id>/``) keeps ``job.json``, its record as it was launched, beside
the runner's child.json and exit.json. A start that finds a folder whose job state.db does not know
takes the job back: a running one is re-adopted, an ended one shows how it ended.
"""

from __future__ import annotations

import logging
from pathlib import Path

from agents.jobs.job import Job
from agents.runtime.procfiles import write_json
from agents.wire.documents import BadDocument, read_json_object

log = logging.getLogger("cetlab.jobs")

RECORD_NAME = "job.json"


def keep_on_disk(job: Job) -> None:
    """The job's record in its own folder, for a start without state.db (written once, at launch)."""
    try:
        write_json(Path(job.job_dir) / RECORD_NAME, {"record": job.record()})
    except OSError as exc:  # a full disk: state.db has the record; only this fallback is lost
        log.warning("job %s: could not keep its record in its folder: %s", job.id, exc)


def found_on_disk(jobs_dir: Path, known: set[str]) -> list[Job]:
    """Jobs whose folders hold a record that state.db lacks, oldest first; a bad record is logged and left out."""
    found = []
    for path in sorted(jobs_dir.glob(f"*/{RECORD_NAME}")):
        if path.parent.name in known:
            continue
        try:
            doc = read_json_object(path)
            if doc is None or not isinstance(doc.get("record"), str):
                raise ValueError("no job record in it")
            job = Job.from_record(doc["record"])
            if job.id != path.parent.name:
                raise ValueError(f"it names job {job.id!r}")
        except (BadDocument, ValueError, TypeError) as exc:
            log.error("%s: not a job record (%s); left out", path, exc)
            continue
        found.append(job)
    return sorted(found, key=lambda j: j.started_at or 0.0)
