"""What readers see, made from what the sweeps, benches and compiles wrote: the LRA chart and its tables, the
results summary, and the generated docs pages and README block."""
