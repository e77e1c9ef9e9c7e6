#!/usr/bin/env python
"""A screenshot of MLflow's compare view: a StateLoop run and a Vanilla run, a metric overlaid.

    python scripts/mlflow-screenshot.py [RESULTS] [--out docs/mlflow-compare.png] [--runs A B] [--metric M]

RESULTS is a results folder holding ``mlflow.db`` (default ``results``; a rehearsal's is
``rehearsals/tiny/results``). The script starts ``mlflow server`` on a free loopback port
against that store (or uses ``--url`` of a server already running), opens the compare page
of the two runs' METRIC (``#/metric/<metric>?runs=[...]``, the page MLflow's compare view links
to) in headless Chromium and saves the page as a PNG. Without ``--runs`` it compares
``<scale>/stateloop/K<K>_ds<ds>_seed<s>`` with ``<scale>/vanilla_looped/K<K>_ds0_seed<s>`` at the
largest K (then the smallest seed, the largest d_s) the store has both of.

Needs Debian's chromium and chromium-driver and selenium: ``bash scripts/install-browser.sh``.
Nothing is downloaded: selenium drives /usr/bin/chromedriver, and Chromium runs with its
background networking off (no component updates, no sync, no QUIC).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from stateloop.run_ids import parse_run_id

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--force-device-scale-factor=1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_server(results: Path, timeout: float = 180):
    """``mlflow server`` on a free loopback port against RESULTS/mlflow.db; yields its base URL."""
    db = results / "mlflow.db"
    if not db.is_file():
        raise FileNotFoundError(f"no MLflow store at {db}")
    port = free_port()
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
    env.pop("MLFLOW_TRACKING_URI", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db.resolve()}",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--default-artifact-root", str((results / "mlartifacts").resolve())],
        cwd=results, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.read().decode().strip() == "OK":
                        break
            if server.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"mlflow server did not come up on {base} in {timeout:.0f} s")
            time.sleep(0.5)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def api(base: str, endpoint: str, body: dict) -> dict:
    req = urllib.request.Request(f"{base}/api/2.0/mlflow/{endpoint}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def all_runs(base: str) -> list[dict]:
    """Every run of every experiment: {"name", "run_id", "experiment_id"}."""
    exps = [e["experiment_id"] for e in api(base, "experiments/search", {"max_results": 1000})["experiments"]]
    runs, token = [], None
    while True:
        page = api(base, "runs/search", {"experiment_ids": exps, "max_results": 1000,
                                         **({"page_token": token} if token else {})})
        runs += [{"name": r["info"]["run_name"], "run_id": r["info"]["run_id"],
                  "experiment_id": r["info"]["experiment_id"]} for r in page.get("runs", [])]
        token = page.get("next_page_token")
        if not token:
            return runs


def default_pair(names: list[str]) -> tuple[str, str]:
    """StateLoop vs Vanilla at the largest K both have (then the smallest seed, the largest d_s)."""
    parsed = [p for p in map(parse_run_id, names) if p]  # (scale, model, K, d_s, seed)
    vanilla = {(s, K, seed) for s, m, K, _, seed in parsed if m == "vanilla_looped"}
    pairs = [p for p in parsed if p[1] == "stateloop" and (p[0], p[2], p[4]) in vanilla]
    if not pairs:
        raise LookupError("no StateLoop run with a Vanilla run at the same scale, K and seed: pass --runs")
    scale, _, K, ds, seed = max(pairs, key=lambda p: (p[2], -p[4], p[3]))
    return f"{scale}/stateloop/K{K}_ds{ds}_seed{seed}", f"{scale}/vanilla_looped/K{K}_ds0_seed{seed}"


def compare_url(base: str, run_ids: list[str], experiment_ids: list[str], metric: str) -> str:
    """MLflow 3's metric page of several runs (what the compare view's 'Plot chart' links open)."""
    q = lambda v: urllib.parse.quote(json.dumps(v), safe="")  # noqa: E731
    query = (f"runs={q(run_ids)}&metric={q(metric)}&experiments={q(sorted(set(experiment_ids)))}"
             f"&plot_metric_keys={q([metric])}&plot_layout={q({})}&x_axis=step&y_axis_scale=linear"
             f"&line_smoothness=1&show_point=false&deselected_curves={q([])}&last_linear_y_axis_range={q([])}"
             "&workflowType=machine_learning")  # the sidebar of training runs, not GenAI's
    return f"{base}/#/metric/{urllib.parse.quote(metric, safe='')}?{query}"


def browser(width: int, height: int, chromium: str = CHROMIUM, chromedriver: str = CHROMEDRIVER):
    """Headless Chromium through selenium and the local chromedriver (no Selenium Manager)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    for flag in [*CHROMIUM_FLAGS, f"--window-size={width},{height}", f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    # the page itself WIDTHxHEIGHT (--window-size counts the window's frame too)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    return driver


def quiet_ui(driver, base: str) -> None:
    """Open the UI once and keep MLflow's assistant panel closed on the pages opened next."""
    driver.get(f"{base}/")
    driver.execute_script("localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
                          "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');")


def wait_for(driver, predicate, timeout: float, what: str):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.25).until(predicate)
    except TimeoutException:
        raise TimeoutError(f"{what}: not rendered in {timeout:.0f} s") from None


