"""Fetches the browser scripts the docs site ships, from the npm registry.

mkdocs-material loads two scripts from a CDN, so without internet the site
breaks: `mermaid`, which draws the pages' ```mermaid blocks (without it they
show as their source), and, for a site read from disk, the `iframe-worker`
shim that runs the search in a page (`file://` allows no web workers). The
site ships both (mkdocs.yml: `extra_javascript`, `extra.polyfills`), so it
builds and reads offline. This script writes them, and their licences
beside them:

    python docs/javascripts/update_scripts.py

It needs npm (`npm pack` checks each package against the registry's
integrity hash). For another release, change its version in `SCRIPTS`, run
this, and set the sha256 it prints: tests/test_docs_site.py checks the files
against them. Keep mermaid at major version 11 while mkdocs-material asks for
it (its bundle loads `mermaid@11` and calls that version's `mermaid.render`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Script:
    package: str
    version: str
    member: str  # The file in the package's tarball.
    name: str  # Its name here.
    sha256: str

    @property
    def path(self) -> Path:
        return HERE / self.name

    @property
    def license(self) -> Path:
        return HERE / f"{self.package}.LICENSE.txt"


SCRIPTS = (
    Script(
        "mermaid",
        "11.17.2",
        "package/dist/mermaid.min.js",
        "mermaid.min.js",
        "581ed7d74bd9048d0e3a91363927d72ef22942d7722546b27f7cc29e35390eb8",
    ),
    Script(
        "iframe-worker",
        "1.0.4",
        "package/shim/index.js",
        "iframe-worker-shim.js",
        "e8e412dbcfea9b7e31b5ffa288d7b6035915e714c542f4176a0cdbe262fc9609",
    ),
)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(script: Script) -> str:
    """Writes `script` and its licence from npm; returns its sha256."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            ["npm", "pack", f"{script.package}@{script.version}", "--silent"],
            cwd=tmp,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (tarball,) = Path(tmp).glob("*.tgz")
        with tarfile.open(tarball) as archive:
            for member, target in (
                (script.member, script.path),
                ("package/LICENSE", script.license),
            ):
                source = archive.extractfile(member)
                if source is None:
                    raise SystemExit(f"{script.package} has no {member}.")
                target.write_bytes(source.read())
    return sha256(script.path)


def main() -> int:
    if shutil.which("npm") is None:
        raise SystemExit("update_scripts.py needs npm (e.g. apt-get install npm).")
    for script in SCRIPTS:
        digest = fetch(script)
        print(f"{script.name}: {script.package} {script.version}, sha256 {digest}")
        if digest != script.sha256:
            print(f"  not the sha256 in SCRIPTS: set it to {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
