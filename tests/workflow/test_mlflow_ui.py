"""The MLflow UI on the smoke DAG's store, through a real headless browser (Debian's chromium).

``mlflow server`` runs on a free loopback port against the store the smoke DAG wrote (as
test_dag.py's test_mlflow_server_lists_every_run starts it); selenium drives /usr/bin/chromium
through /usr/bin/chromedriver (no driver download) and reads what the React app rendered: the runs
list, a StateLoop run's train/loss chart, one of its artifacts, and the compare view of StateLoop
and Vanilla that docs/usage.md's screenshot shows (scripts/mlflow-screenshot.py, whose helpers this
test uses). ``bash scripts/install-browser.sh`` installs the browser and selenium. On a failure
the page's screenshot is saved and its path is in the message.
"""

import importlib.util
import json
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from support.dag import ROOT
from support.rehearsals import mlflow_server

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
_INSTALL = "run `bash scripts/install-browser.sh`"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no {CHROMIUM} (Debian's chromium): {_INSTALL}"),
    pytest.mark.skipif(not CHROMEDRIVER.exists(), reason=f"no {CHROMEDRIVER} (chromium-driver): {_INSTALL}"),
]
pytest.importorskip("selenium", reason=f"selenium is not installed: {_INSTALL}")

_spec = importlib.util.spec_from_file_location("mlflow_screenshot", ROOT / "scripts" / "mlflow-screenshot.py")
shot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shot)

WAIT = 300  # seconds a page may take to render (the first one loads the app's bundles): a hang guard for a loaded machine


class UI:
    """The server's base URL, its runs (REST), the browser, and where failures leave screenshots."""

    def __init__(self, base, driver, root, shots):
        self.base, self.driver, self.root, self.shots = base, driver, root, shots
        self.runs = {r["name"]: r for r in shot.all_runs(base)}

    def open(self, fragment: str, height: int = 1000) -> None:
        self.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                    {"width": 1600, "height": height, "deviceScaleFactor": 1, "mobile": False})
        self.driver.get(f"{self.base}/#/{fragment}")

    def wait(self, predicate, what: str, timeout: float = WAIT):
        try:
            return shot.wait_for(self.driver, predicate, timeout, what)
        except TimeoutError as e:
            png = self.shots / f"{len(list(self.shots.glob('*.png')))}.png"
            self.driver.save_screenshot(str(png))
            text = self.driver.find_element("tag name", "body").text
            pytest.fail(f"{e} at {self.driver.current_url}\nscreenshot: {png}\npage text:\n{text[:3000]}")

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        q = urllib.parse.urlencode({"run_id": run_id, "metric_key": key, "max_results": 25000})
        with urllib.request.urlopen(f"{self.base}/api/2.0/mlflow/metrics/get-history?{q}", timeout=30) as r:
            return sorted((int(m["step"]), float(m["value"])) for m in json.load(r).get("metrics", []))


@pytest.fixture(scope="module")
def ui(smoke_dag, tmp_path_factory):
    driver = shot.browser(1600, 1000)  # starts before the server: it needs none yet
    try:
        with mlflow_server(smoke_dag) as base:
            shot.quiet_ui(driver, base)
            yield UI(base, driver, smoke_dag, tmp_path_factory.mktemp("mlflow-ui-screenshots"))
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def pair(ui):
    """The runs docs/usage.md's screenshot compares: StateLoop and Vanilla at the largest K, one seed."""
    return [ui.runs[n] for n in shot.default_pair(sorted(ui.runs))]


def _matches_history(trace: dict, history: list[tuple[int, float]]) -> bool:
    return (len(trace["x"]) == len(history) and [int(x) for x in trace["x"]] == [s for s, _ in history]
            and all(abs(y - v) <= 1e-9 * max(1.0, abs(v)) for y, (_, v) in zip(trace["y"], history)))


