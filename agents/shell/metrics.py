"""Prometheus exposition of the agent: GPUs under the DCGM exporter's names, host, jobs, models, energy, money."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agents.costs.port import CostsPort
from agents.runtime.waits import within
from agents.wire.sections.alerts import AlertsSection
from agents.wire.sections.costs import CostsSummary
from agents.wire.sections.models import ModelsSection
from agents.wire.states import JobState

if TYPE_CHECKING:
    from agents.shell.agent import Agent

log = logging.getLogger("cetlab.metrics")


@runtime_checkable
class MetricsSource(Protocol):
    """A component with Prometheus series of its own (the gateway): the agent's collector yields them."""

    def metric_families(self) -> Iterator[Metric]: ...


MIB = 1024**2
GPU_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname"]  # as dcgm-exporter labels its series

# (metric, help, GpuSample field, scale): DCGM field names and units (framebuffer in MiB)
GPU_GAUGES = [
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "util_pct", 1),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temp_c", 1),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w", 1),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", "power_limit_w", 1),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz", 1),
    ("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", "fan_pct", 1),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "mem_used_bytes", 1 / MIB),
]
HOST_GAUGES = [
    ("cetlab_host_cpu_percent", "Host CPU utilisation (in %).", "cpu_pct"),
    ("cetlab_host_load1", "Host load average over 1 minute.", "load_1"),
    ("cetlab_host_memory_used_bytes", "Host RAM in use.", "ram_used_bytes"),
    ("cetlab_host_memory_total_bytes", "Host RAM.", "ram_total_bytes"),
    ("cetlab_host_disk_used_bytes", "Used bytes of the agent's state disk.", "disk_used_bytes"),
    ("cetlab_host_disk_total_bytes", "Size of the agent's state disk.", "disk_total_bytes"),
]


class AgentCollector:
    """A custom collector: reads the agents' latest snapshots and sections at scrape time, no global gauges."""

    def __init__(self, agents: list[Agent]):
        self.agents = agents

    def collect(self) -> Iterator[Metric]:
        """Over 80 lines: one block per metric family, in the order /metrics lists them."""
        gpu = {name: GaugeMetricFamily(name, doc, labels=GPU_LABELS) for name, doc, _, _ in GPU_GAUGES}
        fb_free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=GPU_LABELS)
        simulated = GaugeMetricFamily(
            "cetlab_gpu_simulated", "1 when the GPU's figures come from the simulator.", labels=GPU_LABELS
        )
        host = {name: GaugeMetricFamily(name, doc, labels=["Hostname"]) for name, doc, _ in HOST_GAUGES}
        job_info = GaugeMetricFamily(
            "cetlab_job_info", "A job on this machine (value 1).", labels=["Hostname", "job", "recipe", "state"]
        )
        job_step = GaugeMetricFamily("cetlab_job_step", "A running job's global step.", labels=["Hostname", "job"])
        job_loss = GaugeMetricFamily("cetlab_job_loss", "A running job's latest training loss.", labels=["Hostname", "job"])
        model_state = GaugeMetricFamily("cetlab_model_state", "A model's state (value 1).", labels=["Hostname", "model", "state"])
        tokens = CounterMetricFamily(
            "cetlab_model_tokens", "Tokens served by a model's engine (prompt + generation).", labels=["Hostname", "model"]
        )
        energy = CounterMetricFamily(
            "cetlab_energy_joules",
            "Energy in the ledger by owner: host idle draw, job, model, other.",
            labels=["Hostname", "kind", "owner"],
        )
        power = GaugeMetricFamily(
            "cetlab_power_watts", "The machine's draw now: GPUs measured plus idle_watts.", labels=["Hostname"]
        )
        money = {
            key: GaugeMetricFamily(f"cetlab_cost_{key}", doc, labels=["Hostname", "currency"])
            for key, doc in (
                ("per_hour", "What the machine costs per hour now."),
                ("today", "Cost so far today (the lab's day)."),
                ("month", "Cost so far this month."),
                ("cloud_equivalent_month", "The same work's cloud price this month."),
            )
        }
        alerts = GaugeMetricFamily(
            "cetlab_alerts_active", "Active alerts by rule and level.", labels=["Hostname", "rule", "level"]
        )
        for agent in self.agents:
            name = agent.machine.name
            latest = agent.latest
            if latest is not None:
                for g in latest.gpus:
                    if g.failed:
                        continue
                    labels = [str(g.index), g.uuid or "", f"nvidia{g.index}", g.name, name]
                    for metric, _, field, scale in GPU_GAUGES:
                        value = getattr(g, field)
                        if value is not None:
                            gpu[metric].add_metric(labels, value * scale)
                    if g.mem_total_bytes is not None and g.mem_used_bytes is not None:
                        fb_free.add_metric(labels, (g.mem_total_bytes - g.mem_used_bytes) / MIB)
                    simulated.add_metric(labels, 1.0 if g.simulated else 0.0)
                for metric, _, field in HOST_GAUGES:
                    value = getattr(latest.host, field)
                    if value is not None:
                        host[metric].add_metric([name], value)
            sections = agent.current  # the latest tick's typed sections: what consoles saw
            for job in sections.get("jobs") or []:
                job_info.add_metric([name, job.id, job.recipe, job.state], 1)
                for family, value in ((job_step, job.step), (job_loss, job.loss)):
                    if value is not None and job.state == JobState.RUNNING:
                        family.add_metric([name, job.id], value)
            models = sections.get("models")
            for model in models.models if isinstance(models, ModelsSection) else []:
                model_state.add_metric([name, model.name, model.state], 1)
            summary, costs = sections.get("costs"), agent.find(CostsPort)
            if isinstance(summary, CostsSummary) and costs is not None:
                for row in costs.ledger_totals():
                    energy.add_metric([name, row.kind, row.owner], row.energy_j)
                    if row.kind == "model" and row.tokens:
                        tokens.add_metric([name, row.owner], row.tokens)
                if summary.power_w is not None:
                    power.add_metric([name], summary.power_w)
                for key, family in money.items():
                    value = getattr(summary, "now_per_hour" if key == "per_hour" else key)
                    if value is not None:  # a missing price: no sample rather than a wrong one
                        family.add_metric([name, summary.currency], value)
            counts: dict[tuple[str, str], int] = {}
            alerts_section = sections.get("alerts")
            for alert in alerts_section.active if isinstance(alerts_section, AlertsSection) else []:
                counts[(alert.rule, alert.level)] = counts.get((alert.rule, alert.level), 0) + 1
            for (rule, level), count in counts.items():
                alerts.add_metric([name, rule, level], count)
            for component in agent.components:
                if isinstance(component, MetricsSource):
                    yield from component.metric_families()
        yield from gpu.values()
        yield fb_free
        yield simulated
        yield from host.values()
        yield from (job_info, job_step, job_loss, model_state, tokens, energy, power)
        yield from money.values()
        yield alerts


async def serve(agents: list[Agent], host: str, port: int) -> asyncio.Server:
    """GET /metrics on host:port. Served from the agent's event loop so scrapes never race its state."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agents))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await within(reader.readuntil(b"\r\n\r\n"), 10.0)
            method, path = (request.split(b" ") + [b"", b""])[:2]
            if method == b"GET" and path.split(b"?")[0] in (b"/metrics", b"/"):
                status, body, ctype = "200 OK", generate_latest(registry), CONTENT_TYPE_LATEST
            else:
                status, body, ctype = "404 Not Found", b"only GET /metrics here\n", "text/plain"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        except Exception:
            log.exception("metrics scrape failed")
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    log.info("Prometheus metrics on http://%s:%d/metrics", host, port)
    return server
