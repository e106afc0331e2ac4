"""Commands for experiments: lowering for accelerators (and, as they move here, bench, sweep, chart)."""
