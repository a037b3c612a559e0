"""User-facing errors.

`WispError` is the one exception type whose message is meant for the user: the CLI prints it as a
single line on stderr and exits with status 2. Anything else escaping is a bug.
"""


class WispError(Exception):
    """A problem with the user's input (model path, checkpoint, flags, prompt), explained in one line."""
