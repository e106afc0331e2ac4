"""The bench: train and eval steps timed and measured on this machine's device, cell by cell, and its report."""