def test_runs_list_shows_every_run(ui):
    """The experiment's runs table lists every run of the store (each training run of the smoke DAG
    and its report run), each name a link to that run's page."""
    expected = {str(p.relative_to(ui.root / "results/runs")) for p in (ui.root / "results/runs").glob("*/*/*")}
    assert expected <= set(ui.runs), sorted(expected - set(ui.runs))
    assert any("/stateloop/" in n for n in expected) and any("/vanilla_looped/" in n for n in expected)
    for exp in sorted({r["experiment_id"] for r in ui.runs.values()}):
        want = {r["run_id"]: n for n, r in ui.runs.items() if r["experiment_id"] == exp}
        # a page tall enough for every row: the table renders only the rows in view
        ui.open(f"experiments/{exp}/runs?workflowType=machine_learning", height=600 + 60 * len(want))

        def listed(d, want=want):
            links = d.execute_script("return Array.from(document.querySelectorAll('a[href*=\"/runs/\"]'))"
                                     ".map(a => [a.getAttribute('href'), a.textContent.trim()])")
            shown = {href.rstrip("/").split("/runs/")[-1].split("/")[0].split("?")[0]: text for href, text in links}
            return shown if all(shown.get(i) == n for i, n in want.items()) else None

        shown = ui.wait(listed, f"the {len(want)} runs of experiment {exp} as links to their pages")
        assert {shown[i] for i in want} == set(want.values())


def test_run_page_draws_train_loss(ui, pair):
    """A StateLoop run's 'Model metrics' tab, filtered to train/loss, draws the run's logged values."""
    run = pair[0]
    history = ui.history(run["run_id"], "train/loss")
    assert len(history) >= 2, history
    ui.open(f"experiments/{run['experiment_id']}/runs/{run['run_id']}/model-metrics?workflowType=machine_learning")
    box = ui.wait(lambda d: d.find_elements("css selector", "input[placeholder='Search metric charts']"),
                  "the run page's metric search box")[0]
    box.send_keys("train/loss")

    def chart(d):
        traces = [t for t in d.execute_script(shot.PLOT_TRACES_JS)
                  if t["name"] == run["name"] and "(train/loss)" in t["card"] and t["points"] >= 2]
        return traces or None

    traces = ui.wait(chart, f"the train/loss chart of {run['name']}")
    assert any(_matches_history(t, history) for t in traces), (traces, history)


def _artifact(ui, run) -> tuple[str, str]:
    """A text artifact of RUN (eval/eval.json when it has one): its path and its text, read from the
    artifact folder itself when the store keeps it on disk (else from the server's REST API)."""
    def files(path=""):
        q = urllib.parse.urlencode({"run_id": run["run_id"], **({"path": path} if path else {})})
        with urllib.request.urlopen(f"{ui.base}/api/2.0/mlflow/artifacts/list?{q}", timeout=30) as r:
            for f in json.load(r).get("files", []):
                yield from (files(f["path"]) if f["is_dir"] else [f["path"]])

    texts = [p for p in files() if p.endswith((".json", ".yaml", ".yml", ".md", ".csv", ".txt"))]
    assert texts, f"{run['name']} has no text artifact"
    path = "eval/eval.json" if "eval/eval.json" in texts else sorted(texts)[0]
    with urllib.request.urlopen(f"{ui.base}/api/2.0/mlflow/runs/get?run_id={run['run_id']}", timeout=30) as r:
        uri = json.load(r)["run"]["info"]["artifact_uri"]
    if uri.startswith("file://"):
        return path, (Path(urllib.parse.unquote(urllib.parse.urlparse(uri).path)) / path).read_text()
    q = urllib.parse.urlencode({"run_uuid": run["run_id"], "path": path})
    with urllib.request.urlopen(f"{ui.base}/get-artifact?{q}", timeout=30) as r:
        return path, r.read().decode()


