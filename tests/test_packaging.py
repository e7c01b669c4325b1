"""The distribution carries every package of the source tree: an install that is not editable
(CI's, a user's) has only what setup.cfg's ``packages`` names."""

from __future__ import annotations

import configparser
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_package_of_the_source_is_in_the_distribution():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = {name.strip() for name in config["options"]["packages"].split(",")}
    found = {".".join(path.parent.relative_to(ROOT).parts)
             for path in (ROOT / "outbox_lite").rglob("__init__.py")}
    assert found - listed == set(), "packages missing from setup.cfg"
    assert "outbox_lite._families" in listed
