"""The bench's summary: a ratio to the reactor is taken round by round, and the targets are
judged on it, so a machine whose speed drifts between rounds does not set one round's pool
against another round's reactor."""

from typing import Any

from bench.bench import summarise, targets


def _measure(rate: float, cpu_ms: float, low_cpu_ms: float) -> dict[str, Any]:
    return {
        "attempts_per_s": rate,
        "cpu_ms": cpu_ms,
        "postgres_cpu_ms": 5.0,
        "statements": 40.0,
        "transactions": 10.0,
        "pg_transactions": 10.0,
        "failed": 0,
        "low_load": {"p50_ms": 50.0, "p95_ms": 60.0, "cpu_ms_per_event": low_cpu_ms},
    }


# The machine slows by half in the second round and recovers in the third: each contender's own
# figures drift, while within each round the pool runs 2.1× the reactor at 0.9 of its CPU.
ROUNDS = [
    {
        "own": {
            "reactor1": _measure(30.0, 30.0, 40.0),
            "pool2": _measure(63.0, 27.0, 36.0),
        }
    },
    {
        "own": {
            "reactor1": _measure(15.0, 60.0, 80.0),
            "pool2": _measure(31.5, 54.0, 72.0),
        }
    },
    {
        "own": {
            "reactor1": _measure(20.0, 45.0, 60.0),
            "pool2": _measure(42.0, 40.5, 54.0),
        }
    },
]


def test_ratios_to_the_reactor_are_taken_within_each_round() -> None:
    pool = summarise(ROUNDS)["own"]["pool2"]
    assert pool["paired"]["x_reactor"] == {"median": 2.1, "min": 2.1, "max": 2.1}
    assert pool["paired"]["cpu_x_reactor"]["median"] == 0.9
    assert pool["paired"]["low_cpu_x_reactor"]["median"] == 0.9
    # The ratio of the medians is kept beside it: here 42 / 20 = 2.1 as well.
    assert pool["x_reactor"] == 2.1


def test_targets_are_judged_round_by_round() -> None:
    # The reactor's median comes from its middle round and the pool's from its slowest: the
    # ratio of the medians is 45 / 25 = 1.8, while two of the three rounds ran at 2.2×.
    rounds = [
        {"own": {"reactor1": _measure(30.0, 30.0, 40.0), "pool2": _measure(45.0, 27.0, 36.0)}},
        {"own": {"reactor1": _measure(15.0, 60.0, 80.0), "pool2": _measure(33.0, 54.0, 72.0)}},
        {"own": {"reactor1": _measure(25.0, 45.0, 60.0), "pool2": _measure(55.0, 40.5, 54.0)}},
    ]
    summary = summarise(rounds)
    pool = summary["own"]["pool2"]
    assert pool["x_reactor"] == 1.8
    assert pool["paired"]["x_reactor"] == {"median": 2.2, "min": 1.5, "max": 2.2}
    missed = targets(summary, {})
    assert missed == [], missed


def test_a_pool_slower_in_every_round_misses() -> None:
    rounds = [
        {"own": {"reactor1": _measure(30.0, 30.0, 40.0), "pool2": _measure(45.0, 33.0, 44.0)}}
        for _ in range(3)
    ]
    missed = targets(summarise(rounds), {})
    assert any("≥ 2.0× reactor (1.50× by round" in text for text in missed), missed
    assert any("CPU per attempt ≤ reactor's (1.10× by round" in text for text in missed), missed
    assert any("low-load CPU per event" in text for text in missed), missed


def _peers(loop_rate: float, serve_rate: float, pool_rate: float) -> dict[str, Any]:
    return {
        "own": {
            "reactor1": _measure(serve_rate, 30.0, 40.0),
            "loop1": _measure(loop_rate, 20.0, 40.0),
            "pool2": _measure(pool_rate, 24.0, 36.0),
        }
    }


def test_the_headline_is_against_the_fastest_in_process_peer() -> None:
    # The tight loop outruns `serve` in every round; the pool runs 1.5× the loop within each
    # round while the machine's speed drifts.
    rounds = [_peers(40.0, 20.0, 60.0), _peers(20.0, 10.0, 30.0), _peers(30.0, 15.0, 45.0)]
    own = summarise(rounds)["own"]
    assert {figures["peer"] for figures in own.values()} == {"loop1"}
    assert own["pool2"]["paired_peer"]["x_peer"] == {"median": 1.5, "min": 1.5, "max": 1.5}
    assert own["pool2"]["paired_peer"]["cpu_x_peer"]["median"] == 1.2
    assert own["loop1"]["paired_peer"]["x_peer"]["median"] == 1.0
    assert own["reactor1"]["paired_peer"]["x_peer"]["median"] == 0.5
    # The ratio to the 1-process `serve` stays beside it, named for what it is.
    assert own["pool2"]["paired"]["x_reactor"]["median"] == 3.0


def test_a_pool_is_never_its_own_peer() -> None:
    own = summarise([_peers(10.0, 5.0, 60.0)])["own"]
    assert own["pool2"]["peer"] == "loop1", own["pool2"]


def test_the_pools_targets_against_the_tight_loop_are_judged_round_by_round() -> None:
    # The pool runs 1.5× the loop in one process within each round, at 1.2× its CPU per attempt.
    rounds = [_peers(40.0, 20.0, 60.0), _peers(20.0, 10.0, 30.0), _peers(30.0, 15.0, 45.0)]
    summary = summarise(rounds)
    assert summary["own"]["pool2"]["paired_loop"]["x_peer"]["median"] == 1.5
    missed = [text for text in targets(summary, {}) if "against" in text]
    assert len(missed) == 1, missed
    assert "CPU per attempt ≤ the loop's (1.20× by round" in missed[0], missed
