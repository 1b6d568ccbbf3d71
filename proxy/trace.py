"""The TrainingTrace contract: validated token capture, JSON-compatible with OpenEnv schema version 1.

One `TrainingTurn` is one engine call: the engine's prompt ids, the sampled ids, one behaviour
logprob per sampled id, and a loss mask over prompt + completion (prompt positions 0, completion
positions 1 = trained or 0 = context). A `TrainingTrace` is a list of turns with unique node ids.
Field names, `strict` types, `extra="forbid"` and the rejection rules match
`openenv.core.harness.training`, so a trace serialised by either side validates on the other.

Every rejection names a rule code and where it happened, e.g.
`logprob_misalign at turns[3].per_token_logps: 2 logprobs for 3 completion tokens`. Codes:

    invalid_token_id    an id that is not a non-negative int (bools rejected)
    no_prompt_ids       an empty prompt
    invalid_logprob     a logprob that is not a finite number (bools rejected)
    positive_logprob    a logprob > 0
    logprob_misalign    logprob count != completion length
    length_mismatch     loss mask length != prompt + completion length
    invalid_loss_mask   a mask value other than int 0 or 1
    trainable_prompt    a 1 in the prompt span of the mask
    invalid_node_id     a node id that is not a non-empty string
    duplicate_node_id   the same node id on two turns
    schema_version      a schema version other than 1
    missing_field       a required field is absent (the loss mask included)
    extra_field         a field the schema does not define
    invalid_field       any other type error (request/response/metadata not a dict, ...)

Allowed: an empty completion, an all-zero or partial mask, a logprob of exactly 0.0, and integer
logprobs (coerced to float).

Validation is bulk, not per token in Python: pydantic-core checks element types (and finiteness
and sign of logprobs) in Rust, then C-level `min`/`count`/`sum` passes check id signs and the mask;
a per-position scan runs only to locate a failure that was already detected.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, Literal, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SCHEMA_VERSION = 1

Logprob = Annotated[float, Field(le=0, allow_inf_nan=False)]


class Violation(NamedTuple):
    """One broken rule: its code, where it broke (`turns[2].loss_mask[7]`), and what was found."""

    code: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.code} at {self.where}: {self.detail}" if self.where else f"{self.code}: {self.detail}"


class CaptureContractError(ValueError):
    """A capture or trace that breaks the TrainingTrace contract.

    Raised directly at the capture boundary; inside pydantic validation it is wrapped in a
    `ValidationError` (also a `ValueError`) whose message carries every violation's code and place.
    """

    def __init__(self, violations: list[Violation]) -> None:
        self.violations = tuple(violations)
        super().__init__("; ".join(map(str, violations)))

    @property
    def code(self) -> str:
        """Code of the first violation."""
        return self.violations[0].code


_FIELD_CODES = {
    "prompt_token_ids": "invalid_token_id",
    "completion_token_ids": "invalid_token_id",
    "per_token_logps": "invalid_logprob",
    "loss_mask": "invalid_loss_mask",
    "node_id": "invalid_node_id",
    "schema_version": "schema_version",
}


def _where(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _translate(exc: ValidationError) -> list[Violation]:
    """Map pydantic's errors onto rule codes; nested contract errors keep theirs, re-rooted at `loc`."""
    out: list[Violation] = []
    for err in exc.errors():
        loc = err["loc"]
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, CaptureContractError):
            prefix = _where(loc)
            for v in inner.violations:
                where = f"{prefix}.{v.where}" if prefix and v.where else (prefix or v.where)
                out.append(v._replace(where=where))
            continue
        kind = err["type"]
        field = next((part for part in reversed(loc) if isinstance(part, str)), "")
        if kind == "missing":
            code = "missing_field"
        elif kind == "extra_forbidden":
            code = "extra_field"
        elif field == "per_token_logps" and kind == "less_than_equal":
            code = "positive_logprob"
        else:
            code = _FIELD_CODES.get(field, "invalid_field")
        detail = err["msg"] if kind == "missing" else f"{err['msg']}, got {_short(err['input'])}"
        out.append(Violation(code, _where(loc), detail))
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _first(values: list[Any], bad: Callable[[Any], bool]) -> int:
    """Index of the first value for which `bad(value)` holds; only called once a bulk check failed."""
    return next(i for i, x in enumerate(values) if bad(x))


