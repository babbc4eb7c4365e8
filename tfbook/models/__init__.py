"""The three families of the book: encoder-decoder, decoder-only (GPT), encoder-only (BERT)."""
