"""The OpenAI-compatible HTTP API: protocol structs, handlers, errors, chat templates, metrics,
and the serving backends it runs on (one colocated engine, or a router).

Imports the layers below (engine, router); never the command line, nor an operation: the
router's admin routes and controls (minipd/ops/admin) and the dashboard (minipd/ops/dashboard)
are app extensions the command line passes to `start_api`.
"""
