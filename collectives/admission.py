"""Who may join a running job: a challenge on the secret the launcher gave the job, before any state moves.

A process that joins a job (:mod:`wagma.healing`: a replacement for a dead
rank) is handed a model, an optimizer state and a place in every
collective.  Only a process of this job may have them, so the join begins
with a proof: the launcher puts a secret in the job's environment
(:data:`SECRET_VARIABLE`, a random value that ``python -m experiments.mpirun
--fault-tolerant`` creates for each job, or one the user sets; never a
guessable one such as the job id), and over the intercommunicator that
links the job and the candidates, before they merge:

1. the job's rank 0 sends each candidate a fresh random challenge (32
   bytes, :func:`secrets.token_bytes`);
2. the candidate answers with the HMAC-SHA256 of the challenge under the
   secret in its own environment (the secret itself never goes on the wire,
   and an answer seen once is no use for the next challenge);
3. rank 0 compares in constant time (:func:`hmac.compare_digest`) and tells
   every candidate and every member of the job the verdict: ``admitted``,
   ``refused`` (a wrong answer, or none: a candidate without the secret
   answers with nothing) or ``late`` (no answer within the wait).

Only if every candidate is admitted do the two sides merge; otherwise the
job's members revoke the intercommunicator (ULFM), so that a candidate still
waiting is released with an error, and go on without any of them: a
refused candidate has received a challenge and a verdict, nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Mapping
from typing import Any, Literal

from mpi4py import MPI

__all__ = ["SECRET_VARIABLE", "Verdict", "admit", "job_secret", "new_secret", "present", "receive_within"]

#: The environment variable that holds the job's secret.
SECRET_VARIABLE = "WAGMA_JOB_SECRET"
#: What rank 0 tells a candidate.
Verdict = Literal["admitted", "refused", "late"]

_TAG_CHALLENGE, _TAG_ANSWER, _TAG_VERDICT = 4240, 4241, 4243
#: The most seconds a candidate waits for its challenge (the job sends it as soon as the spawn returns).
CHALLENGE_WAIT_S = 60.0
#: The seconds a candidate waits for its verdict beyond the job's wait for the answers.
VERDICT_GRACE_S = 30.0
#: The most seconds the job waits for a candidate that answered to take its verdict.
VERDICT_DELIVERY_S = 5.0


def new_secret() -> str:
    """A fresh secret for a job: 256 random bits, as hex."""
    return secrets.token_hex(32)


def job_secret(environ: Mapping[str, str] | None = None) -> str | None:
    """The secret the launcher gave this job, or None where it gave none."""
    return (os.environ if environ is None else environ).get(SECRET_VARIABLE) or None


def _answer(secret: str | None, challenge: bytes) -> bytes:
    return hmac.new(secret.encode(), challenge, hashlib.sha256).digest() if secret else b""


def admit(inter: MPI.Intercomm, members: MPI.Intracomm, secret: str, wait_s: float) -> list[Verdict]:
    """On the job's side of ``inter`` (collective over ``members``, the
    intracommunicator of that side, whose rank 0 is ``inter``'s): challenge
    every candidate (the remote group) and return the verdicts, in the
    candidates' order, the same on every member.  Every candidate that
    answered is told whether the two sides merge (all were admitted); the
    caller revokes ``inter`` where they do not.

    ``wait_s`` bounds the wait for the answers, from the first challenge
    sent; a candidate that has not answered by then is ``late``.
    """
    candidates = inter.Get_remote_size()
    verdicts: list[Verdict] = []
    if inter.Get_rank() == 0:
        challenges = [secrets.token_bytes(32) for _ in range(candidates)]
        for i, challenge in enumerate(challenges):
            inter.send((challenge, wait_s), dest=i, tag=_TAG_CHALLENGE)
        answers = [inter.irecv(source=i, tag=_TAG_ANSWER) for i in range(candidates)]
        received: dict[int, Any] = {}
        deadline = time.monotonic() + wait_s
        while len(received) < candidates and time.monotonic() < deadline:
            for i, request in enumerate(answers):
                if i not in received:
                    done, answer = request.test()
                    if done:
                        received[i] = answer
            time.sleep(0.001)
        for i, challenge in enumerate(challenges):
            if i not in received:
                answers[i].Cancel()
                verdicts.append("late")
            else:
                good = hmac.compare_digest(received[i], _answer(secret, challenge))
                verdicts.append("admitted" if good else "refused")
        merge = all(v == "admitted" for v in verdicts)
        # Synchronous sends, so that a candidate refused has its verdict before the caller revokes
        # the link (a revocation overtakes a message not yet received); one that does not take it
        # within VERDICT_DELIVERY_S is not waited for.
        deliveries = [inter.issend((v, merge), dest=i, tag=_TAG_VERDICT) for i, v in enumerate(verdicts) if v != "late"]
        deadline = time.monotonic() + VERDICT_DELIVERY_S
        while not MPI.Request.Testall(deliveries) and time.monotonic() < deadline:
            time.sleep(0.001)
    return members.bcast(verdicts, root=0)


def present(inter: MPI.Intercomm, secret: str | None) -> None:
    """On a candidate's side of ``inter``: answer the job's challenge with
    ``secret`` (None: with nothing) and take the verdict.  A candidate waits
    for its challenge at most :data:`CHALLENGE_WAIT_S` and for its verdict
    the job's wait plus :data:`VERDICT_GRACE_S`: a job whose members failed
    while admitting it (and could not revoke ``inter``) does not keep it
    for ever.

    Raises:
        PermissionError: the job refused this process, or gave up on it
            (revoked ``inter``, or said nothing in time).
    """
    try:
        challenge, wait_s = receive_within(inter, 0, _TAG_CHALLENGE, CHALLENGE_WAIT_S)
        inter.send(_answer(secret, challenge), dest=0, tag=_TAG_ANSWER)
        verdict, merge = receive_within(inter, 0, _TAG_VERDICT, wait_s + VERDICT_GRACE_S)
    except (MPI.Exception, TimeoutError) as error:
        raise PermissionError(f"the job gave up on this process before admitting it ({error})") from None
    if verdict != "admitted":
        why = "is not set here" if not secret else "differs from the job's"
        raise PermissionError(
            f"the job refused this process: its answer did not prove the job's secret (${SECRET_VARIABLE} {why})"
        )
    if not merge:
        raise PermissionError(
            "the job admitted this process but refused or gave up on another candidate "
            "started with it, and goes on without any of them"
        )


def receive_within(comm: MPI.Comm, source: int, tag: int, seconds: float) -> Any:
    """``comm.recv(source=source, tag=tag)``, but raise :class:`TimeoutError`
    where no such message has arrived within ``seconds`` (a probe every
    millisecond; the message is received whole once it is there, whatever
    its size)."""
    deadline = time.monotonic() + seconds
    while not comm.Iprobe(source=source, tag=tag):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no message from rank {source} (tag {tag}) within {seconds:g} s")
        time.sleep(0.001)
    return comm.recv(source=source, tag=tag)
