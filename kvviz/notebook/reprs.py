"""Rich notebook output for the library's objects: a :class:`~kvviz.session.Session` as its strip, a
:class:`~kvviz.whatif.WhatIf` as its side-by-side next-token table, a :class:`~kvviz.runs.PolicyRun` as its replies
and per-step KL, a :class:`~kvviz.runs.Blame` as its table, a sweep's table as its damage-vs-budget chart.

Every output is one piece of static HTML: inline styles, charts as inline SVG (Vega-Lite rendered by vl-convert, the
same specs the dashboard draws), no script and no URL, so a saved notebook shows it with no kernel and no network.
Text is escaped, never set as markup. ``import kvviz`` hands the renderers to IPython's display formatters (Jupyter,
VS Code, Colab); :func:`html` returns an object any front end displays (marimo included).
"""

from __future__ import annotations

import html as escape
import re
import pandas as pd

from kvviz.figures.growth import SEGMENT_COLOURS
from kvviz.figures.plot_slides import bit_widths_slide, cache_size_slide, kl_slide, run_caption, timeline_slide
from kvviz.figures.slides import THEME, to_svg
from kvviz.figures.sweep_charts import damage_chart
from kvviz.figures.whatif_charts import topk_frame
from kvviz.edit.draft import EditDraft
from kvviz.runs import Blame, PolicyRun
from kvviz.session import Session
from kvviz.sweeps.table import Sweep
from kvviz.transcript import SEGMENTS
from kvviz.view_data import strip_chips
from kvviz.whatif import WhatIf

BOX = "font-family: system-ui, sans-serif; font-size: 13px; line-height: 1.5; color: #222;"
CELL = "padding: 2px 8px; text-align: right; border-bottom: 1px solid #eee;"
BLAME_ROWS = 12  # a blame's best restores shown (the rest: a count; ``result.rows`` holds them all)
MAX_CHIPS = 2048  # a longer cache shows its newest slots (the header says how many are left out)


def _e(value: object) -> str:
    return escape.escape(str(value), quote=True)


def chip_style(segment: str, shade: float, evicted: int, committed: int, bits: int) -> str:
    """The inline style of a strip chip: its segment's colour as the underline, attention as the red background
    (``shade`` ∈ [0, 1]), an eviction (tried or committed) struck through and faded, a bit-width dashed."""
    style = (f"display: inline-block; margin: 1px; padding: 0 3px; border-radius: 3px; white-space: pre; "
             f"border-bottom: 3px solid {SEGMENT_COLOURS[segment]}; "
             f"background: rgba(235, 87, 87, {max(0.0, min(1.0, shade)):.3f});")
    if evicted or committed:
        style += " text-decoration: line-through; opacity: 0.45;"
    if bits < 16:
        style += " outline: 1px dashed #6a1b9a;"
    return style


def chip_fields(row: list) -> list:
    """What a notebook chip shows of a :func:`~kvviz.view_data.strip_chips` row: ``[slot, text, segment code, shade,
    evicted in the draft 0/1/2, key bits (the lower of the draft's and the committed), committed eviction 0/1/2,
    selected 0/1]`` — the static strip's and the widget's alike."""
    return [row[0], row[1], row[2], row[4], row[5], min(row[6], row[12]), row[11], row[8]]


