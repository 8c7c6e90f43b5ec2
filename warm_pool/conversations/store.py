"""Stored responses (OpenAI's Responses API with ``store``), per tenant, in the
controller's state database: every activator reaches them through the leading
controller, and nothing about a conversation lives in the replica that served it, so
a conversation continues across scale-to-zero and across activators.

Why the state database and not the object store: a turn is read and written on the
request path (its history before the engine is asked, the response before the client
sees its end), in small records that chain (``previous_response_id``) and that a
retention sweep and a tenant's removal delete by query; a database does each in one
statement, where the store would need a listing per chain.

Each response keeps its own input items (those of its turn) and its Response object
(with its output items); the history a continued turn renders is the chain of its
predecessors' inputs and outputs, oldest first (:meth:`ResponseStore.history`). The
replica that served a response is kept for routing the next turn to the same prefix
cache.

A conversation (OpenAI's Conversations API) is a list of items in order: those it was
created with or given, and each turn's input and output items, added in the same
transaction as the turn's response. Retention counts from a conversation's last change.
Blocking: the controller calls it from threads.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from warm_pool.db import Db, Tx

MIGRATIONS = [
    """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    previous_id TEXT,
    replica TEXT,
    input_items TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_by_tenant ON responses (tenant, created_at);
CREATE INDEX IF NOT EXISTS responses_by_time ON responses (created_at)
""",
    """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    metadata TEXT NOT NULL,
    replica TEXT
);
CREATE INDEX IF NOT EXISTS conversations_by_tenant ON conversations (tenant);
CREATE INDEX IF NOT EXISTS conversations_by_time ON conversations (updated_at);
CREATE TABLE IF NOT EXISTS conversation_items (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    item_id TEXT NOT NULL,
    item TEXT NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
CREATE UNIQUE INDEX IF NOT EXISTS conversation_items_by_id ON conversation_items (conversation_id, item_id)
""",
]

# How many responses a chain may have: a longer one is refused, not walked for ever.
MAX_CHAIN = 1000
# How many items a conversation may hold.
MAX_CONVERSATION_ITEMS = 100_000


class ChainTooLong(ValueError):
    """A ``previous_response_id`` chain longer than MAX_CHAIN."""


class ConversationFull(ValueError):
    """A conversation would hold more than MAX_CONVERSATION_ITEMS items."""


class Exists(ValueError):
    """A response or conversation with that id is stored already (ids are never reused)."""


class ResponseStore:
    def __init__(self, db: Db) -> None:
        self.db = db
        db.migrate("responses", MIGRATIONS)

    def save(self, tenant: str, body: dict[str, Any], input_items: list[dict[str, Any]], *,
             replica: str | None, at: float, conversation: str | None = None) -> bool:
        """Keep a response (``body`` the Response object, with its id and
        ``previous_response_id``) and the input items of its turn; with ``conversation``,
        those items and the response's output are added to it in the same transaction.
        False: no such conversation of ``tenant``'s (nothing kept)."""
        with self.db.write() as tx:
            if tx.one("SELECT 1 FROM responses WHERE id = ?", (body["id"],)) is not None:
                raise Exists(f"response {body['id']!r} is stored already")
            if conversation is not None:
                if tx.one("SELECT 1 FROM conversations WHERE id = ? AND tenant = ?", (conversation, tenant)) is None:
                    return False
                self._append(tx, conversation, [*input_items, *(body.get("output") or [])], replica, at)
            tx.execute("INSERT INTO responses (id, tenant, created_at, previous_id, replica, input_items, body) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (body["id"], tenant, at, body.get("previous_response_id"), replica,
                        json.dumps(input_items), json.dumps(body)))
        return True

    def get(self, tenant: str, response_id: str) -> dict[str, Any] | None:
        """The Response object, if ``tenant`` stored it (another tenant's is None)."""
        with self.db.read() as tx:
            row = tx.one("SELECT body FROM responses WHERE id = ? AND tenant = ?", (response_id, tenant))
        return json.loads(row[0]) if row else None

    def input_items(self, tenant: str, response_id: str) -> list[dict[str, Any]] | None:
        """The input items of that response's own turn (None: no such response)."""
        with self.db.read() as tx:
            row = tx.one("SELECT input_items FROM responses WHERE id = ? AND tenant = ?", (response_id, tenant))
        return json.loads(row[0]) if row else None

    def history(self, tenant: str, response_id: str) -> tuple[list[dict[str, Any]], str | None] | None:
        """The items a turn continuing ``response_id`` follows: each response of the
        chain's input items then output items, oldest first; and the replica that served
        ``response_id``. None: no such response of ``tenant``'s (or one of the chain was
        deleted). Raises :class:`ChainTooLong`."""
        chain: list[tuple[str, str]] = []
        replica: str | None = None
        with self.db.read() as tx:
            current: str | None = response_id
            while current is not None:
                if len(chain) >= MAX_CHAIN:
                    raise ChainTooLong(f"the conversation is longer than {MAX_CHAIN} responses")
                row = tx.one("SELECT previous_id, replica, input_items, body FROM responses "
                             "WHERE id = ? AND tenant = ?", (current, tenant))
                if row is None:
                    return None
                if not chain:
                    replica = row[1]
                chain.append((row[2], row[3]))
                current = row[0]
        items: list[dict[str, Any]] = []
        for inputs, body in reversed(chain):
            items += json.loads(inputs)
            items += json.loads(body).get("output") or []
        return items, replica

    def delete(self, tenant: str, response_id: str) -> bool:
        with self.db.write() as tx:
            return tx.execute("DELETE FROM responses WHERE id = ? AND tenant = ?", (response_id, tenant)) == 1

    def purge(self, before: float) -> int:
        """Delete the responses created before ``before``, and the conversations last
        changed before it (retention); how many of both."""
        with self.db.write() as tx:
            gone = tx.execute("DELETE FROM responses WHERE created_at < ?", (before,))
            tx.execute("DELETE FROM conversation_items WHERE conversation_id IN "
                       "(SELECT id FROM conversations WHERE updated_at < ?)", (before,))
            return gone + tx.execute("DELETE FROM conversations WHERE updated_at < ?", (before,))

    def delete_tenant(self, tenant: str) -> int:
        """Every response and conversation of ``tenant`` (the tenant was removed); how many."""
        with self.db.write() as tx:
            gone = tx.execute("DELETE FROM responses WHERE tenant = ?", (tenant,))
            tx.execute("DELETE FROM conversation_items WHERE conversation_id IN "
                       "(SELECT id FROM conversations WHERE tenant = ?)", (tenant,))
            return gone + tx.execute("DELETE FROM conversations WHERE tenant = ?", (tenant,))

    # -- conversations (OpenAI's Conversations API) ----------------------------------------

    def create_conversation(self, tenant: str, conversation_id: str, metadata: dict[str, str],
                            items: list[dict[str, Any]], at: float) -> dict[str, Any]:
        with self.db.write() as tx:
            if tx.one("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)) is not None:
                raise Exists(f"conversation {conversation_id!r} exists already")
            tx.execute("INSERT INTO conversations (id, tenant, created_at, updated_at, metadata) "
                       "VALUES (?, ?, ?, ?, ?)", (conversation_id, tenant, at, at, json.dumps(metadata)))
            self._append(tx, conversation_id, items, None, at)
        return _conversation(conversation_id, at, metadata)

    def conversation(self, tenant: str, conversation_id: str) -> dict[str, Any] | None:
        with self.db.read() as tx:
            row = tx.one("SELECT created_at, metadata FROM conversations WHERE id = ? AND tenant = ?",
                         (conversation_id, tenant))
        return _conversation(conversation_id, row[0], json.loads(row[1])) if row else None

    def update_conversation(self, tenant: str, conversation_id: str, metadata: dict[str, str],
                            at: float) -> dict[str, Any] | None:
        with self.db.write() as tx:
            if tx.execute("UPDATE conversations SET metadata = ?, updated_at = ? WHERE id = ? AND tenant = ?",
                          (json.dumps(metadata), at, conversation_id, tenant)) != 1:
                return None
            row = tx.one("SELECT created_at FROM conversations WHERE id = ?", (conversation_id,))
        assert row is not None
        return _conversation(conversation_id, row[0], metadata)

    def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        with self.db.write() as tx:
            if tx.execute("DELETE FROM conversations WHERE id = ? AND tenant = ?", (conversation_id, tenant)) != 1:
                return False
            tx.execute("DELETE FROM conversation_items WHERE conversation_id = ?", (conversation_id,))
        return True

    def add_items(self, tenant: str, conversation_id: str, items: list[dict[str, Any]],
                  at: float) -> list[dict[str, Any]] | None:
        """Append ``items``; None: no such conversation of ``tenant``'s."""
        with self.db.write() as tx:
            if tx.one("SELECT 1 FROM conversations WHERE id = ? AND tenant = ?", (conversation_id, tenant)) is None:
                return None
            self._append(tx, conversation_id, items, None, at)
        return items

    def conversation_items(self, tenant: str, conversation_id: str, *, after: str | None = None,
                           limit: int = MAX_CONVERSATION_ITEMS,
                           order: str = "asc") -> tuple[list[dict[str, Any]], bool, str | None] | None:
        """The items after ``after`` (an item id) in ``order``, at most ``limit``; whether
        there are more; the replica that served the conversation last. None: no such
        conversation of ``tenant``'s."""
        desc = order == "desc"
        with self.db.read() as tx:
            conv = tx.one("SELECT replica FROM conversations WHERE id = ? AND tenant = ?", (conversation_id, tenant))
            if conv is None:
                return None
            start = None
            if after is not None:
                found = tx.one("SELECT seq FROM conversation_items WHERE conversation_id = ? AND item_id = ?",
                               (conversation_id, after))
                if found is None:
                    return [], False, conv[0]
                start = found[0]
            where = "" if start is None else (" AND seq < ?" if desc else " AND seq > ?")
            rows = tx.query(f"SELECT item FROM conversation_items WHERE conversation_id = ?{where} "  # noqa: S608
                            f"ORDER BY seq {'DESC' if desc else 'ASC'} LIMIT ?",
                            (conversation_id, *(() if start is None else (start,)), limit + 1))
        items = [json.loads(r[0]) for r in rows]
        return items[:limit], len(items) > limit, conv[0]

    def conversation_item(self, tenant: str, conversation_id: str, item_id: str) -> dict[str, Any] | None:
        with self.db.read() as tx:
            row = tx.one("SELECT i.item FROM conversation_items i JOIN conversations c ON c.id = i.conversation_id "
                         "WHERE c.id = ? AND c.tenant = ? AND i.item_id = ?", (conversation_id, tenant, item_id))
        return json.loads(row[0]) if row else None

    def delete_item(self, tenant: str, conversation_id: str, item_id: str, at: float) -> bool:
        with self.db.write() as tx:
            if tx.one("SELECT 1 FROM conversations WHERE id = ? AND tenant = ?", (conversation_id, tenant)) is None:
                return False
            gone = tx.execute("DELETE FROM conversation_items WHERE conversation_id = ? AND item_id = ?",
                              (conversation_id, item_id)) == 1
            if gone:
                tx.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (at, conversation_id))
        return gone

    @staticmethod
    def _append(tx: Tx, conversation_id: str, items: list[dict[str, Any]], replica: str | None, at: float) -> None:
        row = tx.one("SELECT COALESCE(MAX(seq), 0), COUNT(*) FROM conversation_items WHERE conversation_id = ?",
                     (conversation_id,))
        last, count = (int(row[0]), int(row[1])) if row else (0, 0)
        if count + len(items) > MAX_CONVERSATION_ITEMS:
            raise ConversationFull(f"a conversation holds at most {MAX_CONVERSATION_ITEMS} items")
        # An id the conversation holds already (a client's, given twice) is replaced: an
        # item id names one item of a conversation.
        marks = ", ".join("?" for _ in items)
        taken = {r[0] for r in tx.query(f"SELECT item_id FROM conversation_items WHERE conversation_id = ? "  # noqa: S608
                                        f"AND item_id IN ({marks})", (conversation_id, *(i["id"] for i in items)))
                 } if items else set()
        fresh = []
        for item in items:
            if item["id"] in taken:
                item = {**item, "id": f"{str(item['id']).split('_')[0]}_{uuid.uuid4().hex}"}
            taken.add(item["id"])
            fresh.append(item)
        items[:] = fresh
        tx.execute_many("INSERT INTO conversation_items (conversation_id, seq, item_id, item) VALUES (?, ?, ?, ?)",
                        [(conversation_id, last + i + 1, item["id"], json.dumps(item)) for i, item in enumerate(items)])
        tx.execute("UPDATE conversations SET updated_at = ?" + (", replica = ?" if replica else "") + " WHERE id = ?",
                   (at, *((replica,) if replica else ()), conversation_id))


def _conversation(conversation_id: str, created_at: float, metadata: dict[str, str]) -> dict[str, Any]:
    """A conversation as OpenAI's API shows it."""
    return {"id": conversation_id, "object": "conversation", "created_at": int(created_at), "metadata": metadata}
