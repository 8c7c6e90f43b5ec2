"""The dashboards' definitions, their committed Grafana JSON, and `thaw monitoring write`.
(Each query is run against a real Prometheus scraping a stack in tests/test_e2e_batch.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from activator.metrics import ActivatorMetrics
from thaw.dashboards import DASHBOARDS, dashboard_json, queries
from warm_pool.metrics import PoolMetrics

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "deploy" / "grafana" / "dashboards"


def test_the_committed_dashboards_are_the_definitions() -> None:
    """deploy/grafana/dashboards/ is written by thaw.dashboards.write_dashboards; edit the
    definitions and write them again (python -c 'from thaw.dashboards import ...')."""
    assert sorted(p.name for p in COMMITTED.glob("*.json")) == sorted(f"{d.uid}.json" for d in DASHBOARDS)
    for d in DASHBOARDS:
        assert json.loads((COMMITTED / f"{d.uid}.json").read_text()) == dashboard_json(d), (
            f"{d.uid}.json is out of date: run thaw.dashboards.write_dashboards(Path('deploy/grafana/dashboards'))")


def test_every_panel_has_a_query_and_a_place_of_its_own() -> None:
    for d in DASHBOARDS:
        model = dashboard_json(d)
        ids = [p["id"] for p in model["panels"]]
        assert len(ids) == len(set(ids)) and all(p["targets"] for p in model["panels"])
        places = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in model["panels"]}
        assert len(places) == len(ids)
        assert all(t["datasource"]["uid"] == "${datasource}" for p in model["panels"] for t in p["targets"])


def exported_names() -> set[str]:
    """The names Prometheus sees: a counter's with ``_total``, a histogram's series."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = set()
    for make in (ActivatorMetrics, PoolMetrics):  # each service's registry
        registry = CollectorRegistry()
        make(registry)
        for family in registry.collect():
            names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    # Gauges collected per model from the policy's state (none until a tick has run).
    from warm_pool.metrics import MODEL_GAUGES

    return names | set(MODEL_GAUGES)


# The GenAI conventions' attributes, as Prometheus labels (not metrics).
GENAI_LABELS = {"gen_ai_operation_name", "gen_ai_request_model", "gen_ai_token_type"}


def test_every_metric_a_panel_reads_is_one_thaw_exports() -> None:
    names = exported_names()
    for d in DASHBOARDS:
        for title, expr in queries(d):
            for metric in set(re.findall(r"\b((?:thaw|gen_ai)_[a-z0-9_]+)", expr)) - GENAI_LABELS:
                assert metric in names, f"{d.uid}: {title}: {metric}"


def test_monitoring_write_makes_a_prometheus_config_and_grafana_provisioning(tmp_path: Path) -> None:
    cfg = tmp_path / "thaw.yaml"
    data = yaml.safe_load((ROOT / "examples" / "thaw.yaml").read_text())
    data["data_dir"] = str(tmp_path / "data")
    cfg.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "thaw.cli.main", "monitoring", "write", "--config", str(cfg),
                          "--out-dir", str(tmp_path / "mon"), "--activator", "http://10.0.0.1:8000,http://10.0.0.2:8000",
                          "--token-file", str(tmp_path / "token")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    prom = yaml.safe_load((tmp_path / "mon" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["thaw-activator"]["static_configs"] == [{"targets": ["10.0.0.1:8000", "10.0.0.2:8000"]}]
    assert jobs["thaw-controller"]["static_configs"] == [{"targets": ["127.0.0.1:8100"]}]  # the config's
    assert all(j["authorization"]["credentials_file"] == str(tmp_path / "token") for j in jobs.values())
    assert "does not exist yet" in out.stderr  # the token file: said, not silently missing
    dashboards = sorted(p.name for p in (tmp_path / "mon" / "grafana" / "dashboards").glob("*.json"))
    assert dashboards == sorted(p.name for p in COMMITTED.glob("*.json"))
    provider = yaml.safe_load((tmp_path / "mon" / "grafana" / "provisioning" / "dashboards" / "thaw.yaml").read_text())
    assert Path(provider["providers"][0]["options"]["path"]).is_dir()
    source = yaml.safe_load((tmp_path / "mon" / "grafana" / "provisioning" / "datasources" / "thaw.yaml").read_text())
    assert source["datasources"][0]["url"] == "http://127.0.0.1:9090"
    # --json: what it wrote, as one document.
    again = subprocess.run([sys.executable, "-m", "thaw.cli.main", "monitoring", "write", "--config", str(cfg),
                            "--out-dir", str(tmp_path / "mon"), "--json"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    wrote = json.loads(again.stdout)
    assert wrote["prometheus_config"] == str(tmp_path / "mon" / "prometheus.yml") and len(wrote["wrote"]) > 5
