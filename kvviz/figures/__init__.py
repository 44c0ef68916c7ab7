"""Data → figures (plotly) and tables (pandas). Pure functions of library objects, testable without a browser."""

from kvviz.figures.attention import head_map_figure, overview_figure, row_figure
from kvviz.figures.export import figures_html
from kvviz.figures.growth import SEGMENT_COLOURS, growth
from kvviz.figures.whatif import alpha_figure, head_grid_figure, hidden_figure, topk_frame

__all__ = ["SEGMENT_COLOURS", "alpha_figure", "figures_html", "growth", "head_grid_figure", "head_map_figure", "hidden_figure",
           "overview_figure", "row_figure", "topk_frame"]
