"""Single flight (``proxy.handler.coalesce``): followers get their leader's result, however the two
interleave."""

import asyncio

from proxy.handler.coalesce import SingleFlight


async def test_a_leader_landing_as_its_follower_starts_to_wait_still_reaches_it():
    flights: SingleFlight[str] = SingleFlight(wait_limit=5.0)
    flight = flights.lead("k")
    assert flight is not None and flights.lead("k") is None
    loop = asyncio.get_running_loop()
    follower = asyncio.ensure_future(flights.follow("k", loop.time() + 3.0))
    await asyncio.sleep(0)  # the follower has asked for the result, and waits for it
    flights.end("k", flight, "fetched")
    assert await asyncio.wait_for(follower, 1.0) == "fetched"
    assert len(flights) == 0


async def test_a_follower_that_gives_up_leaves_the_result_to_the_others():
    flights: SingleFlight[str] = SingleFlight(wait_limit=5.0)
    flight = flights.lead("k")
    assert flight is not None
    loop = asyncio.get_running_loop()
    patient = asyncio.ensure_future(flights.follow("k", loop.time() + 3.0))
    hasty = asyncio.ensure_future(flights.follow("k", loop.time() + 0.05))
    assert await hasty is None  # past its deadline
    flights.end("k", flight, "fetched")
    assert await asyncio.wait_for(patient, 1.0) == "fetched"
