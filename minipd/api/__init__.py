"""The OpenAI-compatible HTTP API: protocol structs, handlers, errors, chat templates, metrics,
and the serving backends it runs on (one colocated engine, or a router).

Imports the layers below (engine, router); never the command line.
"""
