"""The one error type users see: its message is printed as a single line by the CLI and
returned as a JSON error by the server."""


class SpeechRTError(Exception):
    """A problem with the user's input, files or models (not a bug in speechrt)."""


class ServerError(SpeechRTError):
    """A `speechrt serve` answered a client (speechrt.client) with an error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"server error {status}: {message}")
        self.status = status


class MaxDecoderStepsWarning(UserWarning):
    """An autoregressive model stopped at its step limit before its stop gate fired.

    `item` is the row of the batch given to the model; pipelines re-issue it naming the text.
    """

    def __init__(self, message: str, item: int = -1) -> None:
        super().__init__(message)
        self.item = item
