"""State-space and gated recurrent mixers (S4D, S5, LRU, Mega, Hyena, S6, SSD, GLA); each runs both directions for LRA and keeps a causal form."""
