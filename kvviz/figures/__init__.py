"""Data → figures (plotly; the what-if's charts Vega-Lite specs) and tables (pandas). Pure functions of library
objects, testable without a browser."""

from kvviz.figures.attention_maps import head_map_figure, overview_figure, row_figure
from kvviz.figures.growth import SEGMENT_COLOURS, growth
from kvviz.figures.policy_run_charts import bit_widths, cache_size, kl_steps, timeline
from kvviz.figures.offline_html import figures_html
from kvviz.figures.sweep_charts import damage_chart
from kvviz.figures.whatif_charts import alpha_chart, head_grid_chart, hidden_chart, topk_frame

__all__ = ["SEGMENT_COLOURS", "alpha_chart", "bit_widths", "cache_size", "damage_chart", "kl_steps", "timeline", "figures_html", "growth", "head_grid_chart", "head_map_figure", "hidden_chart",
           "overview_figure", "row_figure", "topk_frame"]
