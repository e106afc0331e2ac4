"""Configuration: the base config every variant file starts from, config paths, flag checks."""
