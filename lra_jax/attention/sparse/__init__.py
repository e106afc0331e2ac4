"""Fixed sparse patterns: sliding windows, strides, global tokens and random blocks (local, strided, Longformer, BigBird)."""