def session_html(session: Session, at: int | None = None, layer: int = 0, head: int | None = None,
                 draft: EditDraft | None = None) -> str:
    """The strip of ``session`` at the step of slot ``at`` (default: the newest): chips coloured by segment, shaded
    by what that step attended to in ``layer`` (mean of query heads for ``head=None``), committed evictions struck
    through, a tooltip with slot, token, segment, attention and bits."""
    n = len(session)
    if n == 0:
        return f'<div style="{BOX}"><b>kvviz session</b> · empty cache ({_e(session.lm.name)})</div>'
    at = n - 1 if at is None else at
    chips = strip_chips(session, draft or EditDraft(), at, layer, head)
    bytes_ = session.memory()
    where = f"layer {layer}, " + ("mean of heads" if head is None else f"head {head}")
    head_line = (f"<b>kvviz session</b> · {_e(session.lm.name)} · {n} slots · {len(session.commits.stack)} "
                 f"committed edit(s) · cache {bytes_.kv_bytes / 2**20:.2f} MiB · shaded by the attention of slot "
                 f"{at} ({where})")
    legend = " ".join(f'<span style="border-bottom: 3px solid {SEGMENT_COLOURS[s]}; padding: 0 3px">{s}</span>'
                      for s in SEGMENTS)
    shown = chips[-MAX_CHIPS:]
    spans = []
    for row in shown:
        slot, text, code, shade, evicted, bits, committed, _selected = chip_fields(row)
        segment = SEGMENTS[code]
        tip = f"slot {slot} · {text!r} · {segment} · attention {shade:.3f} (of the strongest)" + \
              (" · evicted" if evicted or committed else "") + (f" · {bits} bits" if bits < 16 else "")
        spans.append(f'<span title="{_e(tip)}" style="{chip_style(segment, shade, evicted, committed, bits)}">'
                     f"{_e(text)}</span>")
    left_out = f"<div>… {len(chips) - len(shown)} earlier slots not shown</div>" if len(chips) > len(shown) else ""
    return (f'<div class="kvviz-session" style="{BOX}"><div>{head_line}</div><div>{legend}</div>{left_out}'
            f'<div style="margin-top: 4px">{"".join(spans)}</div></div>')


