"""Prefix affinity with bounded load, stepped by hand."""

from __future__ import annotations

from dataclasses import dataclass

from activator.replica_choice import choose, prefix_key


@dataclass
class R:
    url: str
    outstanding: int = 0


def test_same_prefix_same_replica_until_the_bound() -> None:
    reps = [R("a"), R("b"), R("c")]
    key = prefix_key("chat", {"messages": [{"role": "system", "content": "You are terse."},
                                           {"role": "user", "content": "q1"}]})
    # Sequential turns at low load: always the same replica.
    home = choose(reps, key)
    assert all(choose(reps, key) is home for _ in range(5))
    # A burst of one prefix: request i (0-based) sees total i + 1 and the bound
    # ceil(1.25 * (i + 1) / 3) = 1, 1, 2, 2, 3, 3; the key's first replica takes
    # requests 0, 2, 4 and its second 1, 3, 5: (3, 3, 0), not 6 on one replica.
    for _ in range(6):
        r = choose(reps, key)
        assert r is not None
        r.outstanding += 1
    assert sorted(x.outstanding for x in reps) == [0, 3, 3]
    assert home.outstanding == 3


def test_affinity_holds_under_light_load_and_moves_when_overloaded() -> None:
    reps = [R("a", 3), R("b", 3), R("c", 3)]
    key = "k1"
    home = choose(reps, key)
    assert home is not None
    # total = 9 + 1 = 10, bound ceil(1.25 * 10/3) = 5: home at 3 + 1 = 4 fits.
    assert all(choose(reps, key) is home for _ in range(3))
    home.outstanding = 5  # 5 + 1 = 6 > ceil(1.25 * (11 + 1) / 3) = 5: moves on
    other = choose(reps, key)
    assert other is not home
    # ... to the next replica in the key's own order, the same every time.
    assert all(choose(reps, key) is other for _ in range(3))


def test_conversation_turns_share_a_key_and_others_do_not() -> None:
    turn1 = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hello"}]}
    turn2 = {"messages": [*turn1["messages"], {"role": "assistant", "content": "hi"},
                          {"role": "user", "content": "next"}]}
    other = {"messages": [{"role": "system", "content": "T"}, {"role": "user", "content": "hello"}]}
    k1, k2, k3 = prefix_key("chat", turn1), prefix_key("chat", turn2), prefix_key("chat", other)
    assert k1 is not None and k1 == k2  # later turns follow the conversation's replica
    assert k1 != k3


def test_no_key_is_least_outstanding() -> None:
    reps = [R("a", 2), R("b", 0), R("c", 1)]
    assert choose(reps, None).url == "b"  # type: ignore[union-attr]
    assert choose([], "k") is None
