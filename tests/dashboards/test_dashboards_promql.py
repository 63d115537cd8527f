"""PromQL is built from metric definitions: a wrong label or series fails the build, not a panel."""

from __future__ import annotations

import pytest

from hopline.collector import metric_names as m
from hopline.dashboards import promql, vllm_metrics


def test_selector_applies_only_the_variables_a_metric_has_labels_for():
    assert promql.selector(m.STAGE_SECONDS, "_bucket", stage="queue") == (
        'hopline_stage_seconds_bucket{stage="queue", service=~"$service", model=~"$model", '
        'replica=~"$replica"}'
    )
    # in flight has no service label: filtering by $service would match nothing once a service is picked
    assert promql.selector(m.IN_FLIGHT) == 'hopline_requests_in_flight{model=~"$model", replica=~"$replica"}'
    assert promql.selector(m.NEGATIVE_STAGES, "_total") == "hopline_negative_stages_total"
    # vLLM spells the model label model_name; the same $model variable filters it
    assert promql.selector(vllm_metrics.TTFT, "_count") == (
        'vllm:time_to_first_token_seconds_count{model_name=~"$model", replica=~"$replica"}'
    )


def test_match_operators_and_quoting():
    assert promql.selector(m.REQUESTS, "_total", variables=False, outcome="!ok") == (
        'hopline_requests_total{outcome!="ok"}'
    )
    assert promql.selector(m.TTFT_SECONDS, "_sum", variables=False, view="~client|engine") == (
        'hopline_ttft_seconds_sum{view=~"client|engine"}'
    )
    assert promql.selector(m.EVENTS, "_total", variables=False, hop='a"b\\c') == (
        'hopline_events_total{hop="a\\"b\\\\c"}'
    )


def test_unknown_labels_and_series_are_refused_when_the_query_is_built():
    with pytest.raises(ValueError, match="has no label stage"):
        promql.selector(m.TTFT_SECONDS, "_bucket", stage="queue")
    with pytest.raises(ValueError, match="has no label view"):
        promql.quantile(0.9, m.STAGE_SECONDS, ("view",))
    with pytest.raises(ValueError, match="is a gauge"):
        promql.selector(m.IN_FLIGHT, "_total")
    with pytest.raises(ValueError, match="is a counter"):
        promql.selector(m.REQUESTS, "_bucket")


def test_means_are_sum_over_count_without_idle_nan():
    assert promql.mean(m.STAGE_SECONDS, ("replica",), window="5m", variables=False, stage="queue") == (
        '(sum by (replica) (rate(hopline_stage_seconds_sum{stage="queue"}[5m]))) / '
        '(sum by (replica) (rate(hopline_stage_seconds_count{stage="queue"}[5m])) > 0)'
    )
    assert promql.quantile(0.99, m.TTFT_SECONDS, ("view",), window="5m", variables=False) == (
        "histogram_quantile(0.99, sum by (le, view) (rate(hopline_ttft_seconds_bucket[5m])))"
    )


def test_substitute_variables_as_grafana_would_and_refuses_unknown_ones():
    expr = 'rate(x{a=~"$service", b=~"${replica}", c=~"${model:regex}"}[$__rate_interval])'
    assert promql.substitute_variables(expr) == 'rate(x{a=~".*", b=~".*", c=~".*"}[1m])'
    with pytest.raises(KeyError, match=r"\$cluster"):
        promql.substitute_variables('x{c=~"$cluster"}')
