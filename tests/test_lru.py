"""ChargedLRU: bounded by its values' charges, least recently used forgotten first, and asked
``in`` by compiled code with no Python frame."""

from __future__ import annotations

import copy
import operator
import pickle
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.lru import ChargedLRU


def _charge(value: tuple[str, int]) -> int:
    return value[1]


def test_setting_past_the_limit_forgets_the_least_recently_used():
    lru: ChargedLRU[str, tuple[str, int]] = ChargedLRU(10, _charge)
    lru["a"] = ("a", 4)
    lru["b"] = ("b", 4)
    assert lru.get("a") == ("a", 4)  # a is now the most recently used
    lru["c"] = ("c", 4)
    assert list(lru) == ["a", "c"] and lru.charged == 8


def test_a_value_over_the_limit_is_refused_and_nothing_is_forgotten():
    lru: ChargedLRU[str, tuple[str, int]] = ChargedLRU(10, _charge)
    lru["a"] = ("a", 4)
    with pytest.raises(ValueError, match="expected 0 to the limit"):
        lru["b"] = ("b", 11)
    with pytest.raises(ValueError, match="expected 0 to the limit"):
        lru["c"] = ("c", -1)
    assert list(lru) == ["a"] and lru.charged == 4


def test_membership_runs_no_python_code():
    """The hit path's question (``PySequence_Contains``) is the dict's own: no Python frame
    (cachetools' LRUCache answers it with its ``__contains__``)."""
    lru: ChargedLRU[str, tuple[str, int]] = ChargedLRU(10, _charge)
    lru["a"] = ("a", 1)
    frames: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            frames.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        found = operator.contains(lru, "a"), operator.contains(lru, "b")
    finally:
        sys.setprofile(None)
    assert found == (True, False) and frames == []


OPS = st.lists(
    st.tuples(
        st.sampled_from(["set", "get", "del", "pop", "popitem", "oldest", "clear", "copy"]),
        st.integers(0, 7),
        st.integers(1, 6),
    ),
    max_size=60,
)


@given(OPS)
def test_it_holds_the_most_recently_used_keys_within_the_limit(ops):
    """Against a model (keys in order of use, oldest first): after every step, whichever way
    keys left, the same keys in the same order, their charges summed and at most the limit."""
    limit = 12
    lru: ChargedLRU[int, tuple[int, int]] = ChargedLRU(limit, _charge)
    model: list[tuple[int, int]] = []  # (key, charge), least recently used first
    for op, key, size in ops:
        held = [k for k, _ in model]
        if op == "set":
            lru[key] = (key, size)
            model = [(k, c) for k, c in model if k != key] + [(key, size)]
            while sum(c for _, c in model) > limit:
                model.pop(0)
        elif op == "get":
            assert lru.get(key) == ((key, dict(model)[key]) if key in held else None)
            if key in held:
                model = [(k, c) for k, c in model if k != key] + [(key, dict(model)[key])]
        elif op in ("popitem", "oldest"):
            if model:
                gone = model.pop(-1 if op == "popitem" else 0)
                assert lru.popitem(last=op == "popitem") == (gone[0], gone)
            else:
                with pytest.raises(KeyError):
                    lru.popitem()
        elif op == "clear":
            lru.clear()
            model = []
        elif op == "copy":
            lru = lru.copy()
        elif op == "pop":
            assert lru.pop(key, None) == ((key, dict(model)[key]) if key in held else None)
            model = [(k, c) for k, c in model if k != key]
        elif key in held:
            del lru[key]
            model = [(k, c) for k, c in model if k != key]
        assert list(lru) == [k for k, _ in model]
        assert lru.charged == sum(c for _, c in model) <= limit


def test_a_copy_or_a_pickle_keeps_the_limit_the_charge_and_the_order():
    lru: ChargedLRU[str, tuple[str, int]] = ChargedLRU(10, _charge)
    lru["a"], lru["b"] = ("a", 3), ("b", 4)
    for copied in (copy.copy(lru), copy.deepcopy(lru), pickle.loads(pickle.dumps(lru))):
        assert (list(copied.items()), copied.charged, copied.limit) == (list(lru.items()), 7, 10)
        copied["c"] = ("c", 5)  # bounded as the original
        assert list(copied) == ["b", "c"]
