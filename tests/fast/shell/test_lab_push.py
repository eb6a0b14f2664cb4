"""`cetlab lab push` on the agent's side, in process: a pushed lab.yaml validated (lab.yaml:LINE:COL), kept in the state
dir with the previous one, applied live (models, alerts, gateway policies), its version in hello, ticks and status;
rollback; the pushed copy winning over --lab at the next start; the keys a push may authorize."""

from __future__ import annotations

import asyncssh
import pytest

from agents.runtime.keys import AUTHORIZED_KEYS_NAME, PUSHED_AUTHORIZED_KEYS_NAME, AuthorizedKeys, write_private
from agents.runtime.labfile import PREVIOUS_NAME, PUSHED_NAME, needed_peer_keys
from agents.runtime.view import MachineView
from agents.wire.lab.model import parse_lab
from agents.wire.lab.push import lab_changes, lab_version
from agents.wire.protocol import ErrorCode, LinkStatus, PeerKeys, RemoteError, Role
from console.lab.status import status_human, status_json
from console.tui.screens.fleet import alert_badges, card_note
from tests.support.lab_push import LAB, P4, SIM, alerts, pool, started, text_of, with_changes
from tests.support.waits import wait_for


async def test_a_push_is_applied_live_kept_with_the_previous_one_and_rolled_back(in_process):
    lab, client = await started(in_process)
    agent = lab.agents["box"]
    first = lab_version(lab.lab_path.read_text())
    assert client.state.machines["box"].hello.lab_version == first
    models = [*LAB["models"], {**LAB["models"][0], "name": "second", "path": "models/second", "gpus": [1]}]
    new_text = text_of(with_changes(models=models, alerts={"temp_c": 70}))

    reply = await client.call("box", "lab.apply", {"text": new_text})

    assert reply["version"] == lab_version(new_text) and reply["previous"] == first and reply["changed"]
    assert "models: +second" in reply["live"] and "alerts" in reply["live"] and reply["restart"] == []
    assert set(pool(agent).slots) == {"tiny", "second"}  # the model pool took the new model live
    assert alerts(agent).engine.settings.temp_c == 70  # the alert rules too
    state = agent.state_dir
    assert (state / PUSHED_NAME).read_text() == new_text
    assert (state / PREVIOUS_NAME).read_text() == lab.lab_path.read_text()
    status = await client.call("box", "status")
    assert status["lab"]["version"] == lab_version(new_text) and status["lab"]["source"] == "pushed"
    view = client.state.machines["box"]
    client.state.apply_status("box", status)
    assert view.lab_version == lab_version(new_text) and view.lab_differs(client.state.lab_version)
    said = status_json(client.state)["machines"][0]
    assert said["lab_differs"] and said["lab_version"] == lab_version(new_text)
    assert "not the workstation's" in status_human(status_json(client.state))

    back = await client.call("box", "lab.rollback", {})

    assert back["version"] == first and "models: -second" in back["live"]
    assert set(pool(agent).slots) == {"tiny"} and alerts(agent).engine.settings.temp_c == 85
    client.state.apply_status("box", await client.call("box", "status"))
    assert not view.lab_differs(client.state.lab_version)


async def test_a_push_with_an_error_is_refused_at_its_line_and_column_and_nothing_changes(in_process):
    lab, client = await started(in_process)
    agent = lab.agents["box"]
    bad = with_changes(models=[{**LAB["models"][0], "engine": "no-such-engine"}])
    with pytest.raises(RemoteError) as caught:
        await client.call("box", "lab.apply", {"text": text_of(bad)})
    assert caught.value.code == ErrorCode.INVALID_PARAMS
    line = next(n for n, text in enumerate(text_of(bad).splitlines(), 1) if "no-such-engine" in text)
    assert f"lab.yaml:{line}:" in caught.value.message and "nothing changed" in caught.value.message
    with pytest.raises(RemoteError) as syntax:
        await client.call("box", "lab.apply", {"text": "lab: x\nmachines: [\n"})
    assert "lab.yaml:" in syntax.value.message
    other = with_changes(machines=[{"name": "elsewhere", "gpus": "none"}], models=[])
    with pytest.raises(RemoteError) as gone:
        await client.call("box", "lab.apply", {"text": text_of(other)})
    assert "lab.yaml:1:1: no machine named 'box'" in gone.value.message
    assert not (agent.state_dir / PUSHED_NAME).exists() and agent.lab_section.source == "file"
    assert set(pool(agent).slots) == {"tiny"}
    with pytest.raises(RemoteError) as nothing:
        await client.call("box", "lab.rollback", {})
    assert nothing.value.code == ErrorCode.CONFLICT