def _table(frame: pd.DataFrame, title: str, digits: int = 4) -> str:
    head = "".join(f'<th style="{CELL}">{_e(c)}</th>' for c in frame.columns)
    rows = []
    for values in frame.itertuples(index=False):
        cells = [f"{v:.{digits}g}" if isinstance(v, float) else str(v) for v in values]
        rows.append("<tr>" + "".join(f'<td style="{CELL}">{_e(v)}</td>' for v in cells) + "</tr>")
    return (f'<table style="border-collapse: collapse; margin: 4px 12px 4px 0; display: inline-table">'
            f'<caption style="text-align: left; font-weight: 600">{_e(title)}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def what_if_html(result: WhatIf) -> str:
    """A what-if as the dashboard's side-by-side next-token tables (full cache, edited cache) under a line with KL,
    total variation, whether the top-1 token changed, the mean evicted mass ρ and the bytes kept."""
    nt = result.next_token
    changed = nt.full[0].id != nt.edited[0].id
    rho = result.heads["rho"].float()
    memory = result.memory
    top1 = f"changed: {_e(repr(nt.full[0].text))} → {_e(repr(nt.edited[0].text))}" if changed else "kept"
    line = (f"<b>what-if</b> at slot {result.at} · KL(full ‖ edited) <b>{nt.kl:.6g}</b> nats · TV {nt.tv:.4g} · "
            f"top-1 {top1} · ρ mean {float(rho.mean()):.4g}, max {float(rho.max()):.4g} · cache "
            f"{memory.edited_bytes:,} of {memory.full_bytes:,} bytes")
    tables = "".join(_table(topk_frame(nt, side), f"{side} cache") for side in ("full", "edited"))
    return f'<div class="kvviz-whatif" style="{BOX}"><div>{line}</div><div>{tables}</div></div>'


NOTEBOOK_THEME = {**THEME, "padding": 8, "axis": {"labelFontSize": 11, "titleFontSize": 12},
                  "title": {**THEME["title"], "fontSize": 14, "subtitleFontSize": 11},
                  "legend": {"labelFontSize": 11, "titleFontSize": 11}}


def _sized(spec: dict, width: int, height: int) -> str:
    """A slide's Vega-Lite spec (:mod:`kvviz.figures.plot_slides`: the numbers of the app's plotly figures) drawn at
    a notebook's size and type, as inline SVG."""
    return _svg({**spec, "config": NOTEBOOK_THEME, "width": width, "height": height})


def policy_run_html(result: PolicyRun) -> str:
    """Each turn of a policy run: the full cache's reply and the policy's side by side, where they diverge, then the
    Policy run tab's figures as SVG: the teacher-forced KL of every step, the slots each step sees, the eviction
    timeline (a policy's run) and the key bit-widths (a KIVI run)."""
    parts = [f"<b>policy run</b> · {_e(result.settings.label)} · {_e(result.model)}"]
    for k, run in enumerate(result.turns):
        kls = [r.kl for r in run.records]
        caption = run_caption(result.model, result, k)
        pieces = [slot.text for slot in run.forced.session.transcript.slots]
        figures = "".join(_sized(slide(result, k, caption), 560, 160) for slide in (kl_slide, cache_size_slide))
        tall = min(480, max(160, 6 * run.end))  # a row per slot
        if result.settings.policy is not None and run.steps:
            figures += _sized(timeline_slide(result, pieces, k, caption), 560, tall)
        if result.windowed and run.steps:
            figures += _sized(bit_widths_slide(result, pieces, k, caption), 560, tall)
        where = "same reply" if run.divergence is None else f"first differs at step {run.divergence}"
        parts.append(
            f'<div style="margin-top: 6px"><b>turn {k}</b> · {_e(run.user[:120])} · {where} · KL mean '
            f"{sum(kls) / max(len(kls), 1):.4g}, max {max(kls, default=0):.4g}</div>"
            f'<div style="display: flex; gap: 12px">'
            f'<div style="flex: 1"><i>full cache</i><div>{_e(run.full_text)}</div></div>'
            f'<div style="flex: 1"><i>policy</i><div>{_e(run.policy_text)}</div></div></div>'
            f'<div class="kvviz-figures">{figures}</div>')
    return f'<div class="kvviz-run" style="{BOX}">{"".join(parts)}</div>'


def blame_html(result: Blame) -> str:
    """A blame: the step's KL with nothing and everything put back, then each restore's KL, top-1 and mass."""
    line = (f"<b>blame</b> of turn {result.turn}, step {result.step} (slot {result.slot}) · restores {result.of} "
            f"{result.unit}s · KL {result.kl:.4g} with nothing back, {result.kl_all_restored:.4g} with everything")
    rows = result.rows[:BLAME_ROWS]
    frame = pd.DataFrame({"slots": [", ".join(map(str, r.slots)) for r in rows],
                          "KL after restore": [r.kl_after_restore for r in rows],
                          "top-1 back": ["yes" if r.top1_restored else "no" for r in rows],
                          "attention mass": [r.mass for r in rows]})
    more = f"<div>… {len(result.rows) - len(rows)} more in .rows</div>" if len(result.rows) > len(rows) else ""
    table = _table(frame, "restores, best first")
    return f'<div class="kvviz-blame" style="{BOX}"><div>{line}</div>{table}{more}</div>'


def _svg(spec: dict) -> str:
    """A Vega-Lite spec as inline SVG (vl-convert renders it in process: no browser, no network). The namespace
    declarations go: HTML needs none for inline SVG, and so the output names no URL at all."""
    return re.sub(r'\sxmlns(:\w+)?="[^"]*"', "", to_svg(spec))


def sweep_html(sweep: Sweep | pd.DataFrame, measure: str = "kl_mean") -> str:
    """A sweep's table as the damage-vs-budget chart (the Sweeps tab's), with its number of cases."""
    table = sweep.table if isinstance(sweep, Sweep) else sweep
    line = f"<b>sweep</b> · {len(table)} cases · {table['policy'].nunique()} policies"
    chart = _svg(damage_chart(table, measure).to_dict())
    return f'<div class="kvviz-sweep" style="{BOX}"><div>{line}</div>{chart}</div>'


class Html:
    """Static HTML any notebook front end displays (``_repr_html_``; marimo and Jupyter alike)."""

    def __init__(self, text: str):
        self.text = text

    def _repr_html_(self) -> str:
        return self.text


RENDERERS = {Session: session_html, WhatIf: what_if_html, PolicyRun: policy_run_html, Blame: blame_html,
             Sweep: sweep_html, pd.DataFrame: sweep_html}  # kvviz/__init__.py's _VIEWS names the first five


def html(value: object, **settings) -> Html:
    """The rich output of a Session, WhatIf, PolicyRun, Blame or Sweep (or a sweep's table), as an object any front
    end displays (marimo too); ``settings`` go to the renderer (e.g. ``at``, ``layer``, ``head`` for a session)."""
    for kind, render in RENDERERS.items():
        if isinstance(value, kind):
            return Html(render(value, **settings))
    raise TypeError(f"kvviz has no notebook view of {type(value).__name__}")
