"""A private JupyterLab server and a headless Chromium, for the browser tests.

``jupyterlab_server(root)`` starts ``jupyter lab`` on a free port with everything in
``root``'s sibling folders (config, runtime, data, settings, workspaces, IPython), so nothing
of the user's environment is read and nothing is written outside the test's tmp dir. Its
only kernel, ``python3``, is the Python running the tests (``sys.executable``).

``chromium_executable()`` finds the system Chromium that Playwright drives (no browser
download); both fail with how to install what is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
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


# ------------------------------------------------------------- the timeline, as a user drives it

# The timeline's root element carries its view (js/src/widget.ts); these read and place it.
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
    """Until the timeline's canvas has stayed in one place for 200 ms."""
    page.wait_for_function(
        """root => new Promise(done => {
             const at = () => { const r = root.fsdpviz.canvas.getBoundingClientRect();
                                return r.left + ',' + r.top; };
             const first = at();
             setTimeout(() => done(at() === first), 200);
           })""",
        arg=handle,
        timeout=20_000,
    )


def step_through(page: Any, root: Any, order: str) -> list[float]:
    """Walk one whole timeline with the → key in ``order`` ("issue" or "stream"), from
    its first step; the cursor's x after each press."""
    handle = root.element_handle()
    page.evaluate(
        """([root, order]) => { const v = root.fsdpviz; v.setOrder(order); v.player.first(); }""",
        [handle, order],
    )
    n = int(handle.evaluate("root => root.fsdpviz.data.n_steps"))
    root.locator("canvas").first.focus()
    xs = [float(handle.evaluate("root => root.fsdpviz.cursor()"))]
    for _ in range(n - 1):
        page.keyboard.press("ArrowRight")
        xs.append(float(handle.evaluate("root => root.fsdpviz.cursor()")))
    return xs


def choose_theme(page: Any, theme: str, light: bool, *, timeout_ms: float) -> None:
    """Settings → Theme → ``theme`` in JupyterLab's menu, until the page says it is ``light``."""
    page.get_by_role("menuitem", name="Settings", exact=True).click()
    item = ".lm-Menu .lm-Menu-item:has(.lm-Menu-itemLabel:text-is('{}'))"
    page.locator(item.format("Theme")).hover()
    page.locator(item.format(theme)).click()
    page.wait_for_function(
        f"document.body.dataset.jpThemeLight === '{str(light).lower()}'", timeout=timeout_ms
    )


# The exported page's explorer and prefetch graph (js/src/explorer.ts, prefetch.ts): where a
# module's block and a unit's node are on the page, what each view shows.
EXPLORER_VIEW = "document.querySelector('#fv-explorer .fsdpviz-explorer').fsdpviz"
PREFETCH_VIEW = "document.querySelector('#fv-prefetch .fsdpviz-prefetch').fsdpviz"
_BLOCK_AT = f"""name => {{ const v = {EXPLORER_VIEW};
  const s = v.slotOf(v.index.byName.get(name) ?? -1); if (s === null) return null;
  const r = v.canvas.getBoundingClientRect();
  return [r.left + s.x + s.w / 2, r.top + s.y + s.h / 2]; }}"""
_NODE_AT = f"""name => {{ const v = {PREFETCH_VIEW};
  const c = v.nodeCentre(name); if (c === null) return null;
  const r = v.canvas.getBoundingClientRect(); return [r.left + c.x, r.top + c.y]; }}"""


def _hover(page: Any, view: str, locate: str, name: str) -> tuple[float, float]:
    page.locator(f"#{view} canvas").scroll_into_view_if_needed()
    at = page.evaluate(locate, name)
    assert at is not None, f"#{view} does not draw {name!r}"
    page.mouse.move(at[0] - 2, at[1])
    page.mouse.move(*at)
    return at[0], at[1]


def hover_block(page: Any, module: str) -> tuple[float, float]:
    """Move the mouse onto the centre of ``module``'s block in the page's explorer."""
    return _hover(page, "fv-explorer", _BLOCK_AT, module)


def click_block(page: Any, module: str) -> None:
    """Click the centre of ``module``'s block in the page's explorer, as a user does."""
    page.mouse.click(*hover_block(page, module))


def hover_node(page: Any, unit: str) -> tuple[float, float]:
    """Move the mouse onto the centre of ``unit``'s node in the page's prefetch graph."""
    return _hover(page, "fv-prefetch", _NODE_AT, unit)


def click_node(page: Any, unit: str) -> None:
    """Click the centre of ``unit``'s node in the page's prefetch graph."""
    page.mouse.click(*hover_node(page, unit))


def explorer_state(page: Any) -> dict[str, Any]:
    """What the page's explorer shows: the module at the top, the units outlined, the
    modules outlined as the current step's, the labels drawn (with their blocks)."""
    state: dict[str, Any] = page.evaluate(
        f"""() => {{ const v = {EXPLORER_VIEW}, names = v.data.modules.name;
          return {{focus: names[v.focus], current: v.root.dataset.fvCurrentUnit,
                   selected: v.root.dataset.fvSelectedUnit,
                   outlined: v.outlinedModules(), labels: v.drawnLabels(),
                   crumbs: v.crumbs.textContent, span: [v.span.a, v.span.b],
                   width: v.canvas.getBoundingClientRect().width,
                   outer: v.root.getBoundingClientRect().width}}; }}"""
    )
    return state


def prefetch_state(page: Any) -> dict[str, Any]:
    """What the page's prefetch graph shows: the window, the units ringed, the names."""
    state: dict[str, Any] = page.evaluate(
        f"""() => {{ const v = {PREFETCH_VIEW}, u = v.data.units;
          return {{window: [v.win.u0, v.win.u1],
                   current: v.current < 0 ? null : u[v.current],
                   selected: v.selected < 0 ? null : u[v.selected],
                   names: v.names().map(([k, t]) => [t, v.xOf(k)]),
                   upright: v.layout.upright, width: v.canvas.getBoundingClientRect().width,
                   outer: v.root.getBoundingClientRect().width}}; }}"""
    )
    return state


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