async def test_a_one_machine_lab_needs_no_peer_trust_from_a_push(in_process):
    lab, client = await started(in_process, with_changes(gateway={"machine": "box"}))
    host = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    assert client.state.machines["box"].hello.peer_keys.peer is None  # the gateway asks its own pool in-process
    reply = await client.call(
        "box", "lab.apply", {"text": text_of(with_changes(gateway={"machine": "box"})), "known_hosts": f"[127.0.0.1]:7022 {host}"}
    )
    assert reply["peer_hosts"] == 0 and reply["authorized"] == []
    state = lab.agents["box"].state_dir
    assert not (state / "peer_known_hosts").exists() and not (state / "peer_ed25519_key").exists()


async def test_a_viewer_cannot_push(in_process):
    lab = await in_process(LAB)
    viewer = lab.client(Role.VIEWER, who="a viewer")
    await viewer.start()
    await viewer.wait_connected(10)
    with pytest.raises(RemoteError) as caught:
        await viewer.call("box", "lab.apply", {"text": text_of(LAB)})
    assert caught.value.code == ErrorCode.FORBIDDEN


async def test_a_change_bound_at_start_waits_for_the_next_start_where_the_pushed_copy_wins(in_process):
    lab, client = await started(in_process)
    moved = with_changes(machines=[{"name": "box", "port": 7999, "gpus": {"sim": [P4, P4]}}])
    reply = await client.call("box", "lab.apply", {"text": text_of(moved)})
    assert reply["restart"] == ["machines.box.port"]
    assert lab.agents["box"].lab_section.restart_pending == ["machines.box.port"]
    await lab.stop_agent("box")
    again = await lab.start_agent("box")  # the same state dir, the same --lab: the pushed copy wins
    assert again.lab_section.source == "pushed" and again.lab_section.version == lab_version(text_of(moved))
    assert again.machine.port == 7999


async def test_a_dry_run_says_what_would_change_and_writes_nothing(in_process):
    lab, client = await started(in_process)
    reply = await client.call("box", "lab.apply", {"text": text_of(with_changes(alerts={"temp_c": 60})), "dry_run": True})
    assert reply["dry_run"] and reply["live"] == ["alerts"]
    assert not (lab.agents["box"].state_dir / PUSHED_NAME).exists()
    assert alerts(lab.agents["box"]).engine.settings.temp_c == 85


def test_the_changes_of_a_push_are_said_live_or_at_the_next_start():
    old = parse_lab(text_of(LAB))
    gw = with_changes(gateway={"machine": "box", "policies": {"max_tokens": 100}})
    assert lab_changes(parse_lab(text_of(with_changes(gateway={"machine": "box"}))), parse_lab(text_of(gw)), "box").live == [
        "gateway"
    ]
    moved = lab_changes(
        parse_lab(text_of(with_changes(gateway={"machine": "box"}))),
        parse_lab(text_of({**gw, "gateway": {"machine": "box", "port": 9}})),
        "box",
    )
    assert moved.restart == ["gateway (its machine, host or port)"]
    same = lab_changes(old, parse_lab(text_of(LAB)), "box")
    assert not same.any
    one = with_changes(gateway={"machine": "box"})
    two = {**one, "machines": [*one["machines"], {"name": "far", "port": 7100, "gpus": "none"}]}
    grown = lab_changes(parse_lab(text_of(one)), parse_lab(text_of(two)), "box")
    assert grown.live == ["machines: +far"] and grown.restart == []  # the gateway links to it live


def test_the_fleet_flags_a_machine_that_runs_another_lab_yaml():
    view = MachineView(parse_lab(text_of(LAB)).machine("box"), link=LinkStatus.ONLINE)
    assert alert_badges(view, "aaaaaaaaaaaa") == []  # an agent that says no version: nothing to compare
    view.apply_section("lab", {"version": "bbbbbbbbbbbb", "source": "pushed", "restart_pending": ["machines.box.port"]})
    assert alert_badges(view, "bbbbbbbbbbbb") == []
    assert alert_badges(view, "aaaaaaaaaaaa") == ["lab.yaml bbbbbbbbbbbb ≠ aaaaaaaaaaaa"]
    assert "lab.yaml at the next start: machines.box.port" in card_note(view)


