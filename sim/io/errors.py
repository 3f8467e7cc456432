"""User-facing errors: the CLI prints the message and exits with code 2, never a traceback."""


class SimError(Exception):
    """Bad input or an impossible configuration, with a message meant for the user."""
