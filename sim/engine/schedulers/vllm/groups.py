"""A vllm request's sequences and what the request sees of them (`SequenceGroups`).

A request with `n > 1` is fanned out into `n` sequences scheduled independently, as vLLM v1 does (`add`, in
admission.py, opens them under the request's id). The request's computed tokens are its sequences',
summed (`_sync`); it emits a token when its slowest sequence does (`_emit_group`), and it is finished when its
last sequence is (`_close`). A one-sequence request follows its sequence directly. The step's rows emit here
too (`_emit_rows`, which `SpeculativeScheduler` in spec.py replaces to emit the accepted drafts).

`SequenceGroups` is one of the parts `VllmScheduler` (scheduler.py) is made of.
"""

from __future__ import annotations

from sim.core.request import Request
from sim.engine.schedulers.vllm.plan import Seq, StepInfo


class SequenceGroups:
    """Emission and progress from sequences to their requests (see the module docstring)."""

    # shared with the other parts of `VllmScheduler`
    _open: dict[int, list[Seq]]  # request id -> its unfinished sequences
    _prev_end: float  # when the step before the one being applied ended
    _applying: StepInfo  # the step being applied

    def _emit_rows(self, rows: list[Seq], now: float) -> list[Seq]:
        """One token for each sequence of the step's rows that emits; the sequences that are now done."""
        done: list[Seq] = []
        for seq in rows:
            self._emit_token(seq, now)
            if seq.num_generated >= seq.out_len:
                done.append(seq)
        return done

    def _emit_token(self, seq: Seq, now: float, decode: bool | None = None) -> None:
        """`seq` generates one token at `now`; its request emits it (a group request when its slowest has).

        A one-sequence request whose previous token came before the end of the step before sat out steps
        (preempted, or left out by the token budget, or admitted by a decode replica): its wait is kept
        (`Request.stall`), with whether the step counts the token as a decode token (`decode`; None: its
        row is one token)."""
        seq.num_generated += 1
        seq.num_tokens += 1
        req = seq.req
        if req.n == 1:
            if req.last_token_at < self._prev_end:
                req.stall(now, self._one_token_row(seq) if decode is None else decode)
            req.emit(now)
        else:
            self._emit_group(req, now)

    def _one_token_row(self, seq: Seq) -> bool:
        """Whether `seq`'s row in the step being applied computes one token (a decode row)."""
        info = self._applying
        return info.counts[info.seqs.index(seq)] == 1

    def _sync(self, seq: Seq) -> None:
        """Mirror progress on the request: its sequences' computed tokens, summed."""
        req = seq.req
        if req.n == 1:
            req.num_computed = seq.num_computed
        else:
            req.num_computed = sum(s.num_computed for s in self._open[req.id])

    def _emit_group(self, req: Request, now: float) -> None:
        """A sequence of `req` emitted a token; the request emits when its slowest open sequence has."""
        slowest = min(s.num_generated for s in self._open[req.id])
        while req.num_generated < slowest:
            req.emit(now)

    def _close(self, seq: Seq) -> bool:
        """Forget a finished sequence; True when it was its request's last."""
        seqs = self._open[seq.req.id]
        if seq.req.n > 1:
            seqs.remove(seq)
        else:
            seqs.clear()
        if seqs:
            return False
        del self._open[seq.req.id]
        return True
