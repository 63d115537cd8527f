"""``verbose_outputs``: one service's answers are far longer than other services' on the same
model (the symptom of a wrong chat template or missing stop tokens)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from hopline.analyzer.attribution import e2e
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Pitfall, pitfall


@dataclass(frozen=True)
class VerboseOutputs(Detector):
    name = "verbose_outputs"
    kind = "pitfall"
    needs = ("output_tokens", "service", "model")
    verbose_factor: float = 2.0  # a service's p50 output tokens / the others' on the model
    min_requests: int = 20  # a service needs this many requests on the model to be judged

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Pitfall]:
        """A service whose p50 output length is ``verbose_factor`` × the other services' on the model."""
        rows = frame.filter(
            pl.col("output_tokens").is_not_null()
            & pl.col("service").is_not_null()
            & pl.col("model").is_not_null()
        )
        per = (
            rows.group_by("model", "service")
            .agg(
                n=pl.len(),
                out_p50=pl.col("output_tokens").median(),
                decode_mean=pl.col("decode").mean(),
                e2e_mean=e2e().mean(),
            )
            .filter(pl.col("n") >= self.min_requests)
        )
        findings = []
        for (model,), group in per.group_by("model", maintain_order=True):
            if group.height < 2:
                continue
            for row in group.iter_rows(named=True):
                others = rows.filter((pl.col("model") == model) & (pl.col("service") != row["service"]))
                found = self._judge(model, row, others)
                if found is not None:
                    findings.append(found)
        return findings

    def _judge(self, model: str, row: dict, others: pl.DataFrame) -> Pitfall | None:
        others_p50 = others["output_tokens"].median()
        if not others_p50 or row["out_p50"] < self.verbose_factor * others_p50:
            return None
        ratio = row["out_p50"] / others_p50
        others_decode = others["decode"].mean() or 0.0
        extra = max((row["decode_mean"] or 0.0) - others_decode, 0.0) * row["n"]
        evidence = {
            "model": model,
            "output_tokens_p50": row["out_p50"],
            "others_output_tokens_p50": others_p50,
            "ratio": round(ratio, 2),
            "decode_mean_s": round(row["decode_mean"] or 0.0, 3),
            "others_decode_mean_s": round(others_decode, 3),
            "extra_decode_s": round(extra, 1),
        }
        summary = (
            f"service {row['service']}'s answers are {ratio:.1f}× longer than other services' on {model} "
            f"(p50 {row['out_p50']:.0f} vs {others_p50:.0f} tokens); check its chat template and stop tokens"
        )
        return pitfall(self.name, {"service": row["service"]}, row["n"], evidence, summary, extra, "decode")
