"""Job ids are per submitter: the key a job is stored under, and the id each caller sees.

With tokens (``[auth]``), a job is stored under its *key*, ``NAME:ID``: ``NAME`` is the
name of the token it was submitted with, ``ID`` the id in its spec. Two tenants can
both run a job ``train-1``, neither learns that the other has one, and neither can
take an id the other will want (before, ids were one namespace: a tenant's job
``train-1`` made every other tenant's ``train-1`` ALREADY_EXISTS, and told them it
existed).

- A *submitter* (``Role.SUBMITTER``) names its own jobs by their ids, in every call
  (``GetJob``, ``CancelJob``, ``GetProgress``, the console), and sees them so in every
  answer, specs included.
- An *operator* sees every job by its key, and names one so: ``alice:train-1``. A job
  an operator submits is keyed by the operator's token name too.
- Without tokens every caller is the anonymous operator, and a key is the id: nothing
  changes for the embedded defaults, replays and traces.

Keys are what the store, the ledger, the event log and MQTT (``jobs/<key>/events``, the
plans' tasks) carry; a key is at most :data:`~pricing.fields.MAX_JOB_KEY_CHARS`
characters, and ``:`` is in no id (:func:`pricing.fields.job_id`), so ``NAME:ID`` is
never another job's id. Jobs stored before migration 0008 were keyed by their id; the
migration gave each job with a submitter its key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from controller.errors import ConflictError, NotFoundError, PreconditionError
from pricing import fields
from pricing.errors import SpecError

if TYPE_CHECKING:  # the admission keys its jobs without the gRPC side
    from controller.auth import Caller

_T = TypeVar("_T")

SUBMITTER_ROLE = "submitter"
"""``controller.auth.Role.SUBMITTER``'s value."""

__all__ = [
    "SEPARATOR",
    "as_named",
    "key_for",
    "key_of",
    "keyed_spec",
    "shown",
    "shown_message",
    "shown_view",
]

SEPARATOR = ":"


def key_of(job_id: str, submitter: str | None) -> str:
    """The key of job ``job_id`` submitted by ``submitter`` (None: anonymous)."""
    return job_id if submitter is None else f"{submitter}{SEPARATOR}{job_id}"


def submitter_of(key: str) -> str | None:
    """The submitter a job key names (``NAME`` of ``NAME:ID``); None for a plain id."""
    return key.split(":", 1)[0] if ":" in key else None


def keyed_spec(spec: Any, submitter: str | None) -> Any:
    """A submitted ``spec`` as stored: its id the key of the job ``submitter`` submits.
    SpecError naming ``job.id`` unless that is an id (:func:`pricing.fields.job_id`)."""
    job_id = fields.text(spec.get("id") if isinstance(spec, dict) else None, "job.id")
    fields.job_id(job_id, "job.id")
    return spec if submitter is None else {**spec, "id": key_of(job_id, submitter)}


def key_for(caller: Caller, named: str, field: str = "id") -> str:
    """The key of the job ``caller`` names ``named``: a submitter's own id, or an
    operator's key as given. SpecError (INVALID_ARGUMENT) naming ``field`` if it can
    name no job (a submitter's id with a ``:`` in it, say)."""
    if caller.role == SUBMITTER_ROLE:
        name, sep, job_id = named.partition(SEPARATOR) if isinstance(named, str) else ("", "", "")
        if sep and name == caller.name:  # its key as `oasis jobs` shows an operator
            raise SpecError.one(
                field, f"{named!r} is your job's key as operators see it; you name your "
                f"jobs by their ids alone: {job_id!r}",
            )  # fmt: skip
        if sep:
            raise SpecError.one(
                field, f"a submitter names its own jobs by their ids alone, without "
                f"NAME{SEPARATOR} (got {named!r})",
            )  # fmt: skip
        return key_of(fields.job_id(named, field), caller.name)
    return fields.job_key(named, field)


def shown(caller: Caller, key: str) -> str:
    """How ``caller`` sees the job stored under ``key``: a submitter its own jobs' ids."""
    if caller.role == SUBMITTER_ROLE:
        prefix = f"{caller.name}{SEPARATOR}"
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


def shown_view(caller: Caller, view: Any) -> Any:
    """A :class:`~controller.admission.views.JobView` (or anything with ``id`` and a
    ``spec`` dict) as ``caller`` sees it: its id, and its spec's, shown."""
    name = shown(caller, view.id)
    if name == view.id:
        return view
    spec = view.spec
    if isinstance(spec, dict) and spec.get("id") == view.id:
        spec = {**spec, "id": name}
    return dataclasses.replace(view, id=name, spec=spec)


def shown_message(caller: Caller, key: str, message: str) -> str:
    """An error's ``message`` about job ``key`` with the key as ``caller`` names it."""
    name = shown(caller, key)
    return message if name == key else message.replace(repr(key), repr(name))


async def as_named(caller: Caller, key: str, call: Awaitable[_T]) -> _T:
    """``call``, its errors about job ``key`` naming the job as ``caller`` does
    (:func:`shown_message`); an operator's missing job without ``NAME:`` is told so."""
    try:
        return await call
    except (NotFoundError, ConflictError, PreconditionError) as err:
        message = shown_message(caller, key, str(err))
        operator = caller.name and caller.role != SUBMITTER_ROLE  # a submitter's id?
        if isinstance(err, NotFoundError) and operator and SEPARATOR not in key:
            message += f"; a job submitted with a token is NAME{SEPARATOR}ID, as ListJobs shows"
        if message == str(err):
            raise
        raise type(err)(message) from None
