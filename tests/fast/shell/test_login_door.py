"""The login door's ranking (issue 30, R10): at its cap, the oldest connection that has not begun a key exchange
makes room; a connection in its handshake is kept through its grace, and one that offered a known key is closed last.
(The storm itself, against a real agent over real SSH: tests/e2e/gateway/test_doors.py.)"""

from __future__ import annotations

from agents.runtime.limits import Doorman, Stage


class _Conn:
    def __init__(self, name: str, stage: Stage):
        self.name, self.at, self.closed = name, stage, False

    def close(self) -> None:
        self.closed = True

    def stage(self) -> Stage:
        return self.at


def arrive(door: Doorman, conn: _Conn) -> bool:
    return door.arrive(conn, "127.0.0.1", conn.close, conn.stage)


def test_a_version_line_makes_room_for_a_newcomer_at_once():
    door = Doorman(per_address=3, total=10, kex_grace_s=60)
    console = _Conn("console", Stage.KEX)
    storm = [_Conn(f"storm{i}", Stage.VERSION) for i in range(2)]
    for conn in [storm[0], console, storm[1]]:
        assert arrive(door, conn)
    newcomers = [_Conn(f"new{i}", Stage.SILENT) for i in range(5)]
    for conn in newcomers:  # each at the cap: before, the version lines were kept for 2 s and the newcomer refused
        assert arrive(door, conn)
        conn.at = Stage.VERSION  # the storm's: a version line and nothing more
    assert not console.closed and all(c.closed for c in storm) and door.refused == 0
    assert door.evicted[Stage.VERSION] + door.evicted[Stage.SILENT] == 5


def test_in_their_grace_handshakes_are_kept_and_a_known_key_goes_last():
    door = Doorman(per_address=2, total=10, kex_grace_s=0)  # every handshake past its grace at once
    known, unknown = _Conn("known", Stage.KEX), _Conn("unknown", Stage.KEX)
    assert arrive(door, known) and arrive(door, unknown)
    door.known_key(known)
    assert arrive(door, _Conn("new", Stage.SILENT))
    assert unknown.closed and not known.closed  # older, but it offered a key the agent knows

    patient = Doorman(per_address=1, total=10, kex_grace_s=60)
    first = _Conn("first", Stage.KEX)
    assert arrive(patient, first)
    late = _Conn("late", Stage.SILENT)
    assert not arrive(patient, late) and late.closed and not first.closed and patient.refused == 1
