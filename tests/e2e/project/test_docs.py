"""The manual (docs/, mkdocs.yml): the generated reference pages match the code, the site builds with --strict, and the
README stays a short front page that links into it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs import DOCS, ROOT


def test_the_check_fails_on_a_stale_page_and_names_the_command(tmp_path):
    """`python docs/gen.py --check` (make docs) on a copy of the tree whose wire page lost a line."""
    shutil.copytree(DOCS, tmp_path / "docs")
    for top in ("agents", "console", "widgets"):
        (tmp_path / top).symlink_to(ROOT / top)
    page = tmp_path / "docs" / "reference" / "wire.md"
    page.write_text(page.read_text().replace("### `jobs.start`\n", "", 1))
    result = subprocess.run([sys.executable, str(tmp_path / "docs" / "gen.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 1 and "docs/reference/wire.md" in result.stderr and "python docs/gen.py" in result.stderr
    assert "lab-yaml.md" not in result.stderr, result.stderr


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None, reason="mkdocs is not installed")
def test_the_site_builds_strict(tmp_path):
    result = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "lab-yaml" / "index.html").is_file()
