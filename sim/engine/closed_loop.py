"""Closed-loop users of a replica or a fleet: each sends its next request a think time after its previous one
ended, until the horizon."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import simpy

from sim.core.request import Request
from sim.engine.horizon import Horizon


@dataclass(slots=True)
class ClosedLoopSource:
    """N users, each sending its next request a think time after its previous one finished.

    `new_request(now, user)` makes user `user`'s next request (users are numbered 0 .. users - 1).
    """

    users: int
    think_time: Callable[[], float]
    new_request: Callable[[float, int], Request]
    ramp_s: float = 0.0


class ClosedLoopUsers:
    """Closed-loop users on `env`: each sends a request (`submit`), and a think time after it ends (`ended`)
    its next one, until the horizon's duration or request count, when `close` is called."""

    def __init__(
        self,
        env: simpy.Environment,
        source: ClosedLoopSource,
        horizon: Horizon,
        submit: Callable[[Request], None],
        close: Callable[[], None],
    ) -> None:
        self.env, self.source, self.horizon = env, source, horizon
        self.submit, self.close = submit, close
        self.sent = 0
        self.user_of: dict[int, int] = {}  # request id -> the user who sent it, while it is in the system

    def start(self) -> None:
        """The users' first requests (spread over `ramp_s`) and the close at the horizon's duration."""
        env, source = self.env, self.source
        if self.horizon.duration_s is not None:
            env.process(self._close_at_horizon())
        for user in range(source.users):
            delay = source.ramp_s * user / source.users if source.ramp_s else 0.0
            env.process(self._send_at(user, delay))

    def ended(self, req: Request) -> None:
        """`req` ended (finished or rejected): its user sends its next request after a think time."""
        self.env.process(self._send_at(self.user_of.pop(req.id), self.source.think_time()))

    def _close_at_horizon(self) -> Iterator[simpy.Event]:
        assert self.horizon.duration_s is not None
        yield self.env.timeout(self.horizon.duration_s)
        self.close()

    def _send_at(self, user: int, delay: float) -> Iterator[simpy.Event]:
        h, env = self.horizon, self.env
        if delay > 0:
            yield env.timeout(delay)
        if h.max_requests is not None and self.sent >= h.max_requests:
            return
        if h.duration_s is not None and env.now >= h.duration_s:
            return
        self.sent += 1
        req = self.source.new_request(env.now, user)
        self.user_of[req.id] = user
        self.submit(req)
        if h.max_requests is not None and self.sent >= h.max_requests:
            self.close()
