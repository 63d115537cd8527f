"""Every renderer names and colours stages from the rule book's vocabulary (rules.STAGE_LOOKS):
a renderer whose keys differ from the contract's stages fails here."""

from __future__ import annotations

from hopline.middleware.contract import STAGES, TIME_STAGES, VIEWS
from hopline.middleware.contract.rules import LOOK, STAGE_ORDER, TTFT_PARTS, VIEW_LOOK


def test_vocabulary_names_every_stage_once():
    assert sorted(STAGE_ORDER) == sorted(TIME_STAGES)
    assert tuple(VIEW_LOOK) == VIEWS
    # everything but the phases after the first token (decode, and reasoning within it)
    assert {s.name for s in STAGES if s.kind == "phase"} == {"decode", "reasoning"}
    assert set(TTFT_PARTS) == set(TIME_STAGES) - {"decode", "reasoning"}


def test_terminal_and_html_renderers_cover_exactly_the_stages():
    from hopline.analyzer import html, waterfall

    assert tuple(waterfall.STAGE_COLOURS) == STAGE_ORDER
    assert tuple(html.STAGE_COLOURS) == STAGE_ORDER
    assert tuple(html.VIEW_COLOURS) == VIEWS
    assert {name: html.STAGE_COLOURS[name] for name in STAGE_ORDER} == {n: LOOK[n].colour for n in STAGE_ORDER}


def test_shift_sentences_use_the_vocabulary():
    from hopline.analyzer.findings.shifts import stats, words

    assert set(STAGE_ORDER) <= set(words.STAGE_WORDS)
    assert {n: words.STAGE_WORDS[n] for n in STAGE_ORDER} == {n: LOOK[n].words for n in STAGE_ORDER}
    assert set(stats.SHIFT_STAGES) <= set(STAGE_ORDER)


def test_dashboard_stack_uses_the_vocabulary():
    from hopline.dashboards import lifecycle
    from hopline.dashboards.base import to_json

    model = to_json(lifecycle.build())
    panels = [p for row in model["panels"] for p in [row, *row.get("panels", [])]]
    stack = next(p for p in panels if p.get("title") == "TTFT by stage (means, stacked)")
    legends = [t["legendFormat"] for t in stack["targets"]][: len(TTFT_PARTS)]
    assert legends == [LOOK[name].label for name in TTFT_PARTS]
    colours = {
        o["matcher"]["options"]: o["properties"][0]["value"]["fixedColor"]
        for o in stack["fieldConfig"]["overrides"]
        if o["properties"][0]["id"] == "color" and o["properties"][0]["value"]["fixedColor"] != "text"
    }
    refs = [t["refId"] for t in stack["targets"]]
    assert [colours[ref] for ref in refs[: len(TTFT_PARTS)]] == [LOOK[name].colour for name in TTFT_PARTS]
