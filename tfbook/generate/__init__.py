"""Generating text: sampling rules and the decoding loops."""
