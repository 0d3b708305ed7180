"""The runner's error for bad input: a suite config (or the flags standing for one) is invalid."""


class SuiteError(ValueError):
    """A suite config is invalid; the message names the file (or the command line) and the key."""
