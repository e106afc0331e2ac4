"""Learned sparse patterns: which keys a query sees is computed from the input (Reformer's hashing, Routing's clustering, Sinkhorn's sorting)."""
