"""PromQL built from metric definitions, never typed by hand.

Every query names a ``Metric`` object (``hopline.collector.metric_names`` or ``vllm_metrics``),
and every label a query filters or groups by is checked against that metric's labels when the
query is built: a renamed metric or label breaks ``hopline dashboards build``, not a panel.

Dashboard variables (``$service``, ``$model``, ``$replica``) are applied to whichever of those
labels a metric carries (vLLM calls the model label ``model_name``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from hopline.collector.metric_names import Metric

RATE_WINDOW = "$__rate_interval"
# dashboard variable -> the label it filters, per label spelling
VARIABLE_OF_LABEL = {"service": "service", "model": "model", "model_name": "model", "replica": "replica"}
VARIABLES = ("service", "model", "replica")
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",), "gauge": ("",)}


def _check_labels(metric: Metric, labels: tuple[str, ...] | list[str] | Mapping[str, str]) -> None:
    unknown = [name for name in labels if name not in metric.labels and name != "le"]
    if unknown:
        raise ValueError(f"{metric.name} has no label {', '.join(unknown)} (labels: {metric.labels})")


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def selector(metric: Metric, suffix: str = "", *, variables: bool = True, **match: str) -> str:
    """``name_suffix{label="value", ..., service=~"$service", ...}``.

    ``match`` values are exact unless they start with ``~`` (a regex) or ``!`` (not equal).
    With ``variables``, each dashboard variable whose label the metric carries is applied.
    """
    if suffix not in _SUFFIXES[metric.kind]:
        raise ValueError(f"{metric.name} is a {metric.kind}; no {suffix!r} series")
    _check_labels(metric, match)
    parts = []
    for label, value in match.items():
        op, value = (
            ({"~": "=~", "!": "!="}[value[0]], value[1:]) if value[:1] in "~!" and value else ("=", value)
        )
        parts.append(f"{label}{op}{_quote(value)}")
    if variables:
        parts += [
            f'{label}=~"${VARIABLE_OF_LABEL[label]}"' for label in metric.labels if label in VARIABLE_OF_LABEL
        ]
    return metric.name + suffix + ("{" + ", ".join(parts) + "}" if parts else "")


def _by(metric: Metric, by: tuple[str, ...]) -> str:
    _check_labels(metric, by)
    return f"sum by ({', '.join(by)}) " if by else "sum"


def rate(
    metric: Metric,
    by: tuple[str, ...] = (),
    *,
    window: str = RATE_WINDOW,
    variables: bool = True,
    **match: str,
) -> str:
    """Per-second rate of a counter (or of a histogram's observations, via ``_count``)."""
    suffix = "_total" if metric.kind == "counter" else "_count"
    return f"{_by(metric, by)}(rate({selector(metric, suffix, variables=variables, **match)}[{window}]))"


def ratio(numerator: str, denominator: str) -> str:
    """``numerator / denominator``, dropping series whose denominator is 0 (idle: no NaN)."""
    return f"({numerator}) / ({denominator} > 0)"


def mean(
    metric: Metric,
    by: tuple[str, ...] = (),
    *,
    window: str = RATE_WINDOW,
    variables: bool = True,
    **match: str,
) -> str:
    """Mean of a histogram: rate(sum) / rate(count)."""
    grouping = _by(metric, by)
    num = f"{grouping}(rate({selector(metric, '_sum', variables=variables, **match)}[{window}]))"
    return ratio(num, rate(metric, by, window=window, variables=variables, **match))


def inverse_mean(metric: Metric, by: tuple[str, ...] = (), **match: str) -> str:
    """1 / mean: observations per unit of the observed quantity (tokens/s from seconds per token)."""
    grouping = _by(metric, by)
    den = f"{grouping}(rate({selector(metric, '_sum', **match)}[{RATE_WINDOW}]))"
    return ratio(rate(metric, by, **match), den)


def quantile(
    q: float,
    metric: Metric,
    by: tuple[str, ...] = (),
    *,
    window: str = RATE_WINDOW,
    variables: bool = True,
    **match: str,
) -> str:
    """``histogram_quantile`` over buckets summed by ``le`` and ``by``."""
    grouping = _by(metric, ("le",) + tuple(by))
    return (
        f"histogram_quantile({q:g}, {grouping}"
        f"(rate({selector(metric, '_bucket', variables=variables, **match)}[{window}])))"
    )


def bucket_increase(metric: Metric, **match: str) -> str:
    """Observations per bucket per step, for a heatmap (format=heatmap orders and de-accumulates)."""
    return f"sum by (le) (increase({selector(metric, '_bucket', **match)}[{RATE_WINDOW}]))"


def gauge(metric: Metric, by: tuple[str, ...] = (), **match: str) -> str:
    return f"{_by(metric, by)}({selector(metric, **match)})"


# --- Grafana variables, for checking expressions outside Grafana ------------------------------

GRAFANA_SAMPLE_VALUES = {
    "__rate_interval": "1m",
    "__interval": "30s",
    "__range": "1h",
    **{name: ".*" for name in VARIABLES},
}
_VARIABLE_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def substitute_variables(expr: str, values: Mapping[str, str] = GRAFANA_SAMPLE_VALUES) -> str:
    """``expr`` as Grafana would send it to Prometheus, with ``values`` for its variables.

    Raises ``KeyError`` naming a variable that ``values`` lacks, so an undefined variable in a
    panel is an error, not a silently broken query.
    """

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for Grafana variable ${name} in {expr!r}")
        return values[name]

    return _VARIABLE_RE.sub(replace, expr)
