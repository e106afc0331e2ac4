"""Measurement: step timing and profiles, FLOPs, device peaks, host memory, accelerator targets, fit planning."""
