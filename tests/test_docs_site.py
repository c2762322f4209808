"""The docs site builds with `mkdocs build --strict`, its API reference
covers every public name, and it reads offline, from disk.

Strict mode fails the build on any warning: a broken link or anchor, a page
left out of the navigation, a docstring mkdocstrings cannot parse. The build
reads the docstrings statically (griffe), so it does not import TensorFlow.
Nothing here downloads: the diagrams are drawn by the mermaid script the site
ships (`docs/javascripts/`), in a headless chromium where one is installed.
"""

import hashlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

_INSTALL = (
    'the docs site needs mkdocs-material and mkdocstrings: pip install -e ".[docs]"'
)
pytest.importorskip("mkdocs", reason=_INSTALL)
pytest.importorskip("material", reason=_INSTALL)
pytest.importorskip("mkdocstrings", reason=_INSTALL)
pytest.importorskip("mkdocstrings_handlers.python", reason=_INSTALL)

ROOT = Path(__file__).resolve().parent.parent

# One build for the module: its tests run in one xdist worker.
pytestmark = pytest.mark.xdist_group("docs_site")

# Public names whose API entry the site must have, beyond the `__all__` of
# the packages in `_PACKAGES`.
_NAMED = {
    "api/strategies": [
        "keras_psdist.strategies.ps.PSStrategy",
        "keras_psdist.strategies.ps.PSStrategy.num_byzantine",
        "keras_psdist.strategies.sync_replica.SyncReplicaStrategy",
        "keras_psdist.strategies.sync_replica.SyncReplicaStrategy.replicas_to_aggregate",
        "keras_psdist.strategies.sync_replica.SyncReplicaStrategy.training",
    ],
    "api/extended": [
        "keras_psdist.distribute.extended.PSExtended",
        "keras_psdist.distribute.extended.PSExtended.placement",
        "keras_psdist.distribute.extended.PSExtended.report",
        "keras_psdist.sync.training.SyncTraining.counts",
        "keras_psdist.sync.staleness.BoundedStaleness.counts",
    ],
    "api/partitioners": [
        "keras_psdist.partitioners.Fixed",
        "keras_psdist.partitioners.MinSize",
        "keras_psdist.partitioners.MaxSize",
        "keras_psdist.partitioners.get",
        "keras_psdist.partitioners.register_row_separable",
        "keras_psdist.partitioners.is_row_separable",
    ],
    "api/placement": [
        "keras_psdist.placement.Placement",
        "keras_psdist.placement.Placement.device_of",
        "keras_psdist.placement.Placement.shards_of",
        "keras_psdist.placement.GreedyPlacement",
        "keras_psdist.placement.RoundRobinPlacement",
    ],
    "api/callbacks": [
        "keras_psdist.callbacks.AggregationReport",
        "keras_psdist.callbacks.SyncReplicaReport",
    ],
    "api/heterogeneity": [
        "keras_psdist.heterogeneity.dirichlet_split",
        "keras_psdist.heterogeneity.per_replica_dataset",
    ],
    "api/errors": [
        "keras_psdist.errors.TaskLostError",
        "keras_psdist.errors.TaskUnreachableError",
        "keras_psdist.errors.DisconnectedError",
        "keras_psdist.errors.WorkerLostError",
        "keras_psdist.errors.StalledError",
        "keras_psdist.errors.PortInUseError",
    ],
}
# Packages whose every `__all__` name has an entry on the page.
_PACKAGES = {
    "api/aggregators": "keras_psdist.aggregators",
    "api/attacks": "keras_psdist.attacks",
    "api/compression": "keras_psdist.compression",
    "api/cluster": "keras_psdist.cluster",
}
# The strategies (`kpd.PSStrategy` is defined in `keras_psdist.strategies.ps`,
# loaded lazily by the package): each entry documents every argument.
_STRATEGIES = (
    "keras_psdist.strategies.ps.PSStrategy",
    "keras_psdist.strategies.sync_replica.SyncReplicaStrategy",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, (
        f"mkdocs build --strict failed ({result.returncode}):\n{result.stderr[-6000:]}"
    )
    return out


def _page(site, name):
    return (site / f"{name}.html").read_text()


@pytest.mark.timeout(300)
def test_site_builds_strictly_with_every_page(site):
    docs = sorted(p.relative_to(ROOT / "docs") for p in (ROOT / "docs").rglob("*.md"))
    for doc in docs:
        built = site / doc.with_suffix(".html")
        assert built.exists(), f"docs/{doc} has no page in the site"


@pytest.mark.timeout(300)
def test_api_reference_has_every_public_name(site):
    import importlib

    missing = []
    for page, names in _NAMED.items():
        html = _page(site, page)
        missing += [f"{page}: {n}" for n in names if f'id="{n}"' not in html]
    for page, package in _PACKAGES.items():
        html = _page(site, page)
        module = importlib.import_module(package)
        missing += [
            f"{page}: {package}.{n}"
            for n in module.__all__
            if f'id="{package}.{n}"' not in html
        ]
    assert not missing, "API entries missing:\n" + "\n".join(missing)


@pytest.mark.timeout(300)
def test_strategy_entries_document_every_argument(site):
    import importlib
    import inspect

    html = _page(site, "api/strategies")
    starts = sorted(html.index(f'id="{path}"') for path in _STRATEGIES)
    for path in _STRATEGIES:
        module, name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        start = html.index(f'id="{path}"')
        end = min([s for s in starts if s > start], default=len(html))
        entry = html[start:end]
        for argument in inspect.signature(cls.__init__).parameters:
            if argument == "self":
                continue
            assert f"<code>{argument}</code>" in entry, (
                f"{path}: argument {argument!r} is not documented"
            )


@pytest.mark.timeout(300)
def test_signatures_are_formatted(site):
    """mkdocstrings formats a long signature one parameter a line, when it
    finds ruff or black (the `docs` extra has ruff); else it is one line."""
    html = _page(site, "api/strategies")
    start = html.index('class="doc-signature')
    signature = re.sub(r"<[^>]+>", "", html[start : html.index("</code>", start)])
    assert "PSStrategy(\n    devices:" in signature, signature[:400]
    assert max(map(len, signature.splitlines())) <= 88, signature


@pytest.mark.timeout(300)
def test_diagrams_and_figures_are_in_the_pages(site):
    assert _page(site, "architecture").count('class="mermaid"') >= 5
    assert 'src="images/strategies_epochs.png"' in _page(site, "benchmarks")
    assert (site / "images" / "strategies_epochs.png").exists()


@pytest.mark.timeout(300)
def test_every_link_opens_from_disk(site):
    """Opened as files (file://), every page's links and assets lead to a file:
    no link to a folder, which a browser shows as a listing. (404.html is
    for a web server, which resolves its absolute links.)"""
    broken = []
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html":
            continue
        for url in re.findall(r'(?:href|src)="([^"]*)"', page.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:|#|//", url):
                continue
            path = urllib.parse.unquote(url.split("#")[0].split("?")[0])
            if path and not (page.parent / path).is_file():
                broken.append(f"{page.relative_to(site)}: {url}")
    assert not broken, "links that do not open from disk:\n" + "\n".join(broken)


@pytest.mark.timeout(300)
def test_the_site_ships_the_scripts_it_needs(site):
    """No page needs the internet: the pinned mermaid and iframe-worker
    releases are in the site, and no page loads a script from elsewhere."""
    sys.path.insert(0, str(ROOT / "docs" / "javascripts"))
    try:
        import update_scripts
    finally:
        sys.path.pop(0)
    for script in update_scripts.SCRIPTS:
        shipped = site / "javascripts" / script.name
        assert hashlib.sha256(shipped.read_bytes()).hexdigest() == script.sha256, (
            f"docs/javascripts/{script.name} is not {script.package} "
            f"{script.version}: run python docs/javascripts/update_scripts.py"
        )
        assert (site / "javascripts" / script.license.name).exists()
    architecture = _page(site, "architecture")
    for name in ("mermaid.min.js", "iframe-worker-shim.js"):
        assert f'<script src="javascripts/{name}">' in architecture, name
    outside = [
        f"{page.relative_to(site)}: {src}"
        for page in sorted(site.rglob("*.html"))
        for src in re.findall(r'<script[^>]* src="([^"]*)"', page.read_text())
        if re.match(r"[a-z]+:|//", src)
    ]
    assert not outside, "scripts loaded from outside the site:\n" + "\n".join(outside)


_CHROMIUM = next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))),
    None,
)


