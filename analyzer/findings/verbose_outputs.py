"""``verbose_outputs``: one caller's answers got longer from a moment on, for requests that
asked for the same max_tokens (the symptom of a chat template or stop tokens that changed: a deploy
that broke the template, a model swapped under the same name), judged against that caller's own
history, never against other callers, and never a change in what the caller asked for.

A caller is a service (and its route, where requests carry one) on a model: services legitimately
answer at different lengths (a chat service's answers twice an agent's), so one caller is only
compared with itself; and within a caller, requests are compared like with like, in groups of
equal requested ``max_tokens`` (requests whose max_tokens is unknown form one group). Each group
of ``min_requests`` or more is judged on its own: a change point of its output length (the split
of its requests in time, at a window boundary, where the mean log length moves most clearly: the
median after is ``verbose_factor`` x the median before) or of its ``finish_reason=length`` share
(up by ``length_jump`` or more: answers now run to the cap). The groups that changed make one
finding for the caller. A caller whose answers got longer because it began to ask for longer ones
(a batch job joining under the same service name with a larger max_tokens: a mix change) has no
group that changed and no finding: its new requests have no history of their own to be longer
than, and ``ignore_eos`` requests that always end at their cap run to it as before. Requests sent
without max_tokens are left to ``no_max_tokens``; a caller that asks a different max_tokens in
nearly every request has no group large enough to be judged.

A reasoning model's answer is its reasoning and its content. Where the engine counts the reasoning
tokens (``reasoning_tokens``, from its usage: vLLM with a reasoning parser, OpenAI) for nearly all
(``known_share``) of a group's requests, the group's reasoning and content lengths are judged apart,
each the same way (the content is ``output_tokens - reasoning_tokens``), and the finding says which
got longer: reasoning alone is the model thinking longer (a reasoning-effort or chat-template change
that makes it think longer), not an answer that ran on. Where the count is unknown the whole output
is judged as one length.

Longer answers take longer to decode: a decode rise of the caller that began with the change and
whose time per output token did not rise is this finding's (``brings_rise_of``, ``brought``), said
with it rather than as a second finding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import polars as pl
from hopline.analyzer.findings.common import columns, requested_mix
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Pitfall, Scope, Shift, iso_utc, pitfall, to_second

CALLER = ("model", "service", "route")
# the lengths judged: the whole output; where the reasoning count is known, its two parts
OUTPUT, REASONING, CONTENT = "output_tokens", "reasoning_tokens", "content_tokens"
UNCHANGED = 1.25  # a part whose p50 moved less than this factor either way is said unchanged


def content_tokens() -> pl.Expr:
    """A request's content tokens: its output tokens less its reasoning tokens, where the engine
    counted them (null where it did not, or where the count exceeds the output: two sources that
    disagree)."""
    reasoning = pl.col(REASONING)
    ok = reasoning.is_not_null() & (reasoning >= 0) & (reasoning <= pl.col(OUTPUT))
    return pl.when(ok).then(pl.col(OUTPUT) - reasoning)


@dataclass(frozen=True)
class VerboseOutputs(Detector):
    name = "verbose_outputs"
    kind = "pitfall"
    needs = ("output_tokens", "service", "model")
    brings_rise_of = "decode"
    # a reasoning model thinking longer is first a rise of its reasoning phase (a shift stage):
    # the finding that says so in tokens is that rise's, said once from it
    caused_by_rise_of = "reasoning"
    verbose_factor: float = 2.0  # the caller's p50 output tokens after the change / before
    length_jump: float = 0.25  # or its finish_reason=length share rose by this much
    min_requests: int = 60  # a caller needs this many requests to be judged against itself
    min_side: int = 30  # requests on each side of a change (and ``side_share`` of the caller's)
    side_share: float = 0.1
    max_requests: int = 50_000  # a group of like requests beyond this is judged on a seeded subsample
    per_token_rise: float = 1.25  # a decode rise is the longer answers' while decode per token rose less
    known_share: float = 0.9  # reasoning and content are judged apart where this share has the count
    part_rise: float = 0.25  # a part's p50 rise counts from this share of the whole output's p50 before

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Pitfall]:
        """Per caller, per requested max_tokens: the clearest change of the output length in time;
        a finding for the caller when a group's grew ``verbose_factor``-fold or its length-capped
        share jumped."""
        keys = [k for k in CALLER if k in frame.columns and frame[k].null_count() < frame.height]
        capped = pl.col("max_tokens_set").fill_null(True) if "max_tokens_set" in frame.columns else pl.lit(True)
        read = columns(
            frame, *keys, OUTPUT, REASONING, "max_tokens", "max_tokens_set", "start", "finish_reason",
            "decode",
        )  # fmt: skip
        for name in ("max_tokens", REASONING):
            if name not in read.columns:
                read = read.with_columns(pl.lit(None, dtype=pl.Int64).alias(name))
        read = read.with_columns(content_tokens().alias(CONTENT))
        rows = read.filter(
            pl.col("output_tokens").is_not_null()
            & (pl.col("output_tokens") > 0)
            & pl.col("start").is_not_null()
            & pl.col("service").is_not_null()
            & pl.col("model").is_not_null()
            & capped
        ).with_columns(like=pl.len().over([*keys, "max_tokens"]))
        findings = []
        for key, caller in rows.group_by(keys, maintain_order=True):
            if caller.height < self.min_requests:
                continue
            changed = []
            judged = caller.filter(pl.col("like") >= self.min_requests)  # not one loop per odd max_tokens
            for _, part in judged.group_by("max_tokens", maintain_order=True):
                if part.height > self.max_requests:
                    part = part.sample(self.max_requests, seed=ctx.seed)
                part = part.sort("start")
                known = part[CONTENT].is_not_null()
                split_known = bool(known.mean() >= self.known_share)
                if split_known:
                    part = part.filter(known)
                split = self._judge(part, ctx, split_known)
                if split is not None:
                    changed.append((part.head(split), part.slice(split)))
            if changed:
                asked = caller["max_tokens"].n_unique()
                findings.append(self._finding(dict(zip(keys, key, strict=True)), changed, asked, caller, ctx))
        return findings

    def _judge(self, part: pl.DataFrame, ctx: Context, split_known: bool = False) -> int | None:
        """Where the answers of one group of like requests (sorted by ``start``) changed, when
        they got ``verbose_factor``-fold longer or ran to the cap ``length_jump`` more often; with
        ``split_known`` (every request has its reasoning count), when its reasoning or its content
        did, each judged as a length of its own (the clearest change of the three, by its factor)."""
        start = part["start"].to_numpy()
        best: tuple[float, int] | None = None
        for name in (OUTPUT, REASONING, CONTENT) if split_known else (OUTPUT,):
            tokens = part[name].to_numpy().astype(np.float64)
            # the whole output is never 0 tokens (filtered); a part may be (no reasoning, or no content)
            length = np.log(tokens) if name == OUTPUT else np.log1p(tokens)
            split = self._change(start, length, ctx.window_s)
            if split is None:
                continue
            before, after = float(np.median(tokens[:split])), float(np.median(tokens[split:]))
            cap_before, cap_after = _length_share(part.head(split)), _length_share(part.slice(split))
            floor = before if name == OUTPUT else max(before, 1.0)
            longer = after >= self.verbose_factor * floor
            if name != OUTPUT:  # a part that doubled from a few tokens is no longer answer
                whole = float(np.median(part[OUTPUT].to_numpy()[:split]))
                longer = longer and after - before >= self.part_rise * whole
            ran_to_cap = cap_after - cap_before >= self.length_jump
            if (longer or ran_to_cap) and (best is None or after / floor > best[0]):
                best = (after / floor, split)
        return None if best is None else best[1]

    def _parts(self, before: pl.DataFrame, after: pl.DataFrame) -> dict[str, tuple[float, float]] | None:
        """The p50 reasoning and content tokens before and after, where nearly all requests on
        both sides (``known_share``) have the reasoning count; None where they do not."""
        if min(before[CONTENT].is_not_null().mean() or 0.0, after[CONTENT].is_not_null().mean() or 0.0) < (
            self.known_share
        ):
            return None
        return {
            name: (float(before[name].median() or 0.0), float(after[name].median() or 0.0))
            for name in (REASONING, CONTENT)
        }

    def _change(self, start: np.ndarray, values: np.ndarray, window_s: float) -> int | None:
        """The index where ``values`` (ordered by ``start``) split at a window boundary differ most
        clearly (Welch's t of the two sides' means), both sides holding at least ``min_side``
        requests and ``side_share`` of them; None when no split can be judged."""
        n = len(values)
        least = max(self.min_side, math.ceil(self.side_share * n))
        if n < 2 * least:
            return None
        origin = start[0]
        bounds = origin + window_s * np.arange(1, math.ceil((start[-1] - origin) / window_s) + 1)
        splits = np.unique(np.searchsorted(start, bounds, side="left"))
        splits = splits[(splits >= least) & (splits <= n - least)]
        if splits.size == 0:
            return None
        total, squares = np.cumsum(values), np.cumsum(values**2)
        n1 = splits.astype(np.float64)
        n2 = n - n1
        m1, m2 = total[splits - 1] / n1, (total[-1] - total[splits - 1]) / n2
        v1 = np.maximum(squares[splits - 1] / n1 - m1**2, 1e-12)
        v2 = np.maximum((squares[-1] - squares[splits - 1]) / n2 - m2**2, 1e-12)
        t = (m2 - m1) / np.sqrt(v1 / n1 + v2 / n2)
        return int(splits[int(np.argmax(t))])

    def _finding(
        self,
        caller: dict,
        changed: list[tuple[pl.DataFrame, pl.DataFrame]],
        asked: int,
        rows: pl.DataFrame,
        ctx: Context,
    ) -> Pitfall:
        """One finding for the caller from its groups that changed (each ``(before, after)``):
        their requests before and after their own change, side by side; ``asked`` is how many
        max_tokens values the caller asked for (the one group's is said when it asked several),
        ``rows`` all its requests (for the requests that began asking another max_tokens)."""
        before = pl.concat([b for b, _ in changed])
        after = pl.concat([a for _, a in changed])
        at = min(float(a["start"].min()) for _, a in changed)
        decode_before = [float(b["decode"].mean() or 0.0) for b, _ in changed]
        decode_after = [float(a["decode"].mean() or 0.0) for _, a in changed]
        extra = sum(
            max(after_s - before_s, 0.0) * a.height
            for before_s, after_s, (_, a) in zip(decode_before, decode_after, changed, strict=True)
        )
        p50 = float(before["output_tokens"].median()), float(after["output_tokens"].median())
        cap = _length_share(before), _length_share(after)
        ratio = p50[1] / p50[0]
        parts = self._parts(before, after)
        grew = [] if parts is None else [n for n in (REASONING, CONTENT) if self._grew(*parts[n], p50[0])]
        scope = {k: str(v) for k, v in caller.items() if k != "model" and v is not None}
        who = " ".join(f"{k} {v}" for k, v in scope.items())
        groups = sorted({b["max_tokens"][0] for b, _ in changed}, key=lambda m: (m is None, m))
        evidence = {
            "model": caller["model"],
            "output_tokens_p50_before": round(p50[0], 1),
            "output_tokens_p50_after": round(p50[1], 1),
            "ratio": round(ratio, 2),
            "length_share_before": round(cap[0], 4),
            "length_share_after": round(cap[1], 4),
            "requests_before": before.height,
            "decode_mean_before_s": round(before["decode"].mean() or 0.0, 3),
            "decode_mean_after_s": round(after["decode"].mean() or 0.0, 3),
            "extra_decode_s": round(extra, 1),
            "max_tokens": groups[-1] if len(groups) == 1 else None,
            "max_tokens_groups": len(groups),
            # reasoning models whose engine counts the reasoning: its part and the content's (else null)
            **{
                f"{name}_p50_{side}": None if parts is None else round(parts[name][i], 1)
                for name in (REASONING, CONTENT)
                for i, side in enumerate(("before", "after"))
            },
            "reasoning_ratio": None if parts is None else round(_ratio(*parts[REASONING]), 2),
            "content_ratio": None if parts is None else round(_ratio(*parts[CONTENT]), 2),
            # what got verbose_factor-fold longer (output: the whole, where the split is unknown)
            "longer": _longer(parts, grew, ratio >= self.verbose_factor),
        }
        like = ""
        if asked > 1:
            known = [str(m) for m in groups if m is not None]
            like = f" at max_tokens {' and '.join(known)}" if known else " at unknown max_tokens"
        capped = f"; finish_reason=length {cap[0]:.0%} -> {cap[1]:.0%}" if cap[1] - cap[0] >= self.length_jump else ""
        mix = requested_mix(rows, ctx.window_s, self.min_side)
        new = () if mix is None else tuple(a for a in mix.new if a.max_tokens not in groups)
        besides = f"; {replace(mix, new=new).new_clause}, not counted" if mix is not None and new else ""
        when = iso_utc(at)[11:19]
        cost = f"adding {extra:,.1f} s of decode{besides}"
        if parts is None or not grew:
            split = "" if parts is None else "; " + _said(parts, ())
            summary = (
                f"{who}'s answers on {caller['model']} got {ratio:.1f}x longer{like} from {when} "
                f"(p50 {p50[0]:.0f} -> {p50[1]:.0f} tokens{capped}){split}, {cost}; "
                f"check its chat template and stop tokens"
            )
        elif grew == [REASONING]:  # the model thinks longer; its answers did not run on
            summary = (
                f"{caller['model']} thinks longer for {who}{like} from {when}: {_said(parts, grew)}{capped}, "
                f"{cost}; a reasoning-effort or chat-template change makes the model think longer, its "
                f"answers did not run on"
            )
        else:
            check = "its chat template and stop tokens"
            check += ", and its reasoning effort" if REASONING in grew else ""
            summary = (
                f"{who}'s answers on {caller['model']} got {ratio:.1f}x longer{like} from {when}: "
                f"{_said(parts, grew)}{capped}, {cost}; check {check}"
            )
        return pitfall(self.name, scope, after.height, evidence, summary, extra, "decode", at=at)

    def _grew(self, before: float, after: float, whole: float) -> bool:
        """A part (reasoning or content) got ``verbose_factor``-fold longer, by ``part_rise`` of
        the whole output's p50 before (``whole``) or more."""
        return after >= self.verbose_factor * max(before, 1.0) and after - before >= self.part_rise * whole

    def brought(self, rise: Shift, frame: pl.DataFrame, ctx: Context) -> Scope | None:
        """The caller whose answers got longer within a window of ``rise``'s onset, in a scope
        the rise covers, when the rise's requests' decode per output token rose less than
        ``per_token_rise``-fold (the answers were longer, not slower)."""
        rise_at = to_second(rise.at)
        scope = pl.all_horizontal(pl.lit(True), *[pl.col(k).cast(pl.String) == v for k, v in rise.scope.items()])
        per_token = pl.col("decode") / pl.col("output_tokens").cast(pl.Float64)
        seen = frame.filter(scope.fill_null(False) & (pl.col("output_tokens") > 0)).select("start", per_token=per_token)
        before = seen.filter(pl.col("start") < rise_at)["per_token"].median()
        after = seen.filter(pl.col("start") >= rise_at)["per_token"].median()
        if before is None or after is None or after >= self.per_token_rise * before:
            return None
        for found in self.detect(frame, ctx):
            near = found.at is not None and abs(found.at - rise_at) <= ctx.window_s
            if near and all(found.scope.get(k, v) == v for k, v in rise.scope.items()):
                return found.scope
        return None


def _ratio(before: float, after: float) -> float:
    """How many times longer a part's p50 got (from at least one token: a part may be none)."""
    return after / max(before, 1.0)


def _said(parts: dict[str, tuple[float, float]], grew: list[str] | tuple[str, ...]) -> str:
    """``reasoning got 3.1x longer (p50 400 -> 1240 tokens); content unchanged (p50 180 -> 176)``:
    the parts that ``grew`` first, then the other."""
    words = []
    for name in sorted(parts, key=lambda n: n not in grew):
        before, after = parts[name]
        ratio = _ratio(before, after)
        if name in grew:
            how = f"got {ratio:.1f}x longer"
        elif 1 / UNCHANGED <= ratio <= UNCHANGED:
            how = "unchanged"
        else:
            how = f"{ratio:.1f}x"
        unit = " tokens" if name in grew else ""
        words.append(f"{name.removesuffix('_tokens')} {how} (p50 {before:.0f} -> {after:.0f}{unit})")
    return "; ".join(words)


def _longer(parts: dict | None, grew: list[str], whole: bool) -> str | None:
    """The evidence's ``longer``: ``reasoning``, ``content``, ``reasoning and content``, or
    ``output`` (the whole, where the split is unknown); None where only the capped share rose."""
    if parts is None:
        return "output" if whole else None
    return " and ".join(n.removesuffix("_tokens") for n in grew) or None


def _length_share(part: pl.DataFrame) -> float:
    """The share of ``part``'s requests that ran to their cap (``finish_reason=length``)."""
    if "finish_reason" not in part.columns or part.height == 0:
        return 0.0
    return float((part["finish_reason"] == "length").fill_null(False).mean() or 0.0)