def test_a_push_authorizes_the_gateway_and_node_roles_only_in_a_file_of_its_own(tmp_path):
    gateway_key = asyncssh.generate_private_key("ssh-ed25519")
    node_key = asyncssh.generate_private_key("ssh-ed25519")
    data = {
        "lab": "two",
        "machines": [{"name": "hub", "gpus": "none"}, {"name": "box", "port": 7023, "gpus": {"sim": [P4]}}],
        "gateway": {"machine": "hub"},
        "trainers": [
            {
                "name": "big",
                "command": ["python", "-c", "pass"],
                "output_dir": "runs/{job_id}",
                "launcher": "torchrun",
                "nproc_per_node": 1,
                "nodes": [{"machine": "hub", "gpus": []}, {"machine": "box", "gpus": [0]}],
            }
        ],
    }
    lab = parse_lab(text_of(data))
    keys = {
        "hub": PeerKeys(peer=gateway_key.export_public_key().decode().strip(), node=node_key.export_public_key().decode().strip())
    }
    needed = needed_peer_keys(lab, "box", keys)
    assert [(role, comment) for role, _, comment in needed] == [(Role.GATEWAY, "gateway@hub"), (Role.NODE, "node@hub")]
    assert needed_peer_keys(lab, "hub", keys) == []  # the gateway reaches its own machine in-process
    # the pushed file lets gateway and node keys in; an operator line there is ignored, the hand-made file untouched
    hand = asyncssh.generate_private_key("ssh-ed25519")
    write_private(tmp_path / AUTHORIZED_KEYS_NAME, f"viewer {hand.export_public_key().decode().strip()}\n".encode())
    person = asyncssh.generate_private_key("ssh-ed25519")
    pushed = [f"{role} {public} {comment}" for role, public, comment in needed]
    pushed.append(f"operator {person.export_public_key().decode().strip()}")
    write_private(tmp_path / PUSHED_AUTHORIZED_KEYS_NAME, ("\n".join(pushed) + "\n").encode())
    authorized = AuthorizedKeys(tmp_path / AUTHORIZED_KEYS_NAME, tmp_path / PUSHED_AUTHORIZED_KEYS_NAME)
    assert authorized.lookup(gateway_key.convert_to_public()).role is Role.GATEWAY
    assert authorized.lookup(node_key.convert_to_public()).role is Role.NODE
    assert authorized.lookup(person.convert_to_public()) is None
    assert authorized.lookup(hand.convert_to_public()).role is Role.VIEWER
    # a broken pushed file lets none of its keys in, and never locks the hand-made ones out
    write_private(tmp_path / PUSHED_AUTHORIZED_KEYS_NAME, b"gateway not-a-key\n")
    assert authorized.lookup(gateway_key.convert_to_public()) is None
    assert authorized.lookup(hand.convert_to_public()).role is Role.VIEWER


async def test_a_push_with_a_peer_key_that_is_not_one_is_refused_before_anything_is_written(in_process):
    data = with_changes(
        machines=[*LAB["machines"], {"name": "hub", "host": "127.0.0.1", "port": 9, "gpus": "none"}], gateway={"machine": "hub"}
    )
    lab = await in_process(data, machines=["box"])
    client = lab.client()
    await client.start()
    await wait_for(lambda: client.state.machines["box"].online)
    text = text_of({**data, "alerts": {"temp_c": 70}})
    with pytest.raises(RemoteError) as caught:
        await client.call("box", "lab.apply", {"text": text, "peer_keys": {"hub": {"peer": "ssh-ed25519 not-base64"}}})
    assert caught.value.code == ErrorCode.INVALID_PARAMS and "gateway@hub" in caught.value.message
    state = lab.agents["box"].state_dir
    assert not (state / PUSHED_NAME).exists() and not (state / PUSHED_AUTHORIZED_KEYS_NAME).exists()
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    reply = await client.call("box", "lab.apply", {"text": text, "peer_keys": {"hub": {"peer": key}}})
    assert reply["authorized"] == ["gateway@hub"]
    assert (state / PUSHED_AUTHORIZED_KEYS_NAME).read_text().startswith("gateway ssh-ed25519 ")


async def test_a_model_changed_at_rest_gets_its_placeholder_and_residency_from_the_push(in_process):
    """A model pushed without `sim.placeholder_mib` and then with it: the push that changes it writes the placeholder
    its entry asks for (before, only a model new to the machine got one, and the changed one stayed unstartable)."""
    bare = {**LAB["models"][0], "path": "models/later", "sim": {k: v for k, v in SIM.items() if k != "placeholder_mib"}}
    lab, client = await started(in_process, with_changes(models=[bare]))
    slot = pool(lab.agents["box"]).slots["tiny"]
    assert not slot.path.exists()
    reply = await client.call("box", "lab.apply", {"text": text_of(with_changes(models=[{**bare, "sim": SIM}]))})
    assert "models: ~tiny" in reply["live"]
    assert slot.path.exists()  # the placeholder weights its changed entry asks for