_NO_CHROMIUM = (
    "reading the site in a browser needs a headless chromium (apt-get install "
    "chromium); test_the_site_ships_the_scripts_it_needs checks the scripts "
    "without one"
)
_HEADLESS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    # No network: what a script from a CDN would do does not count.
    "--host-resolver-rules=MAP * ~NOTFOUND",
)


@pytest.mark.timeout(300)
@pytest.mark.skipif(_CHROMIUM is None, reason=_NO_CHROMIUM)
def test_architecture_diagrams_are_drawn_offline(site, tmp_path):
    """Opened from disk with every host name unresolvable, the architecture
    page shows its diagrams drawn (an svg each), not their source."""
    page = site / "architecture.html"
    diagrams = page.read_text().count('<pre class="mermaid">')
    assert diagrams >= 5
    drawn = _drawn_diagrams(_CHROMIUM, page.as_uri(), tmp_path, diagrams)
    assert drawn == diagrams, (
        f"{drawn} of the {diagrams} diagrams of architecture.html were drawn; "
        "the others show as source: the mermaid script did not load, or a "
        "diagram has a syntax error (the browser's console says which)"
    )


@pytest.mark.timeout(300)
@pytest.mark.skipif(_CHROMIUM is None, reason=_NO_CHROMIUM)
def test_search_works_from_disk(site, tmp_path):
    """Opened from disk, with no network, the search finds pages (`?q=`
    opens it with a query)."""
    url = (site / "index.html").as_uri() + "?q=placement"
    result = subprocess.run(
        [
            _CHROMIUM,
            *_HEADLESS,
            f"--user-data-dir={tmp_path}",
            "--virtual-time-budget=15000",
            "--dump-dom",
            url,
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(
        r'md-search-result__meta">(\d+) matching documents', result.stdout
    )
    assert found and int(found.group(1)) > 0, (
        "no search results from disk:\n" + result.stderr[-3000:]
    )


def _drawn_diagrams(chromium, url, profile, expected, timeout_s=60.0):
    """How many `.mermaid` elements of the page at `url` hold an svg, once
    `expected` do or `timeout_s` has passed.

    Material draws each diagram into a closed shadow root, out of reach of
    the page's scripts and of `--dump-dom`, so the count comes from the
    DevTools protocol (`DOM.getDocument` with `pierce`), spoken over
    `--remote-debugging-pipe`: the browser reads commands on fd 3 and writes
    replies on fd 4, each a JSON text ended by a NUL byte.
    """
    import fcntl

    to_browser, commands = os.pipe()
    replies, from_browser = os.pipe()
    # Above 4, so that the child's dup2 onto 3 and 4 cannot overwrite them.
    ends = [
        fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser, from_browser)
    ]
    for fd in (to_browser, from_browser):
        os.close(fd)

    def child_fds():
        os.dup2(ends[0], 3)
        os.dup2(ends[1], 4)

    browser = subprocess.Popen(
        [
            chromium,
            *_HEADLESS,
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        close_fds=False,  # fds 3 and 4; ours are all close-on-exec
        preexec_fn=child_fds,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for fd in ends:
        os.close(fd)
    deadline = time.monotonic() + timeout_s
    pending = b""
    next_id = 0

    def call(method, session=None, **params):
        nonlocal pending, next_id
        next_id += 1
        message = {"id": next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(commands, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in pending:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([replies], [], [], left)[0]:
                    raise TimeoutError(f"chromium did not answer {method}")
                chunk = os.read(replies, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium exited ({browser.poll()})")
                pending += chunk
            raw, pending = pending.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    try:
        target = call("Target.createTarget", url=url)["targetId"]
        session = call("Target.attachToTarget", targetId=target, flatten=True)
        session = session["sessionId"]
        while True:
            root = call("DOM.getDocument", session, depth=-1, pierce=True)["root"]
            drawn = _count_drawn(root)
            if drawn >= expected or time.monotonic() > deadline - 5:
                return drawn
            time.sleep(0.5)
    finally:
        browser.kill()
        browser.wait()
        os.close(commands)
        os.close(replies)


def _count_drawn(node) -> int:
    """The `.mermaid` elements under `node` (shadow roots included) that
    hold an svg."""
    attributes = node.get("attributes", [])
    classes = dict(zip(attributes[::2], attributes[1::2], strict=True)).get("class", "")
    if "mermaid" in classes.split():
        return int(_has_svg(node))
    return sum(_count_drawn(child) for child in _children(node))


def _has_svg(node) -> bool:
    return node.get("nodeName", "").lower() == "svg" or any(
        _has_svg(child) for child in _children(node)
    )


def _children(node) -> list:
    return node.get("children", []) + node.get("shadowRoots", [])
