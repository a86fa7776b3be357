"""A front connection's life as one table: where it is, the events that move it, and where each
takes it. The front (``proxy.front.fastpath.Front``) tells its ``Life`` every event and reads
its state from it alone; nothing here does I/O, so every path is tested without a socket.

Rules the table keeps:

* A connection behind a load balancer that sends the PROXY protocol reads that header first
  (``PROXY_HEADER``), and nothing else until it has.
* Requests are answered one at a time, in order: a request is read, and a hit answered, only
  while ``READING``; one in the lane, or a body's rest still going out, holds the bytes after
  it until it ends. A hit answered whole as it was read leaves the connection ``READING``:
  it is no event (the commonest request moves nothing, and costs no call).
* The connection is handed to aiohttp's protocol only between answers (from ``READING``), and
  is the front's no more after that: no event comes to it then.
* Once an answer's head went out (``BEGUN``), the answer ends whole or the connection closes:
  a second status line would be read as the answer to the client's next request (the
  handler, which knows it from the request's ``answer``, cuts the connection, and the
  front's ``CLOSE`` ends it here).
* A graceful shutdown (``DRAIN``) answers nothing after the request in progress: it closes at
  once when there is none, else once that one ends (the ``LAST_`` states).
* An idle timeout closes only a connection with nothing in progress.
* A connection lost, or closed, stays closed: what the lane still ends finds it so.
* Any other event is impossible where it comes (``LifeError``): a bug, never a wrong answer
  written.
"""

from __future__ import annotations

import enum


# Small integers (``IntEnum``): every hit moves a connection, and the move is a list index.
class State(enum.IntEnum):
    """Where a front connection is."""

    PROXY_HEADER = 0  # its PROXY protocol header not read yet
    READING = 1  # nothing in progress: the next request is read and answered
    ANSWERING = 2  # a request in the lane, its answer not begun
    BEGUN = 3  # the lane's answer's head went out
    SENDING = 4  # a hit's body going out as the transport drains
    LAST_ANSWERING = 5  # ANSWERING, and nothing after it (a shutdown)
    LAST_BEGUN = 6
    LAST_SENDING = 7
    HANDED_OVER = 8  # aiohttp's protocol serves the connection
    CLOSED = 9


class Event(enum.IntEnum):
    """What happens to a front connection."""

    HIT_IN_PART = 0  # a hit whose body's rest waits for the transport to drain
    SENT = 1  # that rest went out
    TO_LANE = 2  # a request went to the lane
    HEAD_OUT = 3  # the lane's answer's head went out
    ANSWERED = 4  # the lane's answer went out whole, the connection kept alive
    CLOSE = 5  # the answer in progress ended and the connection closes (cut, failed, not
    # kept, or given up by a shutdown that waited its time)
    HAND_OVER = 6  # aiohttp's protocol takes over (a request the front does not take, a
    # client that does not read, a server whose lane is off)
    DRAIN = 7  # a graceful shutdown
    IDLE = 8  # the idle timeout came
    LOST = 9  # the transport closed
    HEADER = 10  # the PROXY protocol header was read


S, E = State, Event

# (state, event) -> the next state. A pair missing is an event that cannot come there.
TABLE: dict[tuple[State, Event], State] = {
    (S.PROXY_HEADER, E.HEADER): S.READING,
    (S.PROXY_HEADER, E.DRAIN): S.CLOSED,
    (S.PROXY_HEADER, E.IDLE): S.CLOSED,
    (S.READING, E.HIT_IN_PART): S.SENDING,
    (S.READING, E.TO_LANE): S.ANSWERING,
    (S.READING, E.HAND_OVER): S.HANDED_OVER,
    (S.READING, E.DRAIN): S.CLOSED,
    (S.READING, E.IDLE): S.CLOSED,
    (S.ANSWERING, E.HEAD_OUT): S.BEGUN,
    (S.ANSWERING, E.ANSWERED): S.READING,
    (S.ANSWERING, E.CLOSE): S.CLOSED,
    (S.ANSWERING, E.DRAIN): S.LAST_ANSWERING,
    (S.ANSWERING, E.IDLE): S.ANSWERING,
    (S.BEGUN, E.ANSWERED): S.READING,
    (S.BEGUN, E.CLOSE): S.CLOSED,
    (S.BEGUN, E.DRAIN): S.LAST_BEGUN,
    (S.BEGUN, E.IDLE): S.BEGUN,
    (S.SENDING, E.SENT): S.READING,
    (S.SENDING, E.CLOSE): S.CLOSED,
    (S.SENDING, E.DRAIN): S.LAST_SENDING,
    (S.SENDING, E.IDLE): S.SENDING,
    (S.LAST_ANSWERING, E.HEAD_OUT): S.LAST_BEGUN,
    (S.LAST_ANSWERING, E.ANSWERED): S.CLOSED,
    (S.LAST_ANSWERING, E.CLOSE): S.CLOSED,
    (S.LAST_ANSWERING, E.DRAIN): S.LAST_ANSWERING,
    (S.LAST_ANSWERING, E.IDLE): S.LAST_ANSWERING,
    (S.LAST_BEGUN, E.ANSWERED): S.CLOSED,
    (S.LAST_BEGUN, E.CLOSE): S.CLOSED,
    (S.LAST_BEGUN, E.DRAIN): S.LAST_BEGUN,
    (S.LAST_BEGUN, E.IDLE): S.LAST_BEGUN,
    (S.LAST_SENDING, E.SENT): S.CLOSED,
    (S.LAST_SENDING, E.CLOSE): S.CLOSED,
    (S.LAST_SENDING, E.DRAIN): S.LAST_SENDING,
    (S.LAST_SENDING, E.IDLE): S.LAST_SENDING,
    # What the lane still ends, or a shutdown, finds the connection closed.
    **{
        (S.CLOSED, event): S.CLOSED
        for event in (E.HEAD_OUT, E.ANSWERED, E.CLOSE, E.SENT, E.DRAIN, E.IDLE, E.LOST)
    },
    **{(state, E.LOST): S.CLOSED for state in State if state not in (S.HANDED_OVER, S.CLOSED)},
}

# ``TABLE`` by state, then event: what ``Life.on`` reads.
_NEXT: list[list[State | None]] = [
    [TABLE.get((state, event)) for event in sorted(Event)] for state in sorted(State)
]

# The states with a request in progress (in the lane, or a body's rest going out).
BUSY = frozenset({S.ANSWERING, S.BEGUN, S.SENDING, S.LAST_ANSWERING, S.LAST_BEGUN,
                  S.LAST_SENDING})  # fmt: skip
# The states a large hit's body drains in.
SENDING_STATES = frozenset({S.SENDING, S.LAST_SENDING})


class LifeError(RuntimeError):
    """An event that cannot come where the connection is: a bug in the front."""


class Life:
    """One connection's place in ``TABLE``, from ``start``."""

    __slots__ = ("state",)

    def __init__(self, start: State = State.READING) -> None:
        self.state = start

    def on(self, event: Event) -> State:
        """Move on ``event``; the state it leads to. ``LifeError`` for an event that cannot
        come here, and the state stays."""
        following = _NEXT[self.state][event]
        if following is None:
            raise LifeError(f"{event.name} cannot come to a connection {self.state.name}")
        self.state = following
        return following

    @property
    def busy(self) -> bool:
        """A request is in progress: the bytes after it wait."""
        return self.state in BUSY
