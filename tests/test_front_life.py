"""A front connection's life (``proxy.front.life``): the table, walked without a socket, holds
the rules the front keeps, and the front itself moves through it as a connection is served."""

from __future__ import annotations

import itertools

import pytest

from proxy.front.life import BUSY, TABLE, Event, Life, LifeError, State

E, S = Event, State


def walk(*events: Event, start: State = S.READING) -> Life:
    life = Life(start)
    for event in events:
        life.on(event)
    return life


# Each case: the events a connection meets, and where they leave it.
WALKS = {
    "a large hit's body going out, then the next request": ((E.HIT_IN_PART, E.SENT, E.TO_LANE),
                                                            S.ANSWERING),
    "a miss in the lane, answered whole": ((E.TO_LANE, E.HEAD_OUT, E.ANSWERED), S.READING),
    "a miss written at once, by the callback, then another": (
        (E.TO_LANE, E.HEAD_OUT, E.ANSWERED, E.TO_LANE), S.ANSWERING),
    "an answer not kept alive": ((E.TO_LANE, E.HEAD_OUT, E.CLOSE), S.CLOSED),
    "a failure before the head went out": ((E.TO_LANE, E.CLOSE), S.CLOSED),
    "a failure after the head went out": ((E.TO_LANE, E.HEAD_OUT, E.CLOSE), S.CLOSED),
    "a request the front does not take, between answers": (
        (E.TO_LANE, E.ANSWERED, E.HAND_OVER), S.HANDED_OVER),
    "a shutdown with nothing in progress": ((E.TO_LANE, E.ANSWERED, E.DRAIN), S.CLOSED),
    "a shutdown during a miss: answered, then closed": (
        (E.TO_LANE, E.DRAIN, E.HEAD_OUT, E.ANSWERED), S.CLOSED),
    "a shutdown during a large hit's body: sent, then closed": (
        (E.HIT_IN_PART, E.DRAIN, E.SENT), S.CLOSED),
    "a shutdown that waited its time for a large hit's body: given up": (
        (E.HIT_IN_PART, E.DRAIN, E.CLOSE, E.SENT), S.CLOSED),
    "a shutdown that waited its time for a miss: given up": (
        (E.TO_LANE, E.DRAIN, E.HEAD_OUT, E.CLOSE), S.CLOSED),
    "an idle timeout during a slow miss leaves it": ((E.TO_LANE, E.IDLE, E.HEAD_OUT),
                                                      S.BEGUN),
    "an idle timeout with nothing in progress": ((E.IDLE,), S.CLOSED),
    "the client leaves during a miss, which ends after": (
        (E.TO_LANE, E.LOST, E.HEAD_OUT, E.ANSWERED), S.CLOSED),
}  # fmt: skip


@pytest.mark.parametrize("name", WALKS)
def test_a_connection_walks_the_table_to_where_its_events_lead(name):
    events, end = WALKS[name]
    assert walk(*events).state is end


def test_a_connection_behind_a_load_balancer_reads_its_proxy_header_first():
    assert walk(E.HEADER, E.TO_LANE, start=S.PROXY_HEADER).state is S.ANSWERING
    assert walk(E.IDLE, start=S.PROXY_HEADER).state is S.CLOSED  # none within the timeout
    with pytest.raises(LifeError):
        walk(E.TO_LANE, start=S.PROXY_HEADER)


# Events that cannot come where the connection is: each a bug in the front.
IMPOSSIBLE = {
    "a large hit read while a miss is in the lane": (E.TO_LANE, E.HIT_IN_PART),
    "a second request in the lane": (E.TO_LANE, E.TO_LANE),
    "a request read while a body's rest is going out": (E.HIT_IN_PART, E.TO_LANE),
    "handed over in the middle of an answer": (E.TO_LANE, E.HAND_OVER),
    "handed over while a body's rest is going out": (E.HIT_IN_PART, E.HAND_OVER),
    "a second head for one answer": (E.TO_LANE, E.HEAD_OUT, E.HEAD_OUT),
    "a head with nothing in the lane": (E.HEAD_OUT,),
    "a lane answer with nothing in the lane": (E.ANSWERED,),
    "a request read after a shutdown closed it": (E.DRAIN, E.TO_LANE),
    "a request read after the connection was handed over": (E.HAND_OVER, E.TO_LANE),
    "a request read after the connection closed": (E.TO_LANE, E.LOST, E.TO_LANE),
    "a shutdown told to a connection handed over": (E.HAND_OVER, E.DRAIN),
    "a connection lost after it was handed over": (E.HAND_OVER, E.LOST),
}


@pytest.mark.parametrize("name", IMPOSSIBLE)
def test_an_event_that_cannot_come_is_refused_and_the_state_stays(name):
    *before, last = IMPOSSIBLE[name]
    life = walk(*before)
    where = life.state
    with pytest.raises(LifeError):
        life.on(last)
    assert life.state is where


def test_only_a_connection_between_answers_reads_a_request_or_is_handed_over():
    for event in (E.HIT_IN_PART, E.TO_LANE, E.HAND_OVER):
        assert {state for state, on in TABLE if on is event} == {S.READING}


def test_nothing_comes_to_a_connection_handed_over_and_only_a_header_to_one_awaiting_it():
    assert not [event for state, event in TABLE if state is S.HANDED_OVER]
    assert {state for state, on in TABLE if on is E.HEADER} == {S.PROXY_HEADER}
    assert {TABLE[(S.PROXY_HEADER, event)] for event in Event
            if (S.PROXY_HEADER, event) in TABLE} == {S.READING, S.CLOSED}  # fmt: skip


def test_after_an_answers_head_a_failure_closes_the_connection_and_never_reads_on():
    """Once the head went out, no second status line: every way out of a begun answer but a
    whole, kept-alive one closes the connection."""
    for state in (S.BEGUN, S.SENDING, S.LAST_BEGUN, S.LAST_SENDING):
        for event in Event:
            following = TABLE.get((state, event))
            if following is S.READING:
                assert event in (E.ANSWERED, E.SENT), (state, event)
        if state in (S.BEGUN, S.LAST_BEGUN):
            assert TABLE[(state, E.CLOSE)] is S.CLOSED


def test_a_shutdown_answers_nothing_after_the_request_in_progress():
    for state in set(State) - {S.HANDED_OVER}:
        following = TABLE.get((state, E.DRAIN))
        assert following is not None, state
        assert following not in (S.READING, S.ANSWERING, S.BEGUN, S.SENDING), state
        for event in Event:  # nothing from there leads back to reading
            assert TABLE.get((following, event)) is not S.READING, (state, event)


def test_an_idle_timeout_closes_only_a_connection_with_nothing_in_progress():
    for state in BUSY:
        assert TABLE[(state, E.IDLE)] is state
    assert TABLE[(S.READING, E.IDLE)] is S.CLOSED


def test_every_state_reaches_its_end_and_an_end_stays_one():
    ends = {S.CLOSED, S.HANDED_OVER}
    for state in State:
        reached, frontier = {state}, [state]
        while frontier:
            here = frontier.pop()
            for (where, _), following in TABLE.items():
                if where is here and following not in reached:
                    reached.add(following)
                    frontier.append(following)
        assert reached & ends, state
    for end, event in itertools.product(ends, Event):
        assert TABLE.get((end, event), end) is end
    for state in set(State) - ends:
        assert TABLE[(state, E.LOST)] is S.CLOSED, state
