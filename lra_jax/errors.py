"""Errors the user can fix: the CLI prints their message on one line and exits non-zero."""


class LraError(Exception):
    """A problem with the user's input; the message names the problem and the fix."""


class ConfigError(LraError):
    """An unknown variant, setting or value in the configuration."""


class DataError(LraError):
    """Missing or malformed data files."""
