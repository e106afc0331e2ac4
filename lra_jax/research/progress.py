"""Progress lines of the long-running commands (bench, sweep)."""


def print_now(line: str) -> None:
    """Prints `line` at once, also when stdout is a file (a long run under nohup or Slurm) and
    before the output of a child process that follows it."""
    print(line, flush=True)
