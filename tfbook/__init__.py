"""tfbook: transformers from scratch in PyTorch, the companion package of the tfbook book.

The model code lives in one module per concept (tokenizers, embeddings, positions, attention,
blocks, models); the book's chapters import it. ``tfbook.show`` renders the real source of
any of its functions or classes in a chapter.
"""

from tfbook.source import show

__all__ = ["show"]
__version__ = "0.1.0"
