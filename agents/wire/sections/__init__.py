"""The typed sections of a tick: one model per section, produced by the agent's components, parsed by consoles.

A tick event is ``{"t", "full", "changed": {section: value}}`` (see agents/wire/events.py `TickEvent`); `status`
answers every section whole. Each section here serializes (``model_dump(mode="json")``) to
the JSON consoles read; numbers are finite or null by type (:data:`agents.wire.protocol.Finite`).

Sections and their models (``SECTION_MODELS``):

    gpus        list[GpuSample]   only the GPUs that changed in a diff tick, all of them in a full one
    host        HostSample
    gpu_status  GpuStatus
    jobs        list[JobInfo]     active jobs and the newest finished ones
    models      ModelsSection | null   the models of this machine and the rotation plan (null: no models here)
    checkpoints list[RunSummary]
    costs       CostsSummary | null    null until the first tick is booked
    alerts      AlertsSection
    audit       AuditSection
    gateway     GatewaySection | null  on the gateway's machine only (agents/gateway/): traffic per model, spend, keys
    gpu_support GpuSupportSection  the stacks this machine launches and, per GPU, whether each runs there (agents/gpusupport/)
    faults      FaultsSection     the sections whose component raised in this tick, with the error (empty: all well)
    lab         LabSection | null the lab.yaml it runs: version, file or pushed, what waits for a restart
    queue       QueueSection | null  on the lab queue's machine only (agents/scheduler/): entries, why each waits

Shape changes against the untyped sections (kept as small as the console allows):
- ``jobs[].diverged_at_step`` and ``jobs[].progress_problem`` are new (issue 11: a diverged
  run and a progress file that does not match its schema are shown on their job);
  ``jobs[].precision`` and ``jobs[].notes`` carry the trainer's (real lab);
- ``models.models[].error`` is an object (``ModelError``: message, exit_code, oom, log_tail ...),
  as it always was; read ``error.message`` for the one line;
- ``checkpoints[].problem`` (a run's bad progress.json) and ``CheckpointInfo.diverged_at_step`` are new;
- ``costs`` is null (not ``{}``) before the first tick;
- the rotation plan stays inside the ``models`` section (``models.rotation``), where consoles read it."""
