"""Synthesized attention: the attention matrix is produced without query-key dot products (Synthesizer)."""
