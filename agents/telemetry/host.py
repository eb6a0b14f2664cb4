"""The host sampler: CPU, load, RAM, swap, disk and network through psutil."""

from __future__ import annotations

import os
import time

import psutil

from agents.wire.protocol import HostSample


class HostSampler:
    def __init__(self, disk_path: str = "/"):
        self.disk_path = disk_path
        psutil.cpu_percent(interval=None)  # prime: the first call has no interval to measure
        self._net_at = time.monotonic()
        self._net = psutil.net_io_counters()

    def sample(self) -> HostSample:
        vm = psutil.virtual_memory()
        swap = psutil.swap_memory()
        try:
            disk = psutil.disk_usage(self.disk_path)
            disk_used, disk_total = disk.used, disk.total
        except OSError:
            disk_used = disk_total = None
        load = os.getloadavg()
        now, net = time.monotonic(), psutil.net_io_counters()
        elapsed = max(now - self._net_at, 1e-6)
        rx = (net.bytes_recv - self._net.bytes_recv) / elapsed if net and self._net else None
        tx = (net.bytes_sent - self._net.bytes_sent) / elapsed if net and self._net else None
        self._net_at, self._net = now, net
        return HostSample(
            cpu_pct=psutil.cpu_percent(interval=None),
            cpu_count=psutil.cpu_count(),
            load_1=load[0],
            load_5=load[1],
            load_15=load[2],
            ram_used_bytes=vm.total - vm.available,
            ram_total_bytes=vm.total,
            swap_used_bytes=swap.used,
            swap_total_bytes=swap.total,
            disk_path=self.disk_path,
            disk_used_bytes=disk_used,
            disk_total_bytes=disk_total,
            net_rx_bytes_per_s=rx,
            net_tx_bytes_per_s=tx,
        )
