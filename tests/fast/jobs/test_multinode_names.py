"""A multi-node job and its recipe are named by their machines, as `cetlab jobs` names them."""

from __future__ import annotations

from agents.wire.catalogue.jobs import RecipeInfo
from console.cli.jobs import job_human, jobs_human
from console.tui.screens.modals import StartJobScreen
from tests.support.ddp_job import ddp_job
from widgets.format import placement


def test_a_multi_node_job_and_recipe_are_named_by_their_machines_as_jobs_does():
    job = ddp_job()
    assert job_human(job).splitlines()[0] == "job m5-2 (ddp-2node) on m5+irina: starting"  # was "on m5 GPU -"
    assert "m5+irina" in jobs_human([job], {}).splitlines()[1]
    recipe = RecipeInfo(name="ddp-2node", machine="m5", nodes=["m5", "irina"], launcher="torchrun", output_dir="o")
    assert placement(recipe.machine, recipe.gpus, recipe.nodes) == "m5+irina"
    assert "on m5+irina (torchrun" in StartJobScreen(recipe).heading()
    single = RecipeInfo(name="lora", machine="m5", gpus=[0, 1], output_dir="o")
    assert StartJobScreen(single).heading().startswith("start [b]lora[/b] on m5 GPU 0,1")
