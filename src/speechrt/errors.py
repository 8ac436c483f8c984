"""The one error type users see: its message is printed as a single line by the CLI and
returned as a JSON error by the server."""


class SpeechRTError(Exception):
    """A problem with the user's input, files or models (not a bug in speechrt)."""
