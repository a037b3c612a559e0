"""`wisp bench soak`: `wisp serve` under mixed traffic, disconnects, bad requests and live resizes
(RELIABILITY.md "## Soak"). The clients are the openai and httpx packages (the test extras): without them,
importing this package is one WispError, so the command says so in one line.
"""

try:
    import httpx  # noqa: F401
    import openai  # noqa: F401
except ImportError as exc:
    from wisp.errors import WispError

    raise WispError(f"wisp bench soak needs the openai and httpx packages ({exc.name} is missing): "
                    "pip install openai httpx") from None
