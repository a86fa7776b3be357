"""The head of an answer from a stored response (``proxy.core.cached``), one rule for every path."""

from proxy.core.cached import cached_head

STORED = (("Content-Range", "bytes */99"), ("Content-Type", "text/plain"))


def head(stored_status: int, answer_status: int, first: int = 0, last: int = -1):
    return cached_head(stored_status, STORED, answer_status, first, last, 10, x_cache="HIT",
                       via="1.1 onehit")  # fmt: skip


def test_rfc9110_14_4_a_range_of_the_caches_own_carries_its_content_range_and_part():
    part = head(200, 206, 2, 4)
    assert ("Content-Range", "bytes 2-4/10") in part.fields
    assert ("Content-Range", "bytes */99") not in part.fields
    assert (part.first, part.last) == (2, 4) and ("Content-Length", "3") in part.fields
    unsatisfiable = head(200, 416)
    assert ("Content-Range", "bytes */10") in unsatisfiable.fields
    assert (
        unsatisfiable.last < unsatisfiable.first and ("Content-Length", "0") in unsatisfiable.fields
    )


def test_a_stored_416_answered_as_stored_keeps_its_fields_and_body():
    stored = head(416, 416)
    assert ("Content-Range", "bytes */99") in stored.fields
    assert (stored.first, stored.last) == (0, 9) and ("Content-Length", "10") in stored.fields


def test_rfc9110_15_4_5_a_304_carries_no_body_fields_and_no_content_range():
    names = {name for name, _ in head(200, 304).fields}
    assert not names & {"Content-Range", "Content-Type", "Content-Length", "Accept-Ranges"}
    assert head(200, 304).last < head(200, 304).first
