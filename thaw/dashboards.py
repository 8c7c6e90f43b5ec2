"""Thaw's Grafana dashboards and the monitoring set-up that serves them.

Each dashboard is a list of panels, each a PromQL query over the activators' and the
controllers' ``/metrics`` (docs/guide/monitoring.md, "Dashboards"). They are written as
Grafana JSON by :func:`dashboard_json`, into ``deploy/grafana/dashboards/`` (kept in
the repository; ``tests/thaw/test_dashboards.py`` fails when they differ from these
definitions), and with a Prometheus scrape config and Grafana's provisioning files by
`thaw monitoring write` (:func:`write_monitoring`).

Queries use Grafana's ``$__rate_interval`` for rates; a panel of an event that may
not have happened (an eviction, a refusal) adds ``or vector(0)``, so that none is a
zero rather than an empty panel.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Panel:
    title: str
    # One query per series group: (PromQL, legend).
    queries: tuple[tuple[str, str], ...]
    unit: str = "short"
    kind: Literal["timeseries", "stat"] = "timeseries"
    description: str = ""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def _q(expr: str, legend: str = "") -> tuple[str, str]:
    return (expr, legend)


def _quantiles(metric: str, by: str, match: str = "") -> tuple[tuple[str, str], ...]:
    sel = f"{{{match}}}" if match else ""
    return tuple(_q(f"histogram_quantile({q}, sum by (le{', ' + by if by else ''}) "
                    f"(rate({metric}_bucket{sel}[{RATE}])))", f"p{int(q * 100)}" + (f" {{{{{by}}}}}" if by else ""))
                 for q in (0.5, 0.99))


OVERVIEW = Dashboard("thaw-overview", "Thaw: fleet overview", "Requests, errors, latency and tokens across the "
                     "activators; replicas by state.", (
    Panel("Requests per second, by status", (_q(f"sum by (status) (rate(thaw_requests_total[{RATE}]))", "{{status}}"),),
          "reqps"),
    Panel("Error ratio (4xx and 5xx)", (_q(f'(sum(rate(thaw_requests_total{{status=~"[45].."}}[{RATE}])) or vector(0))'
                                        f" / sum(rate(thaw_requests_total[{RATE}]))", "errors"),), "percentunit"),
    Panel("Time to first token, hot", _quantiles("thaw_ttft_seconds", "", 'start="hot"'), "s"),
    Panel("Time to first token, cold (held for a start)", _quantiles("thaw_ttft_seconds", "", 'start="cold"'), "s",
          description="From arrival: the whole cold start is in it."),
    Panel("Request duration p99 by model (GenAI conventions)",
          (_q(f"histogram_quantile(0.99, sum by (le, gen_ai_request_model) "
              f"(rate(gen_ai_server_request_duration_seconds_bucket[{RATE}])))", "{{gen_ai_request_model}}"),), "s"),
    Panel("Tokens per second, input and output",
          (_q(f"sum by (gen_ai_token_type) (rate(gen_ai_client_token_usage_sum[{RATE}]))", "{{gen_ai_token_type}}"),),
          "short"),
    Panel("Replicas by state", (_q("sum by (state) (thaw_replicas)", "{{state}}"),), "short"),
))

COLD_STARTS = Dashboard("thaw-cold-starts", "Thaw: scale from zero", "Cold starts by tier, the requests they hold "
                        "and where their time goes.", (
    Panel("Cold starts by tier (per 5 min)", (_q("sum by (tier) (increase(thaw_cold_starts_total[5m]))", "{{tier}}"),),
          "short"),
    Panel("Time to first token of cold starts, by tier",
          _quantiles("thaw_cold_start_seconds", "tier", 'phase="total"'), "s"),
    Panel("Mean time in each phase", (_q(
        f'sum by (phase) (rate(thaw_cold_start_seconds_sum{{phase!="total"}}[{RATE}])) / '
        f'sum by (phase) (rate(thaw_cold_start_seconds_count{{phase!="total"}}[{RATE}]))', "{{phase}}"),), "s",
          description="Request to first token, split at the worker's milestones (docs/REQUEST_PATH.md)."),
    Panel("Requests held for a cold start, by model", (_q("sum by (model) (thaw_queue_depth)", "{{model}}"),),
          "short"),
    Panel("Their wait in the queue (p50, p99)", _quantiles("thaw_cold_start_seconds", "", 'phase="queued"'), "s"),
    Panel("Models backing off after a failed start", (_q("sum by (model) (thaw_model_backoff_seconds > 0) "
                                                         "or vector(0)", "{{model}}"),), "s"),
))

POOL = Dashboard("thaw-pool", "Thaw: the warm pool", "Workers by state, the standby band against its target, "
                 "spend against the budget, keep-alive windows and evictions.", (
    Panel("Workers by shape and state", (_q("sum by (shape, state) (thaw_pool_workers)", "{{shape}} {{state}}"),),
          "short"),
    Panel("Standby: actual, target and band", (
        _q('sum by (shape) (thaw_pool_workers{state="standby"})', "{{shape}} standing by"),
        _q('thaw_pool_standby_target{value=~"target|lower_watermark|upper_watermark|granted"}',
           "{{shape}} {{value}}")), "short"),
    Panel("Spend against the budget (USD per hour)", (
        _q("sum by (shape) (thaw_pool_spend_usd_per_hour)", "{{shape}} spend"),
        _q("thaw_pool_budget_usd_per_hour", "{{shape}} budget")), "currencyUSD"),
    Panel("Standby instances the budget did not grant", (_q("thaw_pool_budget_shortfall_instances", "{{shape}}"),),
          "short"),
    Panel("Keep-alive window by model (kept until, from the idle start)",
          (_q('thaw_keepalive_window_seconds{edge="keep_until"}', "{{model}}"),), "s"),
    Panel("Decisions by kind and reason (per 5 min)", (_q(
        "sum by (kind, reason) (increase(thaw_pool_decisions_total[5m]))", "{{kind}} {{reason}}"),), "short"),
    Panel("Evictions (per 5 min)", (_q('sum(increase(thaw_pool_decisions_total{kind="release",reason="evicted"}[5m])) or vector(0)',
                                       "evictions"),), "short"),
    Panel("Standby time idle and lent to batch", (
        _q(f"sum by (shape, use) (rate(thaw_pool_standby_seconds_total[{RATE}]))", "{{shape}} {{use}}"),), "short"),
))

TENANTS = Dashboard("thaw-tenants", "Thaw: tenants", "Each tenant's requests, tokens and the limits it hits.", (
    Panel("Requests per second by tenant", (_q(f"sum by (tenant) (rate(thaw_tenant_requests_total[{RATE}]))",
                                               "{{tenant}}"),), "reqps"),
    Panel("Tokens per second by tenant", (_q(f"sum by (tenant, type) (rate(thaw_tenant_tokens_total[{RATE}]))",
                                             "{{tenant}} {{type}}"),), "short"),
    Panel("Limits hit (per 5 min)", (_q(
        'sum by (tenant, outcome) (increase(thaw_tenant_requests_total{outcome=~"rate_limit_.*|tokens_exceeded|'
        'concurrency_limit_exceeded"}[5m])) or vector(0)', "{{tenant}} {{outcome}}"),), "short"),
    Panel("Refusals by outcome (per 5 min)", (_q(
        'sum by (outcome) (increase(thaw_tenant_requests_total{outcome!="ok"}[5m])) or vector(0)', "{{outcome}}"),),
          "short"),
))

BATCH = Dashboard("thaw-batch", "Thaw: batch and conversations", "Batches and their lines, the room they run in, "
                  "and the Responses API's traffic.", (
    Panel("Batches by status", (_q("sum by (status) (thaw_batches)", "{{status}}"),), "short"),
    Panel("Lines not yet ended, by state", (_q("sum by (state) (thaw_batch_lines) or vector(0)", "{{state}}"),),
          "short"),
    Panel("Lines run at the activators, by outcome (per 5 min)",
          (_q("sum by (outcome) (increase(thaw_batch_lines_total[5m])) or vector(0)", "{{outcome}}"),), "short"),
    Panel("Batch requests running now", (_q("sum(thaw_batch_running) or vector(0)", "running"),), "short"),
    Panel("Chat requests per second (completions and conversation turns)", (_q(
        f'sum by (gen_ai_request_model) (rate(gen_ai_server_request_duration_seconds_count'
        f'{{gen_ai_operation_name="chat"}}[{RATE}]))', "{{gen_ai_request_model}}"),), "reqps"),
))

DASHBOARDS = (OVERVIEW, COLD_STARTS, POOL, TENANTS, BATCH)


def dashboard_json(d: Dashboard) -> dict[str, Any]:
    """Grafana's JSON model of ``d``: two panels a row, a Prometheus data source chosen
    by the ``datasource`` variable."""
    panels = []
    for i, p in enumerate(d.panels):
        panels.append({
            "id": i + 1, "type": p.kind, "title": p.title, "description": p.description, "datasource": DATASOURCE,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
            "targets": [{"refId": chr(ord("A") + j), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
                        for j, (expr, legend) in enumerate(p.queries)],
        })
    return {
        "uid": d.uid, "title": d.title, "description": d.description, "tags": ["thaw"], "editable": True,
        "schemaVersion": 39, "version": 1, "refresh": "30s", "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": panels,
    }


def queries(d: Dashboard) -> list[tuple[str, str]]:
    """Every (panel title, query) of ``d``."""
    return [(p.title, expr) for p in d.panels for expr, _ in p.queries]


GRAFANA_DATASOURCE = """apiVersion: 1
datasources:
  - name: Prometheus
    type: prometheus
    access: proxy
    url: {prometheus_url}
    isDefault: true
