"""What-if charts (Vega-Lite, via Altair) and tables: α / α′ per slot, layer × head maps of ρ and ‖Δo‖, hidden-state
deltas, top-k tables."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from kvviz.metrics import NextToken
from kvviz.whatif import Detail

def visible(text: str) -> str:
    """Whitespace made visible for tables: newline ↵, tab ⇥, space ␣ at the ends."""
    text = text.replace("\n", "↵").replace("\t", "⇥")
    stripped = text.strip(" ")
    if stripped != text:
        left, right = len(text) - len(text.lstrip(" ")), len(text) - len(text.rstrip(" "))
        text = "␣" * left + stripped + "␣" * right
    return text or "∅"


# Vega-Lite (Altair) charts, not plotly: a click on the strip redraws all three. Streamlit keeps a keyed Vega-Lite chart
# and swaps its data in place while the spec is unchanged (the specs here hold no per-click values), whereas it
# remounts a plotly chart whose figure changed. Measured at 1k slots on 2 cores: the browser's last long task of a
# click ended ~0.45 s sooner. The selected slots are in the data; scales with a fixed domain keep the spec stable.
SERIES = {"full": ("α full", "#7f8c9a"), "renorm": ("α′ = α/(1−ρ)", "#2f80ed"),
          "edited": ("α used by the edited run", "#f2994a")}
BAR_LIMIT = 128  # up to this many slots α is drawn as grouped bars, above as step lines (one bar would be < 3 px)
MAPS = {"rho": "evicted mass ρ", "delta_isolated": "‖Δo‖ isolated", "delta_propagated": "‖Δo‖ propagated"}


def alpha_chart(detail: Detail, texts: list[str]) -> alt.LayerChart:
    """α (full cache), α′ = α/(1−ρ) (closed form) and the weights the edited run used, per slot; evicted slots are
    crossed (their α′ and edited weight are 0). Hovering a slot shows its token and the three weights."""
    n = len(detail.slots)
    zero = lambda values: [0.0 if v is None else v for v in values]  # noqa: E731
    frame = pd.DataFrame({
        "slot": np.tile(detail.slots, 3), "token": np.tile(np.array([visible(t) for t in texts], dtype=object), 3),
        "series": np.repeat([name for name, _ in SERIES.values()], n),
        "weight": detail.alpha_full + zero(detail.alpha_renorm) + zero(detail.alpha_edited),
        "evicted": np.tile([v is None for v in detail.alpha_renorm], 3)})
    colour = alt.Color("series:N", scale=alt.Scale(domain=[name for name, _ in SERIES.values()],
                                                   range=[c for _, c in SERIES.values()]),
                       legend=alt.Legend(orient="bottom", title=None))
    tooltip = ["slot:Q", "token:N", "series:N", alt.Tooltip("weight:Q", format=".4f")]
    base = alt.Chart(frame).encode(y=alt.Y("weight:Q", title="weight"), color=colour, tooltip=tooltip)
    if n <= BAR_LIMIT:
        marks = base.mark_bar().encode(x=alt.X("slot:O", title="slot"), xOffset="series:N")
        x = alt.X("slot:O", title="slot")
    else:
        x = alt.X("slot:Q", title="slot", scale=alt.Scale(domain=[0, n - 1], nice=False))
        marks = base.mark_line(interpolate="step", strokeWidth=1).encode(x=x) \
            + base.mark_point(opacity=0, size=20).encode(x=x)  # hover targets for the tooltip
    crosses = alt.Chart(frame).transform_filter(f"datum.evicted && datum.series == '{SERIES['full'][0]}'") \
        .mark_point(shape="cross", size=70, filled=True, color="#eb5757").encode(x=x, y="weight:Q", tooltip=tooltip)
    title = f"Layer {detail.layer}, head {detail.head}: attention weights of the step (evicted slots crossed)"
    return (marks + crosses).properties(height=300, title=title)


def head_grid_chart(heads: dict[str, list[list[float]]]) -> alt.HConcatChart:
    """Layer × query head maps side by side: ρ (scale 0–1), ‖Δo‖ isolated (full-cache query) and ‖Δo‖ propagated
    (the real edited run), the two ‖Δo‖ maps on one colour scale."""
    rows = [(layer, head, MAPS[key], value) for key in MAPS for layer, row in enumerate(heads[key])
            for head, value in enumerate(row)]
    frame = pd.DataFrame(rows, columns=["layer", "head", "map", "value"])
    layers = len(heads["rho"])

    def grid(keys: list[str], domain: list[float] | None) -> alt.Chart:
        scale = alt.Scale(scheme="viridis", domain=domain) if domain else alt.Scale(scheme="viridis", zero=True)
        return alt.Chart(frame).transform_filter(alt.FieldOneOfPredicate("map", [MAPS[k] for k in keys])) \
            .mark_rect().encode(
                x=alt.X("head:O", title="query head"), y=alt.Y("layer:O", title="layer"),
                color=alt.Color("value:Q", scale=scale, title=None, legend=alt.Legend(gradientLength=layers * 9)),
                tooltip=["map:N", "layer:O", "head:O", alt.Tooltip("value:Q", format=".4g")],
            ).properties(width=200, height=layers * 11)

    rho = grid(["rho"], [0, 1]).properties(title=MAPS["rho"])
    deltas = grid(["delta_isolated", "delta_propagated"], None).facet(column=alt.Column("map:N", title=None,
                                                                                        sort=list(MAPS.values())[1:]))
    return alt.hconcat(rho, deltas).resolve_scale(color="independent")


def hidden_chart(hidden_delta: list[float]) -> alt.Chart:
    """‖h̃ − h‖ after the embeddings (0) and after each layer: how the edit propagates (§11)."""
    frame = pd.DataFrame({"layer": np.arange(len(hidden_delta)), "delta": hidden_delta})
    return alt.Chart(frame).mark_line(point=True).encode(
        x=alt.X("layer:Q", title="layer (0 = embeddings)"), y=alt.Y("delta:Q", title="‖h̃ − h‖"),
        tooltip=["layer:Q", alt.Tooltip("delta:Q", format=".4g")],
    ).properties(height=220, title="Hidden-state change by layer")


def topk_frame(next_token: NextToken, side: str) -> pd.DataFrame:
    """The top-k table of one side (``full`` or ``edited``) with the rank in the other and the logit change."""
    rows = next_token.full if side == "full" else next_token.edited
    return pd.DataFrame({
        "token": [visible(c.text) for c in rows],
        "p": [c.prob for c in rows],
        "rank": [c.rank + 1 for c in rows],
        "rank other": [c.rank_other + 1 for c in rows],
        "Δrank": [c.rank_other - c.rank for c in rows] if side == "full" else [c.rank - c.rank_other for c in rows],
        "Δlogit": [c.logit_delta for c in rows],
    })
