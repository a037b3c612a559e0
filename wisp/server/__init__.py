"""The OpenAI-compatible HTTP server behind `wisp serve`: protocol models, routes, streaming, metrics.

Import `wisp.server.app.build_app`; nothing here starts a server or touches the engine on import.
"""
