"""A private JupyterLab server and a headless Chromium, for the browser tests.

``jupyterlab_server(root)`` starts ``jupyter lab`` on a free port with everything in
``root``'s sibling folders (config, runtime, data, settings, workspaces, IPython), so nothing
of the user's environment is read and nothing is written outside the test's tmp dir. Its
only kernel, ``python3``, is the Python running the tests (``sys.executable``).

``chromium_executable()`` finds the system Chromium that Playwright drives (no browser
download); both fail with how to install what is missing.

The session fixtures ``chromium`` and ``jupyterlab`` (tests/conftest.py imports them) give
every browser suite one Chromium, one JupyterLab server and one kernel: the quick-start
notebook and the explorer suite's plans, run once (:func:`lab_session`). The helpers below
drive a view the same way in JupyterLab and in the exported page (the same front end draws
both), wait for what they need (a kernel's answer, a drawn frame) rather than for a fixed
time, and say when a failure came on a busy machine (:func:`load_note`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
_CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_INSTALL_TEST = 'pip install -e ".[test]" (make test does)'

# Lab settings: every cell attached to the DOM (no windowing), no news or update checks.
_LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


def require_browser_stack() -> None:
    """Fail (not skip) with an install hint when jupyterlab, playwright or ipykernel is missing."""
    missing = [m for m in ("jupyterlab", "playwright", "ipykernel") if not _importable(m)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: {_INSTALL_TEST}", pytrace=False)


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def chromium_executable() -> str:
    """The system Chromium (``$BROWSER_PATH`` first, as kaleido); fails saying how to install it."""
    candidates = [os.environ.get("BROWSER_PATH", ""), *_CHROMIUM_NAMES]
    for name in candidates:
        path = shutil.which(name) if name else None
        if path:
            return path
    pytest.fail(
        "Chromium not found: install it with `make system` (apt-get install chromium) "
        "or point BROWSER_PATH at a Chromium/Chrome binary",
        pytrace=False,
    )


@dataclass
class LabServer:
    url: str  # ends with "/"
    root: Path
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(self.url + path.lstrip("/"), method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def wait_for_kernel_connection(self, timeout: float) -> None:
        """Until a browser is connected to a kernel (a websocket) and that kernel is idle."""
        deadline = time.monotonic() + timeout
        kernels: object = []
        while time.monotonic() < deadline:
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                kernels = self.api("api/kernels")
            assert isinstance(kernels, list)
            if any(k["connections"] > 0 and k["execution_state"] == "idle" for k in kernels):
                return
            time.sleep(0.2)
        raise TimeoutError(
            f"no kernel connected and idle in {timeout:.0f} s: {kernels}\n{self.log_tail()}"
        )

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _write_kernelspec(data_dir: Path) -> None:
    spec = data_dir / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (ipykernel)",
                "language": "python",
                "metadata": {"debugger": False},
            }
        )
    )


def _write_labextension(data_dir: Path) -> None:
    """This checkout's JupyterLab extension (``fsdpviz/labextension``, as ``npm run build``
    wrote it), found first (``JUPYTER_PATH``): the tests drive the extension of the tree they
    test, whatever the environment has installed or linked."""
    built = Path(__file__).resolve().parent.parent / "fsdpviz" / "labextension"
    if (built / "package.json").is_file():
        (data_dir / "labextensions").mkdir(parents=True, exist_ok=True)
        (data_dir / "labextensions" / "fsdpviz").symlink_to(built, target_is_directory=True)


def _write_settings(settings_dir: Path) -> None:
    for plugin, values in _LAB_SETTINGS.items():
        path = settings_dir / f"{plugin.replace(':', '/')}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@contextlib.contextmanager
def jupyterlab_server(root: Path, *, start_timeout: float = 90.0) -> Iterator[LabServer]:
    """``jupyter lab`` serving ``root``; shut down (kernels included) on exit, even on failure."""
    home = root.parent / f"{root.name}-jupyter"
    dirs = {
        name: home / name
        for name in ("config", "runtime", "data", "settings", "workspaces", "ipython")
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    _write_kernelspec(dirs["data"])
    _write_labextension(dirs["data"])
    _write_settings(dirs["settings"])
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(dirs["config"]),
        "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        "JUPYTER_DATA_DIR": str(dirs["data"]),
        "JUPYTER_PATH": str(dirs["data"]),  # searched first: our python3 kernelspec wins
        "JUPYTER_CONFIG_PATH": str(dirs["config"]),
        "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
        "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
        "IPYTHONDIR": str(dirs["ipython"]),
        "JUPYTER_PLATFORM_DIRS": "0",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    env.pop("JUPYTER_PREFER_ENV_PATH", None)
    port = _free_port()
    log = home / "jupyterlab.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        "--IdentityProvider.token=",
        "--ServerApp.password=",
        "--ServerApp.disable_check_xsrf=True",
        "--allow-root",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={dirs['settings']}",
        f"--LabApp.workspaces_dir={dirs['workspaces']}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--KernelSpecManager.ensure_native_kernel=False",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = LabServer(f"http://127.0.0.1:{port}/", root, process, log)
    try:
        _wait_until_up(server, start_timeout)
        yield server
    finally:
        _shut_down(server)


def _wait_until_up(server: LabServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"jupyter lab exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        try:
            server.api("api/status")
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)
    raise TimeoutError(f"jupyter lab did not answer in {timeout:.0f} s:\n{server.log_tail()}")


def _shut_down(server: LabServer) -> None:
    """Ask the server to stop (it shuts its kernels down), then make sure all have."""
    children = _descendants(server.process.pid)
    if server.process.poll() is None:
        with contextlib.suppress(Exception):
            server.api("api/shutdown", method="POST")
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)
    for pid, started in children:  # kernels run in sessions of their own
        if _started(pid) == started:  # still that process, not a new one with its pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name ([] when gone or not Linux)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _started(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else None


def _descendants(pid: int) -> list[tuple[int, str | None]]:
    """``(pid, start time)`` of the processes ``pid`` started, and theirs (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(int(entry.name))
        if len(fields) > 1:
            parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        frontier = [c for c, p in parents.items() if p in frontier]
        found += frontier
    return [(c, _started(c)) for c in found]


class KernelTraffic:
    """The widget messages a page sent to its kernel, and which of them the kernel answered.

    ipywidgets keeps at most one update per widget in flight and merges the ones made in the
    meantime (the last value of a trait wins), so a test that must not have an event merged
    away waits here first. Reads the kernel websocket (JSON or the v1 binary protocol).
    """

    def __init__(self, page: Any) -> None:
        self.page = page
        self.sent = 0
        self.pending: set[str] = set()
        self.points: list[str] = []  # plotly point events sent, e.g. "plotly_click"
        self._last = time.monotonic()
        page.on("websocket", self._on_websocket)

    def _on_websocket(self, ws: Any) -> None:
        if "/api/kernels/" in ws.url:
            ws.on("framesent", self._on_sent)
            ws.on("framereceived", self._on_received)

    def _on_sent(self, payload: str | bytes) -> None:
        msg = _decode(payload)
        if msg is not None and msg["header"].get("msg_type") == "comm_msg":
            self.sent += 1
            self.pending.add(msg["header"]["msg_id"])
            state = msg["content"].get("data", {}).get("state") or {}
            event = state.get("_js2py_pointsCallback")
            if isinstance(event, dict):
                self.points.append(str(event.get("event_type")))
            self._last = time.monotonic()

    def _on_received(self, payload: str | bytes) -> None:
        msg = _decode(payload)
        if (
            msg is not None
            and msg["header"].get("msg_type") == "status"
            and msg["content"].get("execution_state") == "idle"
            and msg["parent_header"].get("msg_id") in self.pending
        ):
            self.pending.discard(msg["parent_header"]["msg_id"])
            self._last = time.monotonic()

    def wait_until_answered(self, *, after: int, timeout: float = 20.0, quiet: float = 0.2) -> None:
        """Until more than ``after`` messages were sent, all answered, none for ``quiet`` s."""
        deadline = time.monotonic() + timeout
        while not (
            self.sent > after and not self.pending and time.monotonic() - self._last >= quiet
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"widget messages unanswered after {timeout:.0f} s "
                    f"(sent {self.sent}, waiting for {len(self.pending)})"
                )
            self.page.wait_for_timeout(20)  # lets Playwright deliver the websocket events


def _decode(payload: str | bytes) -> dict[str, Any] | None:
    """A kernel message from a websocket frame: JSON, or v1 binary (offsets, then parts)."""
    try:
        if isinstance(payload, str):
            msg: dict[str, Any] = json.loads(payload)
            return msg if "header" in msg else None
        data = bytes(payload)
        n = int.from_bytes(data[:8], "little")
        offsets = [int.from_bytes(data[8 + 8 * i : 16 + 8 * i], "little") for i in range(n)]
        parts = [data[a:b] for a, b in zip(offsets, [*offsets[1:], len(data)], strict=True)]
        keys = ("header", "parent_header", "metadata", "content")
        msg = {"channel": parts[0].decode()}
        msg.update({k: json.loads(v) for k, v in zip(keys, parts[1:5], strict=True)})
        return msg
    except (ValueError, IndexError, UnicodeDecodeError):
        return None


# ------------------------------------------------------------- a busy machine

LOAD_HINT = (
    "the machine was busy: load average {load:.1f} over the last minute on {cpus} cores "
    "(above 1 per core, other work competed with the browser, JupyterLab and the kernel); "
    "run the test again on a quieter machine before looking for a bug"
)


def load_note() -> str:
    """What the machine's load says about a failure: a hint when it was busy, else ""."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    cpus = os.cpu_count() or 1
    return LOAD_HINT.format(load=load, cpus=cpus) if load > cpus else ""


def wait_until(page: Any, js: str, what: str, *, arg: Any = None, timeout_ms: float) -> None:
    """Until ``js`` (a function of ``arg``) is true in the page; its timeout is only a
    failsafe, and its error says what was awaited and whether the machine was busy."""
    try:
        page.wait_for_function(js, arg=arg, timeout=timeout_ms)
    except Exception as e:
        raise AssertionError(f"waited {timeout_ms / 1000:.0f} s for {what}; {load_note()}") from e


def next_frame(page: Any) -> None:
    """Until the page has drawn its next frame (what a change asked for is on the screen)."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)))")


