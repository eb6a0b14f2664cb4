"""The components every agent runs, built with its core."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agents.runtime.core import AgentCore
from agents.wire.lab.queue import scheduler_machine

if TYPE_CHECKING:
    from agents.shell.agent import Component


def default_components(core: AgentCore) -> list[Component]:
    """The parts every agent runs, built with its core, in dependency order: the state owners before the readers of a tick
    (jobs, then models, then checkpoints), audit first (it writes the trail of every action), the gateway last."""
    from agents.alerts.component import AlertsComponent
    from agents.audit.component import AuditComponent
    from agents.checkpoints.component import CheckpointsComponent
    from agents.costs.component import CostsComponent
    from agents.gpusupport.component import GpuSupportComponent
    from agents.jobs.component import JobsComponent
    from agents.notify.component import NotifyComponent
    from agents.orchestra.component import OrchestraComponent

    components: list[Component] = [
        AuditComponent(core),
        CostsComponent(core),
        AlertsComponent(core),
        NotifyComponent(core),
        GpuSupportComponent(core),
        JobsComponent(core),
        OrchestraComponent(core),
        CheckpointsComponent(core),
    ]
    if scheduler_machine(core.lab) == core.machine.name:
        # the lab queue: only on its keeper's machine (lab.yaml scheduler:, else the gateway's, else the first); it links
        # to the other machines once lab.yaml has recipes
        from agents.scheduler.component import SchedulerComponent

        components.append(SchedulerComponent(core))
    if core.lab.gateway is not None and core.lab.gateway.machine == core.machine.name:
        # only on lab.yaml's gateway.machine: elsewhere it would do nothing, and its router, metering and peer links
        # are not imported at all (the agent's memory; issue 22); last: it reads the other components' state
        from agents.gateway.component import GatewayComponent

        components.append(GatewayComponent(core))
    return components