def token_id_violations(ids: list[Any], where: str, offset: int = 0) -> list[Violation]:
    """Violations of `ids` being non-negative ints (bools rejected); bulk-checked, located on failure.

    `offset` is added to reported positions, for a slice of a longer list.
    """
    if not ids:
        return []
    if set(map(type, ids)) <= {int}:
        if min(ids) >= 0:
            return []
        i = _first(ids, lambda x: x < 0)
    else:
        i = _first(ids, lambda x: type(x) is not int or x < 0)
    return [Violation("invalid_token_id", f"{where}[{offset + i}]", f"{_short(ids[i])} is not a non-negative int")]


def _misalign(n_logprobs: int, n_completion: int, where: str) -> Violation:
    return Violation("logprob_misalign", where, f"{n_logprobs} logprobs for {n_completion} completion tokens")


def _not_finite(x: float) -> bool:
    try:
        return not math.isfinite(x)
    except OverflowError:
        return True


def logprob_violations(logprobs: list[Any], n_completion: int, where: str) -> list[Violation]:
    """Violations of `logprobs` being `n_completion` finite, non-positive int or float values."""
    out = []
    if len(logprobs) != n_completion:
        out.append(_misalign(len(logprobs), n_completion, where))
    if not logprobs:
        return out
    if not set(map(type, logprobs)) <= {float, int}:
        i = _first(logprobs, lambda x: type(x) not in (float, int))
        out.append(Violation("invalid_logprob", f"{where}[{i}]", f"{_short(logprobs[i])} is not a number"))
        return out
    try:
        finite = math.isfinite(sum(logprobs))
    except OverflowError:
        finite = False
    if not finite and any(map(_not_finite, logprobs)):
        i = _first(logprobs, _not_finite)
        out.append(Violation("invalid_logprob", f"{where}[{i}]", f"{_short(logprobs[i])} is not finite"))
    elif max(logprobs) > 0:
        i = _first(logprobs, lambda x: x > 0)
        out.append(Violation("positive_logprob", f"{where}[{i}]", f"{logprobs[i]!r} is positive"))
    return out


def _negative_ids(ids: list[int], where: str) -> list[Violation]:
    """Sign check for ids whose int type pydantic already enforced."""
    if not ids or min(ids) >= 0:
        return []
    i = _first(ids, lambda x: x < 0)
    return [Violation("invalid_token_id", f"{where}[{i}]", f"{ids[i]} is not a non-negative int")]


def _mask_violations(n_prompt: int, n_completion: int, loss_mask: list[int]) -> list[Violation]:
    """Violations of the mask rules for int-typed `loss_mask`: length, values 0/1, zero prompt span."""
    n = n_prompt + n_completion
    if len(loss_mask) != n:
        return [
            Violation(
                "length_mismatch",
                "loss_mask",
                f"{len(loss_mask)} entries for {n_prompt} prompt + {n_completion} completion tokens",
            )
        ]
    if loss_mask.count(0) + loss_mask.count(1) != n:
        i = _first(loss_mask, lambda m: m != 0 and m != 1)
        return [Violation("invalid_loss_mask", f"loss_mask[{i}]", f"{_short(loss_mask[i])} is not 0 or 1")]
    if sum(loss_mask[:n_prompt]):
        i = loss_mask.index(1)
        return [Violation("trainable_prompt", f"loss_mask[{i}]", f"prompt position {i} is marked trainable")]
    return []


