"""The manual (docs/, mkdocs.yml): the generated reference pages match the code, the site builds with --strict, and the
README stays a short front page that links into it."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

import yaml

from tests.support.docs import DOCS, ROOT


def gen() -> ModuleType:
    """docs/gen.py, loaded from its file (docs/ is the site's folder, not a package)."""
    spec = importlib.util.spec_from_file_location("docs_gen", DOCS / "gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_pages_match_the_code():
    docs_gen = gen()
    for name, make in docs_gen.PAGES.items():
        page = DOCS / name
        assert page.is_file() and page.read_text() == make(), f"docs/{name} is stale: regenerate it with `{docs_gen.REGENERATE}`"


def test_the_lab_yaml_reference_names_every_key_and_the_wire_reference_every_method():
    from agents.wire.catalogue.index import CATALOGUE
    from agents.wire.lab.gateway import GatewayPolicies
    from agents.wire.lab.machines import Machine
    from agents.wire.lab.model import Lab, Model, Trainer

    lab_page = gen().lab_yaml_page()
    for model in (Lab, Machine, Model, Trainer, GatewayPolicies):
        for name, field in model.model_fields.items():
            if not field.exclude:
                assert f"- **`{field.alias or name}`**" in lab_page, f"{model.__name__}.{name} is not on the page"
    assert "`source`" not in lab_page  # set by the loader, not a key of the file
    assert "- **`port`** `int` (ge=1, le=65535), `7022`." in lab_page  # type, bounds and default from the model
    wire_page = gen().wire_page()
    for method in CATALOGUE.values():
        assert f"### `{method.name}`\n\nRole: {method.role.value}." in wire_page
        assert f"### {method.params.__name__} {{#" in wire_page and f"### {method.result.__name__} {{#" in wire_page
    assert "- **`follow`** `bool`, `false`: push new lines as `log` events to this connection." in wire_page  # a comment


def test_every_page_is_in_the_nav():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.SafeLoader)

    def pages(nav: list) -> list[str]:
        out = []
        for entry in nav:
            for value in entry.values():
                out += pages(value) if isinstance(value, list) else [value]
        return out

    in_nav = pages(config["nav"])
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(in_nav) == on_disk


def test_the_readme_is_a_front_page_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    block = re.search(r"## The two commands\n.*?```sh\n(.*?)```", readme, re.S)
    assert block and [line.split()[:2] for line in block.group(1).splitlines()] == [["make", "demo"], ["make", "test"]]
    links = re.findall(r"\]\(((?:docs|screenshots)/[^)#]+)", readme)
    assert len(links) > 15 and all((ROOT / link).is_file() for link in links), [
        link for link in links if not (ROOT / link).is_file()
    ]
    makefile = (ROOT / "Makefile").read_text()
    assert "mkdocs build --strict" in makefile.split("\ndocs: ", 1)[1].split("\n\n")[0]
