"""Panel builders shared by hopline's dashboards (grafana-foundation-sdk, Grafana 11.6 build).

Conventions every panel follows, so the dashboards read alike:

* every query has a datasource (the ``$datasource`` variable) and a refId (A, B, ... in order);
* latency panels are in seconds (unit ``s``; Grafana prints "350 ms") with exemplars on every
  query: exemplar values are raw seconds, so scaling a query to ms would put the markers at the
  wrong height. Exemplars exist on bucket series only, so quantile and heatmap queries show them;
* quantiles are never stacked; stacked panels show means (rate(sum) / rate(count)).
"""

from __future__ import annotations

from collections.abc import Sequence
from string import ascii_uppercase

from grafana_foundation_sdk.builders import heatmap, stat, table, timeseries
from grafana_foundation_sdk.builders.common import (
    ReduceDataOptions,
    StackingConfig,
    VizLegendOptions,
    VizTooltipOptions,
)
from grafana_foundation_sdk.builders.dashboard import ThresholdsConfig
from grafana_foundation_sdk.builders.heatmap import (
    HeatmapColorOptions,
    RowsHeatmapOptions,
    YAxisConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.models.common import (
    BigValueGraphMode,
    HeatmapCellLayout,
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    StackingMode,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    Threshold,
    ThresholdsMode,
)
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode, HeatmapColorScale
from grafana_foundation_sdk.models.prometheus import PromQueryFormat, QueryEditorMode

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
SECONDS = "s"

Targets = Sequence[tuple[str, str]]  # (PromQL, legend format)


def query(
    expr: str,
    legend: str,
    ref: str,
    *,
    exemplar: bool = False,
    heatmap_format: bool = False,
    instant: bool = False,
) -> Dataquery:
    q = (
        Dataquery()
        .expr(expr)
        .legend_format(legend)
        .ref_id(ref)
        .datasource(DATASOURCE)
        .editor_mode(QueryEditorMode.CODE)
        .exemplar(exemplar)
    )
    q = q.instant() if instant else q.range()
    return q.format(PromQueryFormat.HEATMAP) if heatmap_format else q


def _legend() -> VizLegendOptions:
    return (
        VizLegendOptions()
        .show_legend(True)
        .display_mode(LegendDisplayMode.TABLE)
        .placement(LegendPlacement.BOTTOM)
        .calcs(["mean", "max", "lastNotNull"])
    )


def _tooltip() -> VizTooltipOptions:
    return VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)


def graph(
    title: str,
    description: str,
    unit: str,
    targets: Targets,
    *,
    stacked: bool = False,
    exemplar: bool = False,
) -> timeseries.Panel:
    """A time series panel; ``stacked`` is for counts and means only, never quantiles."""
    if len(targets) > len(ascii_uppercase):
        raise ValueError(f"{title}: more than {len(ascii_uppercase)} queries")
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .min(0)
        .legend(_legend())
        .tooltip(_tooltip())
        .line_width(1)
        .fill_opacity(50 if stacked else 10)
    )
    if stacked:
        panel = panel.stacking(StackingConfig().mode(StackingMode.NORMAL).group("A"))
    for ref, (expr, legend) in zip(ascii_uppercase, targets, strict=False):
        panel = panel.with_target(query(expr, legend, ref, exemplar=exemplar))
    return panel


def latency(title: str, description: str, targets: Targets) -> timeseries.Panel:
    """Seconds, exemplars on every query, quantiles side by side."""
    return graph(title, description, SECONDS, targets, exemplar=True)


def stacked_means(
    title: str, description: str, terms: Targets, total: tuple[str, str], *, colours: Sequence[str] = ()
) -> timeseries.Panel:
    """``terms`` stacked (means that add up), ``total`` drawn as a dashed unstacked line over them;
    ``colours`` (hex, one per term) fix each term's colour."""
    panel = graph(title, description, SECONDS, [*terms, total], stacked=True, exemplar=True)
    for ref, colour in zip(ascii_uppercase, colours, strict=False):
        panel = panel.override_by_query(
            ref, [DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": colour})]
        )
    total_ref = ascii_uppercase[len(terms)]
    return panel.override_by_query(
        total_ref,
        [
            DynamicConfigValue(
                id_val="custom.stacking", value={"mode": StackingMode.NONE.value, "group": "A"}
            ),
            DynamicConfigValue(id_val="custom.fillOpacity", value=0),
            DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
            DynamicConfigValue(id_val="custom.lineWidth", value=2),
            DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": "text"}),
        ],
    )


def bucket_heatmap(title: str, description: str, expr: str) -> heatmap.Panel:
    """Prometheus buckets over time (already bucketed: no calculation), y axis in seconds."""
    return (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(query(expr, "{{le}}", "A", exemplar=True, heatmap_format=True))
        .calculate(False)
        .rows_frame(RowsHeatmapOptions().layout(HeatmapCellLayout.LE))
        .y_axis(YAxisConfig().unit(SECONDS))
        .color(
            HeatmapColorOptions()
            .mode(HeatmapColorMode.SCHEME)
            .scheme("Spectral")
            .scale(HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
        )
        .mode(TooltipDisplayMode.SINGLE)
        .show_y_histogram()
        .exemplars_color("rgba(255,0,255,0.7)")
        .show_legend()
    )


def single_stat(
    title: str,
    description: str,
    unit: str,
    expr: str,
    *,
    red_above: float | None = None,
    exemplar: bool = False,
) -> stat.Panel:
    steps = [Threshold(value=None, color="green")]
    if red_above is not None:
        steps.append(Threshold(value=red_above, color="red"))
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .with_target(query(expr, title, "A", exemplar=exemplar))
        .graph_mode(BigValueGraphMode.AREA)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps))
    )


def instant_table(title: str, description: str, expr: str, value_name: str, hidden: Sequence[str]) -> table.Panel:
    """A table of the series ``expr`` returns now (one row each, their labels as columns), its
    value renamed ``value_name``; ``hidden`` columns left out (``Time``, ``__name__``…)."""
    organize = DataTransformerConfig(
        id_val="organize",
        options={"excludeByName": {name: True for name in hidden}, "renameByName": {"Value": value_name}},
    )
    return (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .no_value("no finding firing")
        .with_target(query(expr, "", "A", instant=True).format(PromQueryFormat.TABLE))
        .with_transformation(organize)
    )
