"""Interactive widgets of the book (anywidget). The model code never imports this package.

Every widget draws from data computed in Python, so it responds in the static HTML of the
book without a kernel, and asks Python for new data when a kernel is there.
"""

from tfbook.widgets.attention import AttentionExample, AttentionMap
from tfbook.widgets.base import Widget
from tfbook.widgets.positions import PositionalEncodingExplorer

__all__ = ["AttentionExample", "AttentionMap", "PositionalEncodingExplorer", "Widget"]
