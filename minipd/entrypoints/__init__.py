"""How minipd is started: the `minipd` command and its flag spec, the typed configs the parsed
flags become (`configs.py`), the role runners, and the launchers of whole clusters
(processes on this host, or in one asyncio program).

The top layer: it may import every other; nothing imports it.
"""
