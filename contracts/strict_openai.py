"""Strict parsing of OpenAI-compatible response bodies, by the `openai` package's own models.

Every body is checked twice: first that each field the model marks required (`is_required()`,
walked recursively through nested models, lists and optionals) is present in the raw JSON,
so that an error names the missing path (`choices[0].finish_reason`); then that the model's
`model_validate` accepts it. A server whose bodies pass is readable by any client that reads
the raw JSON the way OpenAI documents it, not only by openai-python (which builds stream
chunks without validating them and so accepts almost anything).

One deliberate difference, for streamed completions only: OpenAI's `Completion` model types
`choices[].finish_reason` as non-null, yet OpenAI's own completion streams send null until
the last chunk (openai-python parses those chunks into `Completion` without validation). The
chunk model is therefore `Completion` with exactly that field made nullable, still required.
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any, Union

from openai.types import Completion, CompletionChoice
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel, ValidationError

COMPLETIONS_PATH = "/v1/completions"
CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
_UNION_ORIGINS = (Union, types.UnionType)  # Optional[X] and X | None


FinishReason = CompletionChoice.model_fields["finish_reason"].annotation  # the values openai allows


class StreamedCompletionChoice(CompletionChoice):
    """`CompletionChoice` whose `finish_reason` may be null (but must be present)."""

    finish_reason: FinishReason | None  # type: ignore[valid-type]


class CompletionChunk(Completion):
    """One `data:` event of a streamed `/v1/completions` response."""

    choices: list[StreamedCompletionChoice]


class ResponseKind(enum.Enum):
    """What a body must be, with the model that checks it."""

    COMPLETION = Completion
    COMPLETION_CHUNK = CompletionChunk
    CHAT_COMPLETION = ChatCompletion
    CHAT_COMPLETION_CHUNK = ChatCompletionChunk

    @classmethod
    def for_endpoint(cls, path: str, stream: bool) -> ResponseKind:
        """The kind a 200 answer of `path` carries (`stream`: each server-sent event)."""
        if path.endswith(CHAT_COMPLETIONS_PATH):
            return cls.CHAT_COMPLETION_CHUNK if stream else cls.CHAT_COMPLETION
        if path.endswith(COMPLETIONS_PATH):
            return cls.COMPLETION_CHUNK if stream else cls.COMPLETION
        raise ValueError(f"no OpenAI response model for endpoint {path!r}")


class StrictResponseError(ValueError):
    """A body that an OpenAI client may refuse; `path` names the first offending field."""

    def __init__(self, kind: ResponseKind, path: str, detail: str):
        super().__init__(f"{kind.value.__name__}: {path}: {detail}")
        self.kind, self.path, self.detail = kind, path, detail


def _models_in(annotation: Any) -> tuple[type[BaseModel], ...]:
    """The pydantic models an annotation may hold directly (through Optional/Union/Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return (annotation,)
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in _UNION_ORIGINS:
        return tuple(m for arg in typing.get_args(annotation) for m in _models_in(arg))
    return ()


def _list_item(annotation: Any) -> Any | None:
    """The item annotation of a list annotation (through Optional/Annotated), else None."""
    origin = typing.get_origin(annotation)
    if origin in (list, list):
        return typing.get_args(annotation)[0]
    if origin is typing.Annotated:
        return _list_item(typing.get_args(annotation)[0])
    if origin in _UNION_ORIGINS:
        items = [item for arg in typing.get_args(annotation) if (item := _list_item(arg)) is not None]
        return items[0] if items else None
    return None


def missing_required(raw: Any, model: type[BaseModel], prefix: str = "") -> list[str]:
    """Paths of the fields `model` requires that `raw` lacks, recursively; empty when complete.

    Nested values are checked against the model their annotation names; a union of several
    models is satisfied when any one of them is.
    """
    if not isinstance(raw, dict):
        return []
    missing: list[str] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{prefix}{key}"
        if key not in raw:
            if field.is_required():
                missing.append(path)
            continue
        missing += _missing_in_value(raw[key], field.annotation, path)
    return missing


def _missing_in_value(value: Any, annotation: Any, path: str) -> list[str]:
    if isinstance(value, list):
        item = _list_item(annotation)
        if item is None:
            return []
        return [m for i, element in enumerate(value) for m in _missing_in_value(element, item, f"{path}[{i}]")]
    if isinstance(value, dict):
        candidates = [missing_required(value, model, f"{path}.") for model in _models_in(annotation)]
        if candidates and all(candidates):
            return min(candidates, key=len)
    return []


def parse_strict(raw: Any, kind: ResponseKind) -> BaseModel:
    """`raw` (decoded JSON) as `kind`'s model; raises StrictResponseError naming the first problem."""
    model = kind.value
    if not isinstance(raw, dict):
        raise StrictResponseError(kind, "$", f"expected a JSON object, got {type(raw).__name__}")
    missing = missing_required(raw, model)
    if missing:
        raise StrictResponseError(
            kind, missing[0], "required field missing" + (f" (also: {', '.join(missing[1:])})" if missing[1:] else "")
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".")
        raise StrictResponseError(kind, path or "$", error["msg"]) from None


for _kind in ResponseKind:  # openai's models defer building their validators to the first use;
    _kind.value.model_rebuild(force=True)  # build them now, so no timed request pays for it


def strict_completion_chunk(raw: Any) -> BaseModel:
    """One streamed `/v1/completions` event, checked strictly: the load client's parser in the
    benchmarks (`minipd.ops.loadgen.client.ChunkParser`)."""
    return parse_strict(raw, ResponseKind.COMPLETION_CHUNK)
