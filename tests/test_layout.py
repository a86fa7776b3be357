"""The README's Layout names every module of the proxy and the load generator, under its
folder: a module added without a word there fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _layout() -> dict[str, set[str]]:
    """Each folder the README's Layout lists, and the names written after it."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    folders: dict[str, set[str]] = {}
    folder = ""
    for line in filter(None, block.splitlines()):
        if not line.startswith(" "):
            folder, _, line = line.partition(" ")
            folders[folder] = set()
        folders[folder] |= set(re.findall(r"[\w.]+", line))
    return folders


def _unnamed(folders: dict[str, set[str]]) -> list[str]:
    missing = []
    for package in ("proxy", "loadgen"):
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix not in (".py", ".c", ".h") or path.stem in ("__init__", "__main__"):
                continue
            if "__pycache__" in path.parts or path.parent == ROOT / package:
                continue
            folder = str(path.parent.relative_to(ROOT)) + "/"
            if folder not in folders or not {path.stem, path.name} & folders[folder]:
                missing.append(str(path.relative_to(ROOT)))
    return missing


def test_the_readmes_layout_names_every_module_under_its_folder():
    assert not _unnamed(_layout())


def test_a_module_left_out_of_the_layout_is_named():
    folders = _layout()
    folders["proxy/core/"] = folders["proxy/core/"] - {"purges"}
    assert _unnamed(folders) == ["proxy/core/purges.py"]