def test_artifact_renders(ui, pair):
    """The run's artifact page shows the file's whole text."""
    run = pair[0]
    path, text = _artifact(ui, run)
    ui.open(f"experiments/{run['experiment_id']}/runs/{run['run_id']}/artifacts/{path}?workflowType=machine_learning")
    if path.endswith(".json"):
        same = lambda shown: _json_or_none(shown) == json.loads(text)  # noqa: E731
    else:
        same = lambda shown: shown.split() == text.split()  # noqa: E731

    def viewer_shows_file(d):
        return [t for t in d.execute_script("return Array.from(document.querySelectorAll('pre, code'))"
                                            ".map(e => e.textContent)") if same(t)] or None

    ui.wait(viewer_shows_file, f"{path} of {run['name']}")
    assert path.split("/")[-1] in ui.driver.find_element("tag name", "body").text  # the file tree names it


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def test_compare_view_overlays_stateloop_and_vanilla(ui, pair):
    """The view docs/usage.md's screenshot shows: train/loss of StateLoop and Vanilla in one chart."""
    names = [r["name"] for r in pair]
    assert "/stateloop/" in names[0] and "/vanilla_looped/" in names[1], names
    ui.open(shot.compare_url(ui.base, [r["run_id"] for r in pair], [r["experiment_id"] for r in pair],
                             "train/loss").split("/#/", 1)[1])
    traces = ui.wait(lambda d: shot.drawn(d, names), f"train/loss of {' and '.join(names)} in one chart")
    for r in pair:
        history = ui.history(r["run_id"], "train/loss")
        assert any(t["name"] == r["name"] and _matches_history(t, history) for t in traces), (r["name"], history)
    assert len({t["card"] for t in traces}) == 1  # one chart, both lines
    assert f"Comparing {len(pair)} Runs" in ui.driver.find_element("tag name", "body").text


def _post(ui, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{ui.base}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def _logged_models(ui, exp: str) -> list[dict]:
    return _post(ui, "logged-models/search", {"experiment_ids": [exp], "max_results": 1000}).get("models", [])


def test_models_tab_lists_every_trained_runs_model(ui):
    """The request: "Each trained run logs its final weights as an MLflow model ... so the Models tab
    lists it". Every training run of the smoke DAG has one READY logged model whose source is that
    run, and the experiment's Models tab shows each by name."""
    trained = {str(p.parent.relative_to(ui.root / "results/runs")) for p in (ui.root / "results/runs").glob("*/*/*/train.json")}
    assert trained
    for exp in sorted({ui.runs[n]["experiment_id"] for n in trained}):
        models = _logged_models(ui, exp)
        by_run = {m["info"]["source_run_id"]: m["info"] for m in models}
        mine = {n: ui.runs[n]["run_id"] for n in trained if ui.runs[n]["experiment_id"] == exp}
        assert set(mine.values()) <= set(by_run), sorted(n for n, i in mine.items() if i not in by_run)
        names = {by_run[i]["name"] for i in mine.values()}
        assert all(by_run[i]["status"] == "LOGGED_MODEL_READY" for i in mine.values())
        ui.open(f"experiments/{exp}/models?workflowType=machine_learning", height=600 + 60 * len(names))
        ui.wait(lambda d, names=names: all(n in d.find_element("tag name", "body").text for n in names) or None,
                f"the {len(names)} logged models of experiment {exp}")


def test_runs_table_fills_the_datasets_and_models_columns(ui, pair):
    """The runs table's Datasets column names what each training run read (MLflow dataset inputs:
    ``<scale>/<split>``) and its Models column the run's logged model."""
    run = pair[0]
    with urllib.request.urlopen(f"{ui.base}/api/2.0/mlflow/runs/get?run_id={run['run_id']}", timeout=30) as r:
        got = json.load(r)["run"]
    datasets = {d["dataset"]["name"] for d in got.get("inputs", {}).get("dataset_inputs", [])}
    assert any(n.endswith("/train") for n in datasets), got.get("inputs")
    model = next(m["info"] for m in _logged_models(ui, run["experiment_id"]) if m["info"]["source_run_id"] == run["run_id"])
    ui.open(f"experiments/{run['experiment_id']}/runs?workflowType=machine_learning", height=600 + 60 * len(ui.runs))

    # ag-grid draws one table row as several elements (the pinned run-name column and the scrolled
    # columns), each carrying the row's id (the MLflow run id) in ``row-id``: join them by that id
    def row_text(d):
        rows = d.execute_script(
            "const by = {}; document.querySelectorAll('[role=\"row\"]').forEach(r => {"
            " const k = r.getAttribute('row-id') || r.getAttribute('aria-rowindex') || '';"
            " by[k] = (by[k] || '') + ' ' + r.textContent; }); return by;")
        return [t for t in rows.values() if run["name"] in t] or None

    rows = ui.wait(lambda d: [t for t in (row_text(d) or []) if all(n in t for n in datasets) and model["name"] in t] or None,
                   f"{run['name']}'s row naming its datasets {sorted(datasets)} and its model {model['name']}")
    assert rows
