"""MkDocs hook: Mermaid's browser bundle, served from the site itself.

Material for MkDocs loads Mermaid from unpkg.com unless the page already has it; a build
machine or a reader behind a firewall may not reach that CDN, and the diagrams would then
stay code. So the site ships ``mermaid.min.js`` (``extra_javascript`` in mkdocs.yml), taken
from the npm registry's tarball of the pinned version, checked against its published
integrity, and cached in ``~/.cache/outbox-lite-docs``. It is not kept in git (2.7 MB).
"""

from __future__ import annotations

import base64
import hashlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

VERSION = "11.12.2"  # the major version Material 9 expects (its CDN URL says mermaid@11)
INTEGRITY = ("sha512-n34QPDPEKmaeCG4WDMGy0OT6PSyxKCfy2pJgShP+Qow2KLrvWjclwbc3yXfSIf4BanqWE"
             "hQEpngWwNp/XhZt6w==")
CACHE = Path.home() / ".cache" / "outbox-lite-docs"
TARGET = Path("assets/javascripts/mermaid.min.js")


def _tarball() -> bytes:
    path = CACHE / f"mermaid-{VERSION}.tgz"
    if not path.exists():
        if shutil.which("npm") is None:
            raise PluginError("the docs need Mermaid's bundle: install npm (Debian: apt-get "
                              f"install npm), or put mermaid@{VERSION}'s dist/mermaid.min.js at "
                              f"docs/{TARGET}")
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "pack", f"mermaid@{VERSION}", "--silent"], cwd=CACHE,
                       check=True, stdout=subprocess.DEVNULL, timeout=600)
    data = path.read_bytes()
    digest = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    if digest != INTEGRITY:
        path.unlink()
        raise PluginError(f"mermaid-{VERSION}.tgz does not match the registry's integrity;"
                          " removed it, build again")
    return data


def on_config(config: Any, **_: Any) -> Any:
    target = Path(config["docs_dir"]) / TARGET
    if not target.exists():
        with tarfile.open(fileobj=io.BytesIO(_tarball()), mode="r:gz") as archive:
            member = archive.extractfile("package/dist/mermaid.min.js")
            assert member is not None
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(member.read())
    return config