# ------------------------------------------------------------- the kernel, asked directly


class KernelClient:
    """A second client of the notebook's kernel: the tests ask it for the widgets' Python
    state without adding cells to the notebook (the kernel answers in the order it got the
    messages, so what the page sent before has been handled)."""

    def __init__(self, lab: LabServer, timeout: float = 600.0) -> None:
        from jupyter_client import BlockingKernelClient

        kernels = lab.api("api/kernels")
        assert isinstance(kernels, list) and len(kernels) == 1, kernels
        runtime = lab.root.parent / f"{lab.root.name}-jupyter" / "runtime"
        self.client = BlockingKernelClient(
            connection_file=str(runtime / f"kernel-{kernels[0]['id']}.json")
        )
        self.client.load_connection_file()
        self.client.start_channels()
        self.timeout = timeout

    def run(self, code: str) -> str:
        """Run ``code``; what it printed (raises with the traceback when it failed)."""
        out: list[str] = []
        errors: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                (out if content["name"] == "stdout" else errors).append(content["text"])
            elif kind == "error":
                errors.append("\n".join(content["traceback"]))

        try:
            reply = self.client.execute_interactive(
                code, store_history=False, timeout=self.timeout, output_hook=hook
            )
        except TimeoutError as e:
            raise AssertionError(f"the kernel did not answer in {self.timeout:.0f} s; "
                                 f"{load_note()}") from e  # fmt: skip
        if reply["content"]["status"] != "ok" or errors:
            raise AssertionError(f"the kernel failed to run {code!r}:\n{''.join(errors)}")
        return "".join(out)

    def json(self, expression: str) -> Any:
        """The value of a Python ``expression`` in the kernel (JSON-able)."""
        out = self.run(f"import json as _j\nprint(_j.dumps({expression}))")
        return json.loads(out.strip().splitlines()[-1])

    def close(self) -> None:
        self.client.stop_channels()