"""

GRAFANA_DASHBOARDS = """apiVersion: 1
providers:
  - name: thaw
    folder: Thaw
    type: file
    options:
      path: {dashboards}
"""


def prometheus_config(activators: list[str], controllers: list[str], token_file: Path,
                      interval_s: float = 15.0) -> str:
    """A Prometheus config that scrapes the activators and the controllers (their
    ``/metrics`` answer the cluster token only: read from ``token_file``)."""
    def job(name: str, urls: list[str]) -> dict[str, Any]:
        scheme = urls[0].split("://", 1)[0] if urls else "http"
        return {"job_name": name, "scheme": scheme, "metrics_path": "/metrics",
                "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                "static_configs": [{"targets": [u.split("://", 1)[-1].rstrip("/") for u in urls]}]}

    cfg = {"global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
           "scrape_configs": [job("thaw-activator", activators), job("thaw-controller", controllers)]}
    return json.dumps(cfg, indent=2) + "\n"  # JSON is YAML


def write_dashboards(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for d in DASHBOARDS:
        path = out / f"{d.uid}.json"
        path.write_text(json.dumps(dashboard_json(d), indent=2) + "\n")
        written.append(path)
    return written


def write_monitoring(out: Path, activators: list[str], controllers: list[str], token_file: Path,
                     prometheus_url: str, interval_s: float = 15.0) -> list[Path]:
    """Everything `thaw monitoring write` makes: ``prometheus.yml``, and for Grafana the
    dashboards and its provisioning (point ``GF_PATHS_PROVISIONING`` at
    ``out/grafana/provisioning``)."""
    written = write_dashboards(out / "grafana" / "dashboards")
    prov = out / "grafana" / "provisioning"
    (prov / "datasources").mkdir(parents=True, exist_ok=True)
    (prov / "dashboards").mkdir(parents=True, exist_ok=True)
    files = {
        out / "prometheus.yml": prometheus_config(activators, controllers, token_file, interval_s),
        prov / "datasources" / "thaw.yaml": GRAFANA_DATASOURCE.format(prometheus_url=prometheus_url),
        prov / "dashboards" / "thaw.yaml": GRAFANA_DASHBOARDS.format(dashboards=(out / "grafana" / "dashboards")
                                                                    .resolve()),
    }
    for path, text in files.items():
        path.write_text(text)
        written.append(path)
    return written
