"""The demo lab's set-up: a complete client-side lab.yaml, keys, known_hosts; --scale emulation; its own process."""

from __future__ import annotations

import stat
import urllib.request


def test_the_demos_logs_are_private(tmp_path):
    """The notification log records each POST's path, which holds the webhook's token (its url file is mode 600)."""
    from agents.notify.receiver import Receiver

    log = tmp_path / "notifications.jsonl"
    log.write_text("")
    log.chmod(0o644)  # a demo of an older version left it readable
    receiver = Receiver(log=log).start()
    try:
        request = urllib.request.Request(f"{receiver.url}/hooks/demo/SECRET", data=b'{"text": "hi"}', method="POST")
        urllib.request.urlopen(request, timeout=10).close()
    finally:
        receiver.stop()
    assert "SECRET" in log.read_text() and stat.S_IMODE(log.stat().st_mode) == 0o600
