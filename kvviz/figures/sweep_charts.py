"""A sweep's table as a figure: damage (mean KL per case) against the budget, per policy, with its spread."""

from __future__ import annotations

import pandas as pd

from kvviz.figures.whatif_charts import Chart, nice_max


def damage_chart(table: pd.DataFrame, measure: str = "kl_mean") -> Chart:
    """Per policy and budget: the median of ``measure`` over the prompts (line) and its range between the 25th and
    75th percentile (band); hovering shows the numbers."""
    grouped = table.assign(value=table[measure].astype(float)).groupby(["policy", "budget"])["value"]
    data = pd.DataFrame({"median": grouped.median(), "low": grouped.quantile(0.25), "high": grouped.quantile(0.75),
                         "cases": grouped.size()}).reset_index()
    data["budget"] = data["budget"].astype(float)
    x = {"field": "budget", "type": "ordinal", "sort": "ascending", "title": "budget (slots, or fraction of the prompt)",
         "axis": {"labelAngle": 0}}
    color = {"field": "policy", "type": "nominal", "scale": {"scheme": "tableau10"},
             "legend": {"orient": "bottom", "title": None, "symbolOpacity": 1}}
    spec = {
        "title": f"Damage against budget: {measure} per case (median, band: 25th–75th percentile)", "height": 300,
        "layer": [
            {"mark": {"type": "area", "opacity": 0.2}, "encoding": {
                "x": x, "y": {"field": "low", "type": "quantitative", "title": measure,
                              "scale": {"domain": [0, nice_max(data["high"])]}}, "y2": {"field": "high"},
                "color": color}},
            {"mark": {"type": "line", "point": True}, "encoding": {
                "x": x, "y": {"field": "median", "type": "quantitative"}, "color": color,
                "tooltip": [{"field": f, "type": "nominal" if f == "policy" else "quantitative",
                             **({"format": ".4f"} if f in ("median", "low", "high") else {})}
                            for f in ("policy", "budget", "median", "low", "high", "cases")]}}]}
    return Chart(spec, data)
