"""Interactive widgets of the book (anywidget). The model code never imports this package.

Every widget draws from data computed in Python, so it responds in the static HTML of the
book without a kernel, and asks Python for new data when a kernel is there.
"""

from tfbook.widgets.attention import AttentionExample, AttentionMap
from tfbook.widgets.base import Widget
from tfbook.widgets.bpe import BPEMergesWidget
from tfbook.widgets.explorer import ModelExplorer
from tfbook.widgets.heads import HeadExplorer
from tfbook.widgets.positions import PositionalEncodingExplorer
from tfbook.widgets.rope import RopeExplorer
from tfbook.widgets.sampling import SamplingWidget
from tfbook.widgets.tokens import TokenView

__all__ = [
    "AttentionExample",
    "AttentionMap",
    "BPEMergesWidget",
    "HeadExplorer",
    "ModelExplorer",
    "PositionalEncodingExplorer",
    "RopeExplorer",
    "SamplingWidget",
    "TokenView",
    "Widget",
]
