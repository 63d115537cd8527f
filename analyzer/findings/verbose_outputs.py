"""``verbose_outputs``: one caller's answers got longer from a moment on (the symptom of a chat
template or stop tokens that changed: a deploy that broke the template, a model swapped under
the same name), judged against that caller's own history, never against other callers.

A caller is a service (and its route, where requests carry one) on a model: services legitimately
answer at different lengths (a chat service's answers twice an agent's), so one caller is only
compared with itself. It fires on a change point of the caller's output length (the split of its
requests in time, at a window boundary, where the mean log length moves most clearly: the median
after is ``verbose_factor`` x the median before) or of its ``finish_reason=length`` share (up by
``length_jump`` or more: answers now run to the cap). Requests sent without max_tokens are left to
``no_max_tokens``.

Longer answers take longer to decode: a decode rise of the caller that began with the change and
whose time per output token did not rise is this finding's (``brings_rise_of``, ``brought``), said
with it rather than as a second finding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl
from hopline.analyzer.findings.common import columns
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Pitfall, Scope, Shift, iso_utc, pitfall, to_second

CALLER = ("model", "service", "route")


@dataclass(frozen=True)
class VerboseOutputs(Detector):
    name = "verbose_outputs"
    kind = "pitfall"
    needs = ("output_tokens", "service", "model")
    brings_rise_of = "decode"
    verbose_factor: float = 2.0  # the caller's p50 output tokens after the change / before
    length_jump: float = 0.25  # or its finish_reason=length share rose by this much
    min_requests: int = 60  # a caller needs this many requests to be judged against itself
    min_side: int = 30  # requests on each side of a change (and ``side_share`` of the caller's)
    side_share: float = 0.1
    max_requests: int = 50_000  # a caller beyond this is judged on a seeded subsample
    per_token_rise: float = 1.25  # a decode rise is the longer answers' while decode per token rose less

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Pitfall]:
        """Per caller: the clearest change of its output length in time, a finding when it grew
        ``verbose_factor``-fold or its length-capped share jumped."""
        keys = [k for k in CALLER if k in frame.columns and frame[k].null_count() < frame.height]
        capped = pl.col("max_tokens_set").fill_null(True) if "max_tokens_set" in frame.columns else pl.lit(True)
        read = columns(frame, *keys, "output_tokens", "max_tokens_set", "start", "finish_reason", "decode")
        rows = read.filter(
            pl.col("output_tokens").is_not_null()
            & (pl.col("output_tokens") > 0)
            & pl.col("start").is_not_null()
            & pl.col("service").is_not_null()
            & pl.col("model").is_not_null()
            & capped
        )
        findings = []
        for key, part in rows.group_by(keys, maintain_order=True):
            if part.height < self.min_requests:
                continue
            if part.height > self.max_requests:
                part = part.sample(self.max_requests, seed=ctx.seed)
            found = self._judge(dict(zip(keys, key, strict=True)), part.sort("start"), ctx)
            if found is not None:
                findings.append(found)
        return findings

    def _judge(self, caller: dict, part: pl.DataFrame, ctx: Context) -> Pitfall | None:
        start = part["start"].to_numpy()
        length = np.log(part["output_tokens"].to_numpy().astype(np.float64))
        capped = (part["finish_reason"] == "length").fill_null(False).to_numpy() if "finish_reason" in part.columns else None
        split = self._change(start, length, ctx.window_s)
        if split is None:
            return None
        tokens = np.exp(length)
        before, after = np.median(tokens[:split]), np.median(tokens[split:])
        cap_before = float(capped[:split].mean()) if capped is not None else 0.0
        cap_after = float(capped[split:].mean()) if capped is not None else 0.0
        longer = after >= self.verbose_factor * before
        ran_to_cap = cap_after - cap_before >= self.length_jump
        if not (longer or ran_to_cap):
            return None
        return self._finding(caller, part, split, (before, after), (cap_before, cap_after))

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
        self, caller: dict, part: pl.DataFrame, split: int, p50: tuple[float, float], cap: tuple[float, float]
    ) -> Pitfall:
        before, after = part.head(split), part.slice(split)
        at = float(after["start"].min())
        decode_before = before["decode"].mean() or 0.0
        decode_after = after["decode"].mean() or 0.0
        extra = max(decode_after - decode_before, 0.0) * after.height
        ratio = p50[1] / p50[0]
        scope = {k: str(v) for k, v in caller.items() if k != "model" and v is not None}
        who = " ".join(f"{k} {v}" for k, v in scope.items())
        evidence = {
            "model": caller["model"],
            "output_tokens_p50_before": round(p50[0], 1),
            "output_tokens_p50_after": round(p50[1], 1),
            "ratio": round(ratio, 2),
            "length_share_before": round(cap[0], 4),
            "length_share_after": round(cap[1], 4),
            "requests_before": before.height,
            "decode_mean_before_s": round(decode_before, 3),
            "decode_mean_after_s": round(decode_after, 3),
            "extra_decode_s": round(extra, 1),
        }
        capped = f"; finish_reason=length {cap[0]:.0%} -> {cap[1]:.0%}" if cap[1] - cap[0] >= self.length_jump else ""
        summary = (
            f"{who}'s answers on {caller['model']} got {ratio:.1f}x longer from {iso_utc(at)[11:19]} "
            f"(p50 {p50[0]:.0f} -> {p50[1]:.0f} tokens{capped}), adding {extra:,.1f} s of decode; "
            f"check its chat template and stop tokens"
        )
        return pitfall(self.name, scope, after.height, evidence, summary, extra, "decode", at=at)

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
