"""Stored responses (warm_pool/conversations/store.py) on SQLite and PostgreSQL: a chain's
history oldest first, per tenant (another tenant's id is not found), deletion,
retention and a tenant's removal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.warm_pool.conftest import StateDb
from warm_pool.conversations.store import MAX_CHAIN, ChainTooLong, ResponseStore


@pytest.fixture
def store(state_db: StateDb) -> Iterator[ResponseStore]:
    db = state_db()
    s = ResponseStore(db)
    try:
        yield s
    finally:
        db.close()


def msg(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def body(rid: str, previous: str | None, answer: str) -> dict[str, Any]:
    return {"id": rid, "object": "response", "previous_response_id": previous,
            "output": [{"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": answer}]}]}


def test_a_chain_renders_oldest_first_and_only_for_its_tenant(store: ResponseStore) -> None:
    store.save("acme", body("r1", None, "a1"), [msg("user", "q1")], replica="w1/demo-1", at=100.0)
    store.save("acme", body("r2", "r1", "a2"), [msg("user", "q2")], replica="w1/demo-1", at=101.0)
    store.save("acme", body("r3", "r2", "a3"), [msg("user", "q3")], replica="w2/demo-2", at=102.0)
    found = store.history("acme", "r3")
    assert found is not None
    items, replica = found
    texts = [i["content"][0]["text"] for i in items]
    assert texts == ["q1", "a1", "q2", "a2", "q3", "a3"] and replica == "w2/demo-2"
    assert store.get("acme", "r2") == body("r2", "r1", "a2")
    assert store.input_items("acme", "r2") == [msg("user", "q2")]
    # Another tenant: not found, never forbidden.
    assert store.get("other", "r2") is None and store.history("other", "r3") is None
    assert store.input_items("other", "r2") is None and not store.delete("other", "r2")
    # A chain with a deleted link continues no more.
    assert store.delete("acme", "r2") and store.history("acme", "r3") is None
    assert store.history("acme", "r1") is not None


def test_retention_and_a_tenants_removal_delete_for_real(store: ResponseStore) -> None:
    store.save("acme", body("old", None, "x"), [], replica=None, at=100.0)
    store.save("acme", body("new", None, "y"), [], replica=None, at=200.0)
    store.save("beta", body("b1", None, "z"), [], replica=None, at=50.0)
    assert store.purge(before=150.0) == 2
    assert store.get("acme", "old") is None and store.get("acme", "new") is not None
    assert store.delete_tenant("acme") == 1 and store.get("acme", "new") is None


def test_a_chain_too_long_is_refused(store: ResponseStore) -> None:
    previous = None
    for i in range(MAX_CHAIN + 1):
        store.save("acme", body(f"r{i}", previous, "a"), [], replica=None, at=float(i))
        previous = f"r{i}"
    with pytest.raises(ChainTooLong):
        store.history("acme", previous)  # type: ignore[arg-type]


def item(i: int) -> dict[str, Any]:
    return {**msg("user", f"m{i}"), "id": f"msg_{i}"}


def test_a_conversation_keeps_its_items_in_order_and_its_turns(store: ResponseStore) -> None:
    made = store.create_conversation("acme", "conv_1", {"topic": "x"}, [item(1), item(2)], at=100.0)
    assert made == {"id": "conv_1", "object": "conversation", "created_at": 100, "metadata": {"topic": "x"}}
    assert store.add_items("acme", "conv_1", [item(3)], at=101.0) == [item(3)]
    turn = {**body("resp_a1", None, "answer"), "output": [{**body("x", None, "answer")["output"][0], "id": "msg_o"}]}
    assert store.save("acme", turn, [item(4)], replica="w1/a", at=102.0, conversation="conv_1")
    found = store.conversation_items("acme", "conv_1")
    assert found is not None
    items, more, replica = found
    assert [i["id"] for i in items] == ["msg_1", "msg_2", "msg_3", "msg_4", "msg_o"] and not more
    assert replica == "w1/a"
    page = store.conversation_items("acme", "conv_1", after="msg_2", limit=2)
    assert page is not None and [i["id"] for i in page[0]] == ["msg_3", "msg_4"] and page[1]
    desc = store.conversation_items("acme", "conv_1", limit=2, order="desc")
    assert desc is not None and [i["id"] for i in desc[0]] == ["msg_o", "msg_4"]
    assert store.conversation_item("acme", "conv_1", "msg_3") == item(3)
    assert store.delete_item("acme", "conv_1", "msg_3", at=103.0)
    assert store.conversation_item("acme", "conv_1", "msg_3") is None
    assert store.update_conversation("acme", "conv_1", {"topic": "y"}, at=104.0)["metadata"] == {"topic": "y"}  # type: ignore[index]
    # Another tenant sees none of it; a turn into its conversation keeps nothing.
    assert store.conversation("beta", "conv_1") is None and store.conversation_items("beta", "conv_1") is None
    assert store.add_items("beta", "conv_1", [item(9)], at=105.0) is None
    assert not store.save("beta", body("resp_b1", None, "z"), [], replica=None, at=105.0, conversation="conv_1")
    assert store.get("beta", "resp_b1") is None
    assert not store.delete_conversation("beta", "conv_1") and store.delete_conversation("acme", "conv_1")
    assert store.conversation("acme", "conv_1") is None


def test_conversations_go_with_retention_and_their_tenant(store: ResponseStore) -> None:
    store.create_conversation("acme", "conv_old", {}, [item(1)], at=100.0)
    store.create_conversation("acme", "conv_used", {}, [], at=100.0)
    store.add_items("acme", "conv_used", [item(2)], at=300.0)  # used since: kept
    store.create_conversation("beta", "conv_b", {}, [item(3)], at=400.0)
    assert store.purge(before=200.0) == 1
    assert store.conversation("acme", "conv_old") is None and store.conversation("acme", "conv_used") is not None
    assert store.delete_tenant("acme") == 1 and store.conversation("acme", "conv_used") is None
    assert store.conversation("beta", "conv_b") is not None


def test_an_item_id_given_twice_names_one_item(store: ResponseStore) -> None:
    store.create_conversation("acme", "conv_1", {}, [item(1)], at=100.0)
    added = store.add_items("acme", "conv_1", [item(1), item(1)], at=101.0)
    assert added is not None and len({i["id"] for i in added}) == 2 and "msg_1" not in {i["id"] for i in added}
    found = store.conversation_items("acme", "conv_1")
    assert found is not None and len({i["id"] for i in found[0]}) == 3
