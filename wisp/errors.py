"""User-facing errors.

`WispError` is the one exception type whose message is meant for the user: the CLI prints it as a
single line on stderr and exits with status 2. Anything else escaping is a bug.
"""


class WispError(Exception):
    """A problem with the user's input (model path, checkpoint, flags, prompt), explained in one line."""


class InvalidParameter(WispError):
    """A WispError about one named request parameter (`param`); the HTTP API reports it as the OpenAI
    error object's `param`."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param