class TrainingTurn(BaseModel):
    """One engine call; `loss_mask` covers prompt + completion and is 0 over the prompt."""

    model_config = ConfigDict(strict=True, extra="forbid")

    node_id: str = Field(min_length=1)
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    per_token_logps: list[Logprob]
    loss_mask: list[int]
    request: dict[str, Any] = Field(default_factory=dict)
    response: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _contract(cls, data: Any, handler: Any) -> TrainingTurn:
        try:
            turn = handler(data)
        except ValidationError as exc:
            raise CaptureContractError(_translate(exc)) from None
        prompt, completion, logps = turn.prompt_token_ids, turn.completion_token_ids, turn.per_token_logps
        problems = _negative_ids(prompt, "prompt_token_ids") + _negative_ids(completion, "completion_token_ids")
        if not prompt:
            problems.append(Violation("no_prompt_ids", "prompt_token_ids", "the prompt is empty"))
        if len(logps) != len(completion):
            problems.append(_misalign(len(logps), len(completion), "per_token_logps"))
        problems += _mask_violations(len(prompt), len(completion), turn.loss_mask)
        if problems:
            raise CaptureContractError(problems)
        return turn


class TrainingTrace(BaseModel):
    """The turns of one rollout, each node id at most once (a shared node is supervised once).

    `model_dump_json` / `model_validate_json` are the wire format; `to_json` / `from_json` write
    and read the same bytes through orjson, which is faster on large traces.
    """

    model_config = ConfigDict(strict=True, extra="forbid")

    schema_version: Literal[1] = SCHEMA_VERSION
    turns: list[TrainingTurn]

    @model_validator(mode="wrap")
    @classmethod
    def _contract(cls, data: Any, handler: Any) -> TrainingTrace:
        try:
            trace = handler(data)
        except ValidationError as exc:
            raise CaptureContractError(_translate(exc)) from None
        seen: dict[str, int] = {}
        problems = []
        for i, turn in enumerate(trace.turns):
            first = seen.setdefault(turn.node_id, i)
            if first != i:
                problems.append(
                    Violation("duplicate_node_id", f"turns[{i}].node_id", f"{turn.node_id!r} is also turns[{first}]")
                )
        if problems:
            raise CaptureContractError(problems)
        return trace

    @classmethod
    def from_json(cls, data: bytes | str) -> TrainingTrace:
        """Parse and validate a serialised trace (same result as `model_validate_json`)."""
        return cls.model_validate(orjson.loads(data))

    def to_json(self) -> bytes:
        """The bytes of `model_dump_json()`, serialised by orjson."""
        fields = tuple(TrainingTurn.model_fields)
        turns = [{name: getattr(turn, name) for name in fields} for turn in self.turns]
        return orjson.dumps({"schema_version": self.schema_version, "turns": turns})

    @classmethod
    def from_entries(cls, entries: list[dict[str, Any]]) -> TrainingTrace:
        """The trace of TRL/OpenEnv ``TraceEntry`` records (``node_id`` in ``metadata``); nothing inferred.

        Validated like any trace: a record without ``node_id``, ids, logprobs or a mask is a
        ``CaptureContractError``.
        """
        turns = []
        for i, entry in enumerate(entries):
            metadata = dict(entry.get("metadata") or {})
            node_id = metadata.pop("node_id", None)
            if not isinstance(node_id, str):
                raise CaptureContractError([Violation("no_node_id", f"entries[{i}].metadata.node_id", "missing")])
            turns.append(
                {
                    "node_id": node_id,
                    **{k: entry.get(k) for k in ("prompt_token_ids", "completion_token_ids", "per_token_logps")},
                    "loss_mask": entry.get("loss_mask"),
                    "request": entry.get("request") or {},
                    "response": entry.get("response") or {},
                    "metadata": metadata,
                }
            )
        return cls.model_validate({"schema_version": SCHEMA_VERSION, "turns": turns})

    def to_trace_entries(self, turns: list[TrainingTurn] | None = None) -> list[dict[str, Any]]:
        """``TraceEntry`` records of ``turns`` (default: all), ``node_id`` moved into ``metadata``.

        The records share the turns' id, logprob and mask lists (no copy): treat them as read-only.
        """
        return [
            {
                "prompt_token_ids": turn.prompt_token_ids,
                "completion_token_ids": turn.completion_token_ids,
                "per_token_logps": turn.per_token_logps,
                "loss_mask": turn.loss_mask,
                "request": turn.request,
                "response": turn.response,
                "metadata": {**turn.metadata, "node_id": turn.node_id},
            }
            for turn in (self.turns if turns is None else turns)
        ]
