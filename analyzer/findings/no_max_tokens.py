"""``no_max_tokens``: requests sent without max_tokens that ran long hold decode time and KV
memory (with ``Context.kv_bytes_per_token``: how much of it, in GB·s)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Pitfall, pitfall


@dataclass(frozen=True)
class NoMaxTokens(Detector):
    name = "no_max_tokens"
    side = "client"
    kind = "pitfall"
    needs = ("max_tokens_set", "output_tokens")
    long_output_quantile: float = 0.9  # "ran long": above this quantile of capped requests
    min_requests: int = 5  # requests that ran long, at least

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Pitfall]:
        """Requests sent without max_tokens whose output ran past the capped requests' p90 (per model)."""
        if not frame["max_tokens_set"].eq(False).any():
            return []
        capped_p90 = (
            frame.filter(pl.col("max_tokens_set") == True)
            .group_by("model")
            .agg(p90=pl.col("output_tokens").quantile(self.long_output_quantile, "linear"))
        )
        uncapped = frame.filter(pl.col("max_tokens_set") == False).join(capped_p90, on="model", how="left")
        ran_long = uncapped.filter(pl.col("output_tokens") > pl.col("p90"))
        if ran_long.height < self.min_requests:
            return []
        return [
            self._finding(service, part, uncapped.filter(pl.col("service") == service).height, ctx)
            for (service,), part in ran_long.group_by("service", maintain_order=True)
        ]

    def _finding(self, service: str, part: pl.DataFrame, uncapped: int, ctx: Context) -> Pitfall:
        held = part.select(
            decode_total=pl.col("decode").sum(),
            decode_p50=pl.col("decode").median(),
            decode_max=pl.col("decode").max(),
            out_p50=pl.col("output_tokens").median(),
            out_max=pl.col("output_tokens").max(),
            token_seconds=(
                (pl.col("prompt_tokens").fill_null(0) + pl.col("output_tokens")) * pl.col("decode")
            ).sum(),
            cap_p90=pl.col("p90").max(),
        ).row(0, named=True)
        evidence = {
            "requests_without_max_tokens": uncapped,
            "ran_long": part.height,
            "output_tokens_p50": held["out_p50"],
            "output_tokens_max": held["out_max"],
            "capped_output_tokens_p90": held["cap_p90"],
            "decode_p50_s": round(held["decode_p50"] or 0.0, 3),
            "decode_max_s": round(held["decode_max"] or 0.0, 3),
            "decode_total_s": round(held["decode_total"] or 0.0, 3),
            "kv_token_seconds": round(held["token_seconds"] or 0.0, 1),
        }
        kv = ""
        if ctx.kv_bytes_per_token:
            gb_s = held["token_seconds"] * ctx.kv_bytes_per_token / 1e9
            evidence["kv_gb_seconds"] = round(gb_s, 2)
            kv = f" and {gb_s:,.1f} GB·s of KV cache"
        summary = (
            f"{part.height} requests from service {service} sent without max_tokens ran long (p50 {held['out_p50']:.0f} "
            f"output tokens vs p90 {held['cap_p90']:.0f} with a cap), holding {held['decode_total']:.0f} s of decode{kv}; "
            f"set max_tokens"
        )
        return pitfall(
            self.name, {"service": service}, part.height, evidence, summary, held["decode_total"] or 0.0, "decode"
        )
