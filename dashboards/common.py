"""Defaults shared by the kvscope dashboards: data source, template variables, panel factories.

Every panel of every dashboard comes out of ``timeseries()``, ``stat()`` or ``table()`` here, so
the look (units, legends, minimums, data source) is decided once.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.builders import stat as statb
from grafana_foundation_sdk.builders import table as tableb
from grafana_foundation_sdk.builders import timeseries as tsb
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from kvscope.exporters import signals as s

from .config import Config
from .rules import eq  # noqa: F401 - one matcher helper for panels and rules

DS_VAR = "datasource"
MODEL_VAR = "model"
ENGINE_VAR = "engine"
RANK_VAR = "rank"

# Substituted for Grafana's built-in and template variables when a panel query is executed
# outside Grafana (the query check against a live Prometheus).
RATE_INTERVAL = "$__rate_interval"

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${" + DS_VAR + "}")


def rsel(*matchers: str, rank: bool = False) -> str:
    """Selector for a recorded series (``rules.Recorded``): template variables + ``matchers``.

    The recording rule applied the config selector already and kept the engine labels
    (and ``rank`` where it aggregates by it), which the variables match.
    """
    parts = [f'{s.VLLM_LABEL_MODEL}=~"${MODEL_VAR}"', f'{s.VLLM_LABEL_ENGINE}=~"${ENGINE_VAR}"']
    if rank:
        parts.append(f'{s.L_RANK}=~"${RANK_VAR}"')
    return "{" + ",".join([*parts, *matchers]) + "}"


def dsel(cfg: Config, *matchers: str, rank: bool = False, vllm: bool = False) -> str:
    """Selector for a dashboard query: config selector + template variables + ``matchers``.

    ``model_name=~"$model"`` with the variable's All value ``.*`` also matches series that have
    no ``model_name`` label at all (the standalone exporter's), so one query serves both paths.
    """
    base = (cfg.vllm_selector or cfg.selector) if vllm else cfg.selector
    parts = [
        base,
        f'{s.VLLM_LABEL_MODEL}=~"${MODEL_VAR}"',
        f'{s.VLLM_LABEL_ENGINE}=~"${ENGINE_VAR}"',
    ]
    if rank:
        parts.append(f'{s.L_RANK}=~"${RANK_VAR}"')
    parts.extend(matchers)
    return "{" + ",".join(p for p in parts if p) + "}"


def re_in(label: str, *values: str) -> str:
    return f'{label}=~"{"|".join(values)}"'


# ---- variables ------------------------------------------------------------------------------
def datasource_variable() -> db.DatasourceVariable:
    return db.DatasourceVariable(DS_VAR).label("Data source").type("prometheus")


def _label_variable(cfg: Config, name: str, label_text: str, metric: str, label: str,
                    description: str) -> db.QueryVariable:
    sel = "{" + cfg.selector + "}" if cfg.selector else ""
    return (
        db.QueryVariable(name)
        .label(label_text)
        .description(description)
        .datasource(DATASOURCE)
        .query(f"label_values({metric}{sel}, {label})")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.NATURAL_ASC)
        .multi(True)
        .include_all(True)
        # ".*" (not Grafana's default list of values) so "All" also matches series without the
        # label: the standalone exporter does not add vLLM's model_name/engine labels.
        .all_value(".*")
        .current(dm.VariableOption(selected=True, text="All", value="$__all"))
    )


def model_variable(cfg: Config) -> db.QueryVariable:
    return _label_variable(
        cfg, MODEL_VAR, "Model", s.SCHEDULER_STEPS.name, s.VLLM_LABEL_MODEL,
        "vLLM's model_name label; empty when only the standalone kvscope exporter is scraped.",
    )


def engine_variable(cfg: Config) -> db.QueryVariable:
    return _label_variable(
        cfg, ENGINE_VAR, "Engine", s.SCHEDULER_STEPS.name, s.VLLM_LABEL_ENGINE,
        "vLLM's engine index (data-parallel engines); empty on the standalone exporter.",
    )


def rank_variable(cfg: Config) -> db.QueryVariable:
    return _label_variable(
        cfg, RANK_VAR, "Rank", s.WORKER_LAST_STEP_TIMESTAMP.name, s.L_RANK,
        "Worker rank (tensor/pipeline parallel); disk-tier transfers use rank=\"manager\".",
    )


def variables(cfg: Config) -> list[db.QueryVariable | db.DatasourceVariable]:
    return [datasource_variable(), model_variable(cfg), engine_variable(cfg), rank_variable(cfg)]


# ---- queries and panels ---------------------------------------------------------------------
def query(expr: str, legend: str = "__auto", ref_id: str = "A") -> pb.Dataquery:
    return (
        pb.Dataquery()
        .expr(expr)
        .legend_format(legend)
        .ref_id(ref_id)
        .datasource(DATASOURCE)
        .range()
    )


def _with_queries(panel, queries: list[tuple[str, str]]):
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(query(expr, legend, ref_id=chr(ord("A") + i)))
    return panel


def p50_p99(bucket: str, by: str) -> list[tuple[str, str]]:
    """The median and 99th percentile of a histogram's ``bucket`` series, one line per value
    of ``by``: (expr, legend) pairs for :func:`timeseries`."""
    return [(f"histogram_quantile({q}, sum by ({by}, le) (rate({bucket}[{RATE_INTERVAL}])))",
             f"p{name} {{{{{by}}}}}") for q, name in ((0.5, "50"), (0.99, "99"))]


def timeseries(title: str, description: str, queries: list[tuple[str, str]], *,
               unit: str = "short", width: int = 12, height: int = 8, min0: bool = True,
               stack: bool = False) -> tsb.Panel:
    """A time series panel; ``queries`` is a list of ``(expr, legend)``."""
    panel = (
        tsb.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .line_width(1)
        .fill_opacity(10)
        .show_points(cm.VisibilityMode.NEVER)
        .legend(
            cb.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.TABLE)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
    )
    if min0:
        panel = panel.min(0)
    if stack:
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
    return _with_queries(panel, queries)


def stat(title: str, description: str, queries: list[tuple[str, str]], *, unit: str = "short",
         width: int = 6, height: int = 4, red_at: float | None = None) -> statb.Panel:
    """A single-value panel; turns red at ``red_at`` when given."""
    panel = (
        statb.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .color_mode(cm.BigValueColorMode.BACKGROUND if red_at is not None else cm.BigValueColorMode.VALUE)
        .graph_mode(cm.BigValueGraphMode.AREA)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    steps = [dm.Threshold(value=None, color="green")]
    if red_at is not None:
        steps.append(dm.Threshold(value=red_at, color="red"))
    panel = panel.thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps))
    return _with_queries(panel, queries)


def table(title: str, description: str, expr: str, *, columns: list[str], width: int = 24,
          height: int = 5) -> tableb.Panel:
    """A table of the label sets of an instant query (one row per series, one column per label).

    ``columns`` are the labels shown, in order; every other field (time, value, other labels)
    is hidden. Meant for ``*_info`` series, whose value is always 1.
    """
    target = (
        pb.Dataquery()
        .expr(expr)
        .ref_id("A")
        .datasource(DATASOURCE)
        .instant()
        .format(pm.PromQueryFormat.TABLE)
        .legend_format("__auto")
    )
    organize = dm.DataTransformerConfig(
        id_val="organize",
        options={
            # only these fields (Grafana >= 10.4): time, value and other labels are hidden
            "includeByName": {c: True for c in columns},
            "indexByName": {c: i for i, c in enumerate(columns)},
            "renameByName": {},
        },
    )
    return (
        tableb.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(height)
        .with_target(target)
        .with_transformation(organize)
    )


def dashboard(cfg: Config, uid: str, title: str, description: str) -> db.Dashboard:
    return (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(list(cfg.dashboard_tags))
        .refresh(cfg.refresh)
        .time(cfg.time_from, "now")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .editable()
        .variables(variables(cfg))
    )


def link_to(title: str, uid: str) -> db.DashboardLink:
    return (
        db.DashboardLink(title)
        .type(dm.DashboardLinkType.LINK)
        .url(f"/d/{uid}")
        .include_vars(True)
        .keep_time(True)
        .icon("dashboard")
    )
