"""A job type's guardrails on its way to the provider and back (`JobDefinition.guardrails`).

In this order, for every call of a job (an attempt, a chunk, a batch line):

1. **mask** (`pii: mask`): the job's input, as stored, with its e-mail addresses and phone
   numbers replaced by placeholders (engine/pii.py), before any prompt is built: the create's
   estimate and chunk plan (jobs/requests.py), each call's prompt (jobs/calls.py), a batch
   line (jobs/batch_job.py). The same input always masks the same way, so the map is derived
   again wherever it is needed and never stored, logged or sent to Temporal;
2. the call;
3. **moderate** (`moderation` not `off`, AI_MODERATION_MODEL set): the answer's items (its
   list of items, `ChunkSpec.items_field`, else the whole answer as one) as the provider wrote
   them, placeholders and all, through the moderation endpoint (providers/moderation.py):
   `fail` ends the job CONTENT_SAFETY_BLOCKED on any flagged item, `drop_item` drops the
   flagged ones (counted in `result.flaggedItems`) and fails only when every item is flagged;
4. **restore**: each placeholder replaced by the original text, as the input wrote it;
5. **validate** (jobs/output.py), then publish (streamed items, the stored output, the
   artifacts, the webhook).

A moderation call that fails is `MODERATION_UNAVAILABLE` (retryable): EXECUTE keeps the answer
(`held_answer`) and the retry moderates it again without a new call; it never counts on the
chat provider's breaker nor moves the call to a fallback. The moderation call costs nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from engine.errors import ExecutionFailure
from engine.pii import NO_MASKING, Masking, mask
from jobs.output import Validated, validated_answer, validated_output
from jobs.spec import AnyJobType
from providers.moderation import UNAVAILABLE, Moderator

# Past this many characters the masking of an input runs on a thread (a long source).
_OFF_LOOP_CHARS = 20_000


@dataclass(frozen=True)
class GuardrailConfig:
    """The deployment's side of the guardrails: where phone numbers are read
    (AI_PII_PHONE_REGION) and the moderation endpoint (None: no moderation)."""

    pii_region: str = "US"
    moderator: Moderator | None = None


def masked_input(jt: AnyJobType, model: BaseModel, region: str) -> tuple[BaseModel, Masking]:
    """The input a prompt is built from: `model` itself, or (`pii: mask`) the same input with
    its e-mail addresses and phone numbers replaced, and the map back."""
    if jt.definition.guardrails.pii != "mask":
        return model, NO_MASKING
    data = model.model_dump(mode="json", by_alias=True)
    masked, masking = mask(data, region)
    if not masking:
        return model, masking
    try:
        return jt.input_model.model_validate(masked), masking
    except ValidationError:
        # A placeholder longer than what it replaced broke a length bound: the masked values
        # are set as they are (the prompt only reads them).
        update = {
            name: masked.get(f.alias or name, getattr(model, name))
            for name, f in type(model).model_fields.items()
        }
        return model.model_copy(update=update), masking


def stored_input(jt: AnyJobType, snapshot_input: Any, region: str) -> tuple[BaseModel, Masking]:
    """A stored input (laxly re-read, as EXECUTE reads it) and its masked form."""
    model: BaseModel = jt.input_model.model_validate(snapshot_input)
    return masked_input(jt, model, region)


async def stored_input_off_loop(
    jt: AnyJobType, snapshot_input: Any, region: str
) -> tuple[BaseModel, Masking]:
    """`stored_input`, on a thread when the input is long (masking 400,000 characters takes a
    few hundred milliseconds: never on the event loop that heartbeats the call)."""
    if jt.definition.guardrails.pii == "mask" and len(json.dumps(snapshot_input)) > _OFF_LOOP_CHARS:
        return await asyncio.to_thread(stored_input, jt, snapshot_input, region)
    return stored_input(jt, snapshot_input, region)


def item_text(item: Any) -> str:
    """What moderation reads of an item: its strings, one per line (keys and numbers left
    out)."""
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    walk(item)
    return "\n".join(out)


@dataclass(frozen=True)
class Guarded:
    """An answer after the guardrails: `validated` as jobs/output.py gives it, how many items
    moderation flagged (None: it did not run), and which of the answer's items were kept, in
    order (None: all)."""

    validated: Validated
    flagged: int | None = None
    kept: list[int] | None = None


def blocked(flagged: int, total: int) -> ExecutionFailure:
    return ExecutionFailure(
        "CONTENT_SAFETY_BLOCKED",
        internal_message=f"moderation flagged {flagged} of {total} output items",
        answered=True,
    )


@dataclass
class Guard:
    """One call's guardrails: the masking of its job's input and the moderation of its answer
    (its verdicts kept per item text, so the streamed items and the final answer ask once)."""

    jt: AnyJobType
    masking: Masking = NO_MASKING
    moderator: Moderator | None = None
    _verdicts: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: GuardrailConfig, jt: AnyJobType, masking: Masking = NO_MASKING) -> Guard:
        moderates = jt.definition.guardrails.moderation != "off"
        return cls(jt, masking, cfg.moderator if moderates else None)

    @property
    def moderates(self) -> bool:
        return self.moderator is not None

    @property
    def mode(self) -> str:
        return self.jt.definition.guardrails.moderation

    async def verdicts(self, texts: Sequence[str]) -> list[bool]:
        """Whether each text is flagged (MODERATION_UNAVAILABLE when the endpoint fails)."""
        assert self.moderator is not None
        unknown = list(dict.fromkeys(t for t in texts if t not in self._verdicts))
        if unknown:
            for text, flagged in zip(unknown, await self.moderator.flagged(unknown), strict=True):
                self._verdicts[text] = flagged
        return [self._verdicts[t] for t in texts]

    def items_of(self, data: Any) -> tuple[list[Any], str | None]:
        """The answer's items and the field holding them (None: the whole answer is one)."""
        spec = self.jt.chunking
        if spec is not None and isinstance(data, dict):
            items = data.get(spec.items_field)
            if isinstance(items, list):
                return items, spec.items_field
        return [data], None

    async def answer(self, content: str) -> Guarded:
        """An answer's text through moderate → restore → validate (module docstring). Raises
        MODERATION_UNAVAILABLE when the moderation endpoint fails."""
        try:
            data = json.loads(content)
        except ValueError:
            return Guarded(validated_answer(self.jt, content))
        return await self.checked(data)

    async def checked(self, data: Any) -> Guarded:
        flagged: int | None = None
        kept: list[int] | None = None
        if self.moderates:
            items, list_field = self.items_of(data)
            verdicts = await self.verdicts([item_text(i) for i in items])
            flagged = sum(verdicts)
            if flagged:
                if self.mode == "fail" or flagged == len(items) or list_field is None:
                    return Guarded((None, None, blocked(flagged, len(items))), flagged)
                kept = [n for n, v in enumerate(verdicts) if not v]
                data = {**data, list_field: [items[n] for n in kept]}
        restored = self.masking.restore(data)
        return Guarded(validated_output(self.jt, restored), flagged, kept)


def holds(failure: ExecutionFailure) -> bool:
    """Whether a failed attempt keeps its answer for the next one: its moderation could not
    run (the answer itself is paid for and may be fine)."""
    return failure.code == UNAVAILABLE


def restore_item(masking: Masking, item: Mapping[str, Any]) -> Any:
    """A streamed item (as the provider wrote it) with its placeholders restored."""
    return masking.restore(dict(item))