# ------------------------------------------------------------- one JupyterLab per session

# The notebook both JupyterLab suites drive: the quick-start notebook (its dashboard is
# `view`), then the explorer suite's plans of 5, 49 and 120 units and their dashboards.
# Each added cell starts with a marker that finds it again.
SMALL = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2}
SUITE_CELLS = {
    "# fv:reports": "from fsdpviz.examples import ExampleConfig, example_analysis\n"
    f"SMALL = {SMALL!r}\n"
    "r5, r49, r120 = (example_analysis(config=ExampleConfig(num_layers=n - 1, **SMALL),"
    " progress=False) for n in (5, 49, 120))",
    "# fv:v49": "v49 = r49.show()\nv49",
    "# fv:v120": "v120 = r120.show()\nv120",
    "# fv:v5": "v5 = r5.show()\nv5",
}
QUICKSTART = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart.ipynb"
NOTEBOOK = "session.ipynb"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"

# Generous failsafes: every wait is for a condition, these only end a wait that never ends.
UI_MS = 120_000
RUN_ALL_MS = 1_200_000

# plotly.js is no longer on the page; nothing of the browser is tolerated
_STDERR = "application/vnd.jupyter.stderr"


def session_notebook(root: Path) -> None:
    """The quick-start notebook, outputs cleared, then :data:`SUITE_CELLS`, in ``root``."""
    import nbformat

    nb = nbformat.read(QUICKSTART, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    for marker, code in SUITE_CELLS.items():
        nb.cells.append(nbformat.v4.new_code_cell(f"{marker}\n{code}"))
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nbformat.write(nb, root / NOTEBOOK)


@dataclass
class LabSession:
    """JupyterLab with the session notebook run, in one browser page, and its kernel."""

    lab: LabServer
    page: Any  # playwright.sync_api.Page
    traffic: KernelTraffic
    kernel: KernelClient
    shots: Path
    errors: list[str]

    def cell(self, marker: str) -> Any:
        """The code cell whose source starts with ``marker`` (``# fv:v49``)."""
        return self.page.locator(".jp-Notebook .jp-CodeCell").filter(
            has=self.page.locator(".jp-InputArea", has_text=marker)
        )

    def output(self, marker: str) -> Any:
        return self.cell(marker).locator(".jp-Cell-outputArea")

    def settle(self, timeout_ms: float = UI_MS) -> None:
        """Until every widget message the page sent was answered, and the page drew it."""
        self.traffic.wait_until_answered(after=-1, timeout=timeout_ms / 1000)
        next_frame(self.page)

    def py(self, expression: str) -> Any:
        """The kernel's value of ``expression``, once it has handled what the page sent."""
        self.settle()
        return self.kernel.json(expression)

    def run_new_cell(self, code: str) -> str:
        """Add a cell at the end of the notebook through the UI, run it, return its output."""
        from playwright.sync_api import expect

        page = self.page
        cells = page.locator(".jp-Notebook .jp-Cell")
        n = cells.count()
        cells.nth(n - 1).locator(".jp-InputPrompt").click()
        toolbar = page.get_by_role("toolbar", name="main area toolbar")
        toolbar.get_by_role("button", name=re.compile(r"^Insert a cell below")).click()
        new = cells.nth(n)
        new.wait_for(timeout=UI_MS)
        new.locator(".cm-content").click()
        page.keyboard.insert_text(code)
        page.keyboard.press("Control+Enter")  # run, stay on the cell
        try:
            expect(new.locator(".jp-InputPrompt")).to_have_text(
                re.compile(r"^\[\d+\]:$"), timeout=UI_MS
            )
        except AssertionError as e:
            raise AssertionError(f"the added cell did not finish; {load_note()}") from e
        return str(new.locator(".jp-Cell-outputArea").first.inner_text())

    def last_output(self) -> Any:
        return self.page.locator(".jp-Notebook .jp-Cell").last.locator(".jp-Cell-outputArea")

    def screenshot(self, name: str, locator: Any = None) -> Path:
        """``locator`` (else the page) as ``name.png``, also under ``tests/artifacts/``."""
        path = self.shots / f"{name}.png"
        self.page.mouse.move(1, 1)  # no hover box over the views
        (locator or self.page).screenshot(path=str(path))
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(path, ARTIFACTS / path.name)
        return path

    def on_console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console.error: {message.text}")

    def assert_no_browser_errors(self) -> None:
        assert not self.errors, "errors in the browser:\n" + "\n".join(self.errors)


def views_drawn(scope: Any, what: str, timeout_ms: float = UI_MS) -> None:
    """Until the timeline, the explorer and the prefetch graph of ``scope`` (a dashboard's
    output) have each drawn a frame on their canvases."""
    for view in ("fsdpviz-timeline", "fsdpviz-explorer", "fsdpviz-prefetch"):
        root = scope.locator(f".{view}").first
        try:
            root.wait_for(timeout=timeout_ms)
        except Exception as e:
            raise AssertionError(f"{what}: no {view} drawn; {load_note()}") from e
        wait_until(
            scope.page,
            "el => el.fsdpviz !== undefined && el.querySelector('canvas').width > 0",
            f"{what}: {view} drawn",
            arg=root.element_handle(),
            timeout_ms=timeout_ms,
        )


@contextlib.contextmanager
def lab_session(server: LabServer, browser: Any, shots: Path) -> Iterator[LabSession]:
    """JupyterLab on the session notebook, run with Run → Run All Cells, every dashboard
    drawn and every message of its start answered (the kernel's idle work included)."""
    session_notebook(server.root)
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    kernel: KernelClient | None = None
    try:
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        traffic = KernelTraffic(page)
        page.goto(server.url + f"lab/tree/{NOTEBOOK}")
        # The indicator reads "idle" before the session exists too: first wait for the
        # page's connection to the kernel (the server counts it), then for it to be idle.
        server.wait_for_kernel_connection(UI_MS / 1000)
        page.locator(".jp-Notebook-ExecutionIndicator[data-status=idle]").wait_for(timeout=UI_MS)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        # Done: no cell queued or running, and every code cell ran (or one failed).
        wait_until(
            page,
            """() => {
              const STDERR = '.jp-OutputArea-output[data-mime-type="STDERR_TYPE"]';
              const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
                .map(p => p.textContent.trim());
              const status = document.querySelector('.jp-Notebook-ExecutionIndicator');
              const idle = status !== null && status.dataset.status === 'idle';
              const failed = [...document.querySelectorAll(STDERR)]
                .some(o => o.textContent.includes('Traceback'));
              return idle && !prompts.includes('[*]:')
                && (failed || prompts.every(p => /^\\[\\d+\\]:$/.test(p)));
            }""".replace("STDERR_TYPE", _STDERR),
            "Run All Cells to finish",
            timeout_ms=RUN_ALL_MS,
        )
        kernel = KernelClient(server)
        s = LabSession(server, page, traffic, kernel, shots, errors)
        page.on("console", s.on_console)
        for marker in ("# fv:v49", "# fv:v120", "# fv:v5"):
            views_drawn(s.output(marker), marker)
        views_drawn(s.page.locator(".jp-CodeCell").filter(has_text="view = report.show"),
                    "the quick-start dashboard")  # fmt: skip
        s.settle()
        yield s
    finally:
        if kernel is not None:
            kernel.close()
        page.close()


# ------------------------------------------------------------- the views, as a user drives them
#
# Each view's root element carries its view object (`fsdpviz`): the same code draws it in
# JupyterLab and in the exported page, and these helpers drive it the same way in both.
# `scope` is a locator holding one view (a dashboard's output, or the page).


def timeline_root(scope: Any) -> Any:
    return scope.locator(".fsdpviz-timeline").first


def explorer_root(scope: Any) -> Any:
    """The explorer's canvas view (its box, `.fsdpviz-explorer-box`, holds it and the panel)."""
    return scope.locator(".fsdpviz-explorer").first


def prefetch_root(scope: Any) -> Any:
    return scope.locator(".fsdpviz-prefetch").first


# The timeline's root element carries its view (js/src/timeline_view.ts): these read and place it.
EVENT_CENTRE = """([root, s]) => {
  const v = root.fsdpviz, st = v.data.steps;
  const w = Math.max(st.x1[s] - st.x0[s], 1e-9);
  v.showRange(st.x0[s] - 2 * w, st.x1[s] + 2 * w);
  v.canvas.scrollIntoView({block: 'center'});
  const c = v.markCentre(s);
  if (c === null) return null;
  const r = v.canvas.getBoundingClientRect();
  return [r.left + c.x, r.top + c.y, r.left, r.top];
}"""
_CANVAS_AT = """root => { const r = root.fsdpviz.canvas.getBoundingClientRect();
                         return [r.left, r.top]; }"""
_SELECTED = """root => {
  const v = root.fsdpviz, tip = root.querySelector('.fv-tooltip');
  return {step: v.player.step, unit: v.model.get('selected_unit'),
          tip: tip && !tip.hidden ? tip.textContent : ''};
}"""
_EVENT = """([root, s]) => {
  const d = root.fsdpviz.data, st = d.steps;
  return {kind: d.kinds[st.kind[s]], unit: d.units[st.unit[s]]};
}"""


def click_every_event(page: Any, root: Any) -> tuple[int, list[str]]:
    """Click the centre of every event's own mark in the timeline ``root`` (a locator of
    ``.fsdpviz-timeline``), each zoomed so its mark is wide enough to hit; hover it first.

    Returns how many events were clicked and what went wrong: an event with no mark, a
    click that selected another event or unit, a hover that named another event. A click
    aimed while the page moved the timeline (a view above it grew, answering the last
    click) is aimed again once the page is still, as a person would.
    """
    handle = root.element_handle()
    n = int(handle.evaluate("root => root.fsdpviz.data.n_steps"))
    wrong: list[str] = []
    for s in range(n):
        event = page.evaluate(_EVENT, [handle, s])
        for attempt in range(3):
            at = page.evaluate(EVENT_CENTRE, [handle, s])
            if at is None:
                break
            page.mouse.move(at[0], at[1])
            hovered = page.evaluate(_SELECTED, handle)
            page.mouse.click(at[0], at[1])
            got = page.evaluate(_SELECTED, handle)
            if page.evaluate(_CANVAS_AT, handle) == at[2:] or attempt == 2:
                break
            _wait_until_still(page, handle)
        if at is None:
            wrong.append(f"step {s} ({event}): no mark drawn")
        elif got["step"] != s or got["unit"] != event["unit"]:
            wrong.append(f"step {s} ({event}): the click selected {got}")
        elif event["kind"] not in hovered["tip"]:
            wrong.append(f"step {s} ({event}): the hover says {hovered['tip']!r}")
    return n, wrong


def _wait_until_still(page: Any, handle: Any) -> None:
    """Until the view's canvas has stayed in one place for 200 ms."""
    wait_until(
        page,
        """root => new Promise(done => {
             const at = () => { const r = root.fsdpviz.canvas.getBoundingClientRect();
                                return r.left + ',' + r.top; };
             const first = at();
             setTimeout(() => done(at() === first), 200);
           })""",
        "the page to stop moving",
        arg=handle,
        timeout_ms=UI_MS,
    )


def walk_cursor(page: Any, root: Any, order: str) -> list[dict[str, float]]:
    """Walk one whole timeline with the → key in ``order`` ("issue" or "stream"), from its
    first step; after each press, what the view drew: ``step``, the cursor's ``x`` (data)
    and ``px`` (CSS pixels, as drawn), the left edge of the current event's own mark
    (``mark_px``: on its stream lane, a free's in the CPU lane; NaN if not drawn), the
    event's own start (``start``: ``x0``, a free's hook time) and ``issue`` (its hook's)."""
    handle = root.element_handle()
    page.evaluate(
        """([root, order]) => { const v = root.fsdpviz; v.setOrder(order); v.player.first(); }""",
        [handle, order],
    )
    n = int(handle.evaluate("root => root.fsdpviz.data.n_steps"))
    root.locator("canvas").first.focus()
    read = """root => { const v = root.fsdpviz; const s = v.player.step; const d = v.data.steps;
        const m = v.markCentre(s);
        return { step: s, x: v.cursor(), px: v.cursorPx(),
                 mark_px: m === null ? NaN : m.x - m.w / 2,
                 start: d.kind[s] === 1 ? d.issue[s] : d.x0[s], issue: d.issue[s] }; }"""
    out = [dict(handle.evaluate(read))]
    for _ in range(n - 1):
        page.keyboard.press("ArrowRight")
        out.append(dict(handle.evaluate(read)))
    return out


def choose_theme(page: Any, theme: str, light: bool) -> None:
    """Settings → Theme → ``theme`` in JupyterLab's menu, until every view of the page has
    read it (each view reads the page's theme itself)."""
    page.get_by_role("menuitem", name="Settings", exact=True).click()
    item = ".lm-Menu .lm-Menu-item:has(.lm-Menu-itemLabel:text-is('{}'))"
    page.locator(item.format("Theme")).hover()
    page.locator(item.format(theme)).click()
    name = "light" if light else "dark"
    wait_until(
        page,
        f"""() => document.body.dataset.jpThemeLight === '{str(light).lower()}'
          && [...document.querySelectorAll('.fsdpviz-timeline, .fsdpviz-view')]
               .every(e => e.fsdpviz && e.fsdpviz.theme.name === '{name}')""",
        f"every view to read JupyterLab's {name} theme",
        timeout_ms=UI_MS,
    )
    next_frame(page)


# The explorer and the prefetch graph (js/src/explorer.ts, prefetch.ts, drawn by
# explorer_widget.ts and prefetch_widget.ts): where a module's block and a unit's node are,
# what each view shows, and what its model holds (what the notebook's kernel or the page
# hears).
_BLOCK_AT = """([root, name]) => { const v = root.fsdpviz;
  const s = v.slotOf(v.index.byName.get(name) ?? -1); if (s === null) return null;
  const r = v.canvas.getBoundingClientRect();
  return [r.left + s.x + s.w / 2, r.top + s.y + s.h / 2]; }"""
_NODE_AT = """([root, name]) => { const v = root.fsdpviz;
  const c = v.nodeCentre(name); if (c === null) return null;
  const r = v.canvas.getBoundingClientRect(); return [r.left + c.x, r.top + c.y]; }"""
_MODEL = """root => { const box = root.closest('.fsdpviz-explorer-box');
  const m = box !== null ? box.fsdpviz.model : null;
  return m === null ? null : {selected_unit: m.get('selected_unit'),
                              selected_module: m.get('selected_module'), focus: m.get('focus')};
}"""


def _hover(page: Any, root: Any, locate: str, name: str) -> tuple[float, float]:
    root.locator("canvas").first.scroll_into_view_if_needed()
    at = page.evaluate(locate, [root.element_handle(), name])
    assert at is not None, f"{name!r} is not drawn"
    page.mouse.move(at[0] - 2, at[1])
    page.mouse.move(*at)
    return at[0], at[1]


def hover_block(page: Any, root: Any, module: str) -> tuple[float, float]:
    """Move the mouse onto the centre of ``module``'s block in the explorer ``root``."""
    return _hover(page, root, _BLOCK_AT, module)


def click_block(page: Any, root: Any, module: str) -> None:
    """Click the centre of ``module``'s block in the explorer ``root``, as a user does."""
    page.mouse.click(*hover_block(page, root, module))


def hover_node(page: Any, root: Any, unit: str) -> tuple[float, float]:
    """Move the mouse onto the centre of ``unit``'s node in the prefetch graph ``root``."""
    return _hover(page, root, _NODE_AT, unit)


def click_node(page: Any, root: Any, unit: str) -> None:
    """Click the centre of ``unit``'s node in the prefetch graph ``root``."""
    page.mouse.click(*hover_node(page, root, unit))


def explorer_state(root: Any) -> dict[str, Any]:
    """What the explorer ``root`` shows: the module at the top, the units outlined, the
    modules outlined as the current step's, the labels drawn (with their blocks), its
    detail panel, and what its model holds."""
    state: dict[str, Any] = root.evaluate(
        """root => { const v = root.fsdpviz, names = v.data.modules.name;
          const box = root.closest('.fsdpviz-explorer-box');
          const panel = box && box.querySelector('.fv-detail');
          return {focus: names[v.focus], current: v.root.dataset.fvCurrentUnit,
                  selected: v.root.dataset.fvSelectedUnit,
                  outlined: v.outlinedModules(), labels: v.drawnLabels(),
                  crumbs: v.crumbs.textContent, span: [v.span.a, v.span.b],
                  title: v.titleEl.textContent, found: v.findNote.textContent,
                  width: v.canvas.getBoundingClientRect().width,
                  outer: v.root.getBoundingClientRect().width,
                  detail: panel === null || panel.hidden ? '' : panel.textContent,
                  theme: v.theme.name};
        }"""
    )
    state["model"] = root.evaluate(_MODEL)
    return state


def prefetch_state(root: Any) -> dict[str, Any]:
    """What the prefetch graph ``root`` shows: the window, the units ringed, the names."""
    state: dict[str, Any] = root.evaluate(
        """root => { const v = root.fsdpviz, u = v.data.units;
          return {window: [v.win.u0, v.win.u1],
                  current: v.current < 0 ? null : u[v.current],
                  selected: v.selected < 0 ? null : u[v.selected],
                  names: v.names().map(([k, t]) => [t, v.xOf(k)]),
                  upright: v.layout.upright, windowed: v.layout.windowed,
                  title: v.titleEl.textContent, n: u.length,
                  width: v.canvas.getBoundingClientRect().width,
                  outer: v.root.getBoundingClientRect().width, theme: v.theme.name}; }"""
    )
    return state


def click_every_block(page: Any, root: Any) -> tuple[int, list[str]]:
    """Click the centre of every module's block in the explorer ``root``, each drawn below
    the module above it (its parent at the top) and zoomed across until it is wide enough
    to hit, as a person would reach it. Each click must select the module and its unit
    (what the model holds: what the kernel or the page hears) and zoom into a block that
    has modules below it. Returns how many blocks were clicked and what went wrong."""
    handle = root.element_handle()
    n = int(handle.evaluate("root => root.fsdpviz.index.n"))
    wrong: list[str] = []
    for i in range(n):
        want = page.evaluate(
            """([root, i]) => { const v = root.fsdpviz, m = v.data.modules;
                 const p = m.parent[i];
                 v.focusOn(p < 0 ? 0 : p);
                 v.reveal(i);
                 const opens = i !== v.focus && v.index.children[i].some(c => v.values()[c] > 0);
                 const u = m.unit[i];
                 return {name: m.name[i], unit: u < 0 ? null : v.data.units[u].name,
                         focus: opens ? m.name[i] : m.name[v.focus]}; }""",
            [handle, i],
        )
        page.mouse.click(*hover_block(page, root, want["name"]))
        got = handle.evaluate(_MODEL)
        expected = {
            "selected_unit": want["unit"],
            "selected_module": want["name"],
            "focus": want["focus"],
        }
        if got != expected:
            wrong.append(f"{want['name'] or '(root)'}: the click left {got}, not {expected}")
    return n, wrong


def click_every_node(page: Any, root: Any) -> tuple[int, list[str]]:
    """Click the centre of every unit's node in the prefetch graph ``root`` (the window
    moved to it first where it is not shown), hovering it first. Each click must select
    exactly that unit, and the hover must name it. Returns how many and what went wrong."""
    handle = root.element_handle()
    units: list[str] = handle.evaluate("root => root.fsdpviz.data.units")
    wrong: list[str] = []
    for k, unit in enumerate(units):
        handle.evaluate("(root, u) => root.fsdpviz.follow(u)", k)
        x, y = hover_node(page, root, unit)
        tip = str(handle.evaluate("root => root.fsdpviz.tooltip.lines.join('\\n')"))
        page.mouse.click(x, y)
        got = handle.evaluate(
            "root => { const v = root.fsdpviz;"
            " return v.selected < 0 ? null : v.data.units[v.selected]; }"
        )
        label = "(root)" if unit == "" else f"'{unit}'"
        if got != unit:
            wrong.append(f"{label}: the click selected {got!r}")
        elif not tip.startswith(label):
            wrong.append(f"{label}: the hover says {tip.splitlines()[:1]}")
    return len(units), wrong


def canvas_background(root: Any) -> list[int]:
    """The RGB of the canvas of ``root`` at its bottom-right corner (the view's background)."""
    rgb: list[int] = root.evaluate(
        """root => { const src = root.querySelector('canvas'), c = document.createElement('canvas');
          c.width = src.width; c.height = src.height;
          const ctx = c.getContext('2d', {willReadFrequently: true}); ctx.drawImage(src, 0, 0);
          return [...ctx.getImageData(c.width - 2, c.height - 2, 1, 1).data.slice(0, 3)]; }"""
    )
    return rgb


# A copy of a canvas's pixels, read from a canvas made for reading (reading the page's own
# canvas more than once makes Chromium warn in the console).
_PIXELS = """sel => { const src = document.querySelector(sel), c = document.createElement('canvas');
  c.width = src.width; c.height = src.height;
  const ctx = c.getContext('2d', {willReadFrequently: true}); ctx.drawImage(src, 0, 0);
  return ctx.getImageData(0, 0, c.width, c.height); }"""


def painted_pixels(page: Any, selector: str) -> int:
    """Pixels of a canvas that are not transparent."""
    n: int = page.evaluate(
        f"""sel => {{ const d = ({_PIXELS})(sel).data;
             let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }}""",
        selector,
    )
    return n


def pixel(page: Any, selector: str, x: int, y: int) -> list[int]:
    """The RGBA of a canvas's pixel (x, y) (device pixels; negative: from the far edge)."""
    rgba: list[int] = page.evaluate(
        f"""([sel, x, y]) => {{ const im = ({_PIXELS})(sel);
             const px = x < 0 ? im.width + x : x, py = y < 0 ? im.height + y : y;
             const k = 4 * (py * im.width + px); return [...im.data.slice(k, k + 4)]; }}""",
        [selector, x, y],
    )
    return rgba


def contrast(a: list[int], b: list[int]) -> float:
    """WCAG contrast ratio of two RGB colours (1 to 21; 4.5 reads as body text)."""

    def luminance(rgb: list[int]) -> float:
        def channel(c: int) -> float:
            v = c / 255
            return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

        r, g, b_ = (channel(c) for c in rgb[:3])
        return 0.2126 * r + 0.7152 * g + 0.0722 * b_

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


# ------------------------------------------------------------- session fixtures

# tests/conftest.py imports these, so every browser suite of a test session shares one
# Chromium and one JupyterLab (server, page and kernel).


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the session (the system's; no browser download)."""
    require_browser_stack()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_executable(), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """The session's one JupyterLab server (see :func:`jupyterlab_server`)."""
    require_browser_stack()
    root = tmp_path_factory.mktemp("lab") / "root"
    root.mkdir()
    with jupyterlab_server(root) as server:
        yield server


@pytest.fixture(scope="session")
def jupyterlab(
    tmp_path_factory: pytest.TempPathFactory, chromium: Any, lab_server: LabServer
) -> Iterator[LabSession]:
    """JupyterLab with the session notebook run (see :func:`lab_session`)."""
    shots = tmp_path_factory.mktemp("screenshots")
    with lab_session(lab_server, chromium, shots) as s:
        yield s
