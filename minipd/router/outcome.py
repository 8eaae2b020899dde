"""How a try, or a request, ended: one outcome, told with one reason string.

A try ends FINISHED (it returned the request's final output), in one of the failures below
(`attempt.AttemptFailed` carries which), ABORTED (the request was aborted while it ran) or
INTERNAL (the router itself failed: a bug). A request ends FINISHED, ABORTED (`Router.abort`,
no reason), FAILED (`Router.abort_all`, saying why), INTERNAL, or with the failure of its
last try. What the router does with a failed try follows from its outcome alone:

| outcome      | the try                                                      | tried again | counted | error kind    |
|--------------|--------------------------------------------------------------|-------------|---------|---------------|
| STALE        | refused for a stale role epoch (the instance switched roles) | yes         | no      |               |
| BUSY         | no KV room on its decode instance, another may have some     | yes         | no      |               |
| LOST         | its instance died, was declared dead or went silent          | yes         | yes     | instance_lost |
| FAILED       | its instance refused it or ended it with an error            | yes         | yes     |               |
| INVALID      | refused as invalid (it would be refused anywhere)            | no          | yes     |               |
| OVERLOADED   | no KV room on the last decode instance within `kv_wait_s`    | no          | yes     | overloaded    |
| KV_FAILED    | its KV did not load, under `kv_load_failure=fail`             | no          | yes     |               |
| NO_DECODE    | no decode instance to pick                                   | no          | yes     |               |
| DECODES_LOST | no decode instance to pick, some of them lost                | no          | yes     | instance_lost |

"Counted": against the tries a request may fail (`router.MAX_ATTEMPTS`); a stale or busy
refusal excludes its instance from the next try, so they end. Only a LOST try may migrate
(migration.py).
"""

from __future__ import annotations

import enum

from minipd.engine.request import INSTANCE_LOST, OVERLOADED


class Outcome(enum.Enum):
    FINISHED = "finished"
    ABORTED = "aborted"
    INTERNAL = "internal"
    STALE = "stale"
    BUSY = "busy"
    LOST = "lost"
    FAILED = "failed"
    INVALID = "invalid"
    OVERLOADED = "overloaded"
    KV_FAILED = "kv_failed"
    NO_DECODE = "no_decode"
    DECODES_LOST = "decodes_lost"

    @property
    def may_retry(self) -> bool:
        """A failed try: whether another try may succeed."""
        return self in _MAY_RETRY

    @property
    def counted(self) -> bool:
        """A failed try: whether it counts against the tries a request may fail."""
        return self not in (Outcome.STALE, Outcome.BUSY)

    @property
    def failed_try(self) -> bool:
        """Whether this is how a try fails (an `AttemptFailed`), not how it or its request ends otherwise."""
        return self not in (Outcome.FINISHED, Outcome.ABORTED, Outcome.INTERNAL)

    @property
    def error_kind(self) -> str | None:
        """The `RequestOutput.error_kind` of a request that ends so (None: none in particular)."""
        return _ERROR_KINDS.get(self)


_MAY_RETRY = frozenset({Outcome.STALE, Outcome.BUSY, Outcome.LOST, Outcome.FAILED})
_ERROR_KINDS = {Outcome.OVERLOADED: OVERLOADED, Outcome.LOST: INSTANCE_LOST, Outcome.DECODES_LOST: INSTANCE_LOST}