# The traces of the page's plotly charts: [{name, x, y, points, card}], points: the vertices of
# the SVG line drawn, card: the text of the chart's card (its title, axes and legend, e.g.
# "RUN (train/loss)"). MLflow draws each run twice: its line and, faint, its unsmoothed values.
PLOT_TRACES_JS = """
return Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(plot => {
  const card = plot.closest('[data-testid$="-card"]') || plot.parentElement || plot;
  return (plot.data || []).map((t, i) => {
    const line = plot.querySelectorAll('.scatterlayer .trace')[i];
    const path = line && line.querySelector('path.js-line');
    const d = path ? path.getAttribute('d') || '' : '';
    return {name: String(t.name || ''), x: Array.from(t.x || []), y: Array.from(t.y || []),
            points: (d.match(/[ML]/g) || []).length, card: card.innerText};
  });
});
"""


def drawn(driver, names) -> list[dict] | None:
    """The page's chart traces once each of NAMES has a line drawn (two vertices or more), else None."""
    traces = driver.execute_script(PLOT_TRACES_JS)
    return traces if all(any(t["name"] == n and t["points"] >= 2 for t in traces) for n in names) else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?", default="results", type=Path, help="folder with mlflow.db (default results)")
    ap.add_argument("--out", type=Path, default=Path("docs/mlflow-compare.png"), help="the PNG (default %(default)s)")
    ap.add_argument("--runs", nargs=2, metavar=("RUN_A", "RUN_B"), help="run names (default: StateLoop vs Vanilla)")
    ap.add_argument("--metric", default="train/loss", help="the metric overlaid (default %(default)s)")
    ap.add_argument("--url", help="an MLflow server already running (default: start one on loopback)")
    ap.add_argument("--size", default="1600x700", help="page WIDTHxHEIGHT in pixels (default 1600x700)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds to wait for the chart")
    args = ap.parse_args(argv)
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not Path(exe).exists():
            sys.exit(f"{exe} is missing: bash scripts/install-browser.sh")
    width, height = map(int, args.size.lower().split("x"))

    with (contextlib.nullcontext(args.url.rstrip("/")) if args.url else mlflow_server(args.results)) as base:
        runs = {r["name"]: r for r in all_runs(base)}
        names = args.runs or default_pair(sorted(runs))
        missing = [n for n in names if n not in runs]
        if missing:
            sys.exit(f"no run named {', '.join(missing)} in the store")
        chosen = [runs[n] for n in names]
        driver = browser(width, height)
        try:
            quiet_ui(driver, base)
            driver.get(compare_url(base, [r["run_id"] for r in chosen], [r["experiment_id"] for r in chosen],
                                   args.metric))
            traces = wait_for(driver, lambda d: drawn(d, names), args.timeout,
                              f"the {args.metric} chart of {', '.join(names)}")
            time.sleep(1.0)  # let plotly's transitions settle before the picture
            args.out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(args.out))
        finally:
            driver.quit()
    for name, n in {t["name"]: len(t["y"]) for t in traces}.items():
        print(f"  {name}: {n} points")
    print(f"wrote {args.out} ({' vs '.join(names)}, {args.metric})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, RuntimeError, LookupError) as e:  # TimeoutError and FileNotFoundError are OSErrors
        sys.exit(f"mlflow-screenshot: {e}")
