"""OpenAI's Conversations API on the activator, per tenant: ``POST /v1/conversations``,
``GET|POST|DELETE /v1/conversations/{id}``, ``GET|POST /v1/conversations/{id}/items`` and
``GET|DELETE /v1/conversations/{id}/items/{item_id}``. A conversation is a list of items
kept at the controller (``warm_pool.conversations.store``); a response created with
``conversation`` follows its items and adds its turn to them (``activator.conversations.responses``).
Another tenant's conversation is 404, as an unknown one."""

from __future__ import annotations

from typing import Any, Literal

import httpx

from activator.conversations.items import ItemError, input_items, new_id
from activator.errors import BadRequest, NotFound, ServiceUnavailable
from thaw.controllers import ControllerClient
from thaw.wire import ItemPage, NewConversation, StoredItem

MAX_NEW_ITEMS = 20  # OpenAI's bound on the items one call adds
MAX_METADATA = 16

_ITEMS_SCHEMA: dict[str, Any] = {"type": "array", "maxItems": MAX_NEW_ITEMS, "items": {"type": "object"}}
_METADATA_SCHEMA: dict[str, Any] = {"type": "object", "maxProperties": MAX_METADATA,
                                    "additionalProperties": {"type": "string", "maxLength": 512}}
# /openapi.json's bodies (the routes read the raw body themselves).
# null is none, as OpenAI's nullable fields.
_NULL: dict[str, Any] = {"type": "null"}
CONVERSATION_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "additionalProperties": False,
    "properties": {"items": {"anyOf": [_ITEMS_SCHEMA, _NULL]}, "metadata": {"anyOf": [_METADATA_SCHEMA, _NULL]}}}}}}}
METADATA_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "additionalProperties": False, "required": ["metadata"],
    "properties": {"metadata": {"anyOf": [_METADATA_SCHEMA, _NULL]}}}}}}}
ITEMS_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "additionalProperties": False, "required": ["items"],
    "properties": {"items": {**_ITEMS_SCHEMA, "minItems": 1}}}}}}}


class ConversationsApi:
    def __init__(self, controller: ControllerClient) -> None:
        self.controller = controller

    async def _call(self, method: str, path: str, tenant: str, **kw: Any) -> httpx.Response:
        r = await self.controller.answer(method, path, params={"tenant": tenant, **kw.pop("params", {})}, **kw)
        if r is None:
            raise ServiceUnavailable("conversations are unavailable: the controller cannot be reached",
                                     code="conversations_unavailable", retry_after_s=5)
        if r.status_code == 409:
            raise BadRequest(r.json().get("error", "the conversation is full"), code="conversation_full")
        return r

    async def create(self, tenant: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        extra = set(body) - {"items", "metadata"}
        if extra:
            name = sorted(extra)[0]
            raise BadRequest(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
        items = [] if body.get("items") is None else _items(body["items"], "items", allow_empty=True)
        new = NewConversation(tenant=tenant, id=new_id("conv"), metadata=_metadata(body.get("metadata")),
                              items=[StoredItem.model_validate(i) for i in items])
        r = await self._call("POST", "/v1/stored-conversations", tenant, content=new.model_dump_json(),
                             headers={"content-type": "application/json"})
        return r.json()  # type: ignore[no-any-return]

    async def get(self, tenant: str, conversation_id: str) -> dict[str, Any]:
        r = await self._call("GET", f"/v1/stored-conversations/{_safe(conversation_id)}", tenant)
        return _found(r, conversation_id)

    async def update(self, tenant: str, conversation_id: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or set(body) != {"metadata"}:
            raise BadRequest("the body must be {\"metadata\": {...}}", param="metadata")
        r = await self._call("POST", f"/v1/stored-conversations/{_safe(conversation_id)}", tenant,
                             json={"metadata": _metadata(body["metadata"])})
        return _found(r, conversation_id)

    async def delete(self, tenant: str, conversation_id: str) -> dict[str, Any]:
        r = await self._call("DELETE", f"/v1/stored-conversations/{_safe(conversation_id)}", tenant)
        if r.status_code == 404:
            raise _not_found(conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    async def list_items(self, tenant: str, conversation_id: str, *, after: str | None, limit: int,
                         order: Literal["asc", "desc"]) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "order": order, **({"after": after} if after else {})}
        r = await self._call("GET", f"/v1/stored-conversations/{_safe(conversation_id)}/items", tenant, params=params)
        if r.status_code == 404:
            raise _not_found(conversation_id)
        page = ItemPage.model_validate_json(r.content)
        return _list(page.items, page.has_more)

    async def add_items(self, tenant: str, conversation_id: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or "items" not in body:
            raise BadRequest("'items' is required", param="items")
        items = _items(body["items"], "items")
        r = await self._call("POST", f"/v1/stored-conversations/{_safe(conversation_id)}/items", tenant,
                             json={"items": items})
        if r.status_code == 404:
            raise _not_found(conversation_id)
        return _list(ItemPage.model_validate_json(r.content).items, False)

    async def get_item(self, tenant: str, conversation_id: str, item_id: str) -> dict[str, Any]:
        r = await self._call("GET", f"/v1/stored-conversations/{_safe(conversation_id)}/items/{_safe(item_id)}",
                             tenant)
        if r.status_code == 404:
            raise NotFound(f"Item with id '{item_id}' not found.", code="not_found")
        return r.json()  # type: ignore[no-any-return]

    async def delete_item(self, tenant: str, conversation_id: str, item_id: str) -> dict[str, Any]:
        """Deleted; the conversation (as OpenAI answers)."""
        r = await self._call("DELETE",
                             f"/v1/stored-conversations/{_safe(conversation_id)}/items/{_safe(item_id)}", tenant)
        if r.status_code == 404:
            raise NotFound(f"Item with id '{item_id}' not found.", code="not_found")
        return await self.get(tenant, conversation_id)


def _items(value: Any, param: str, *, allow_empty: bool = False) -> list[dict[str, Any]]:
    if allow_empty and value == []:
        return []
    if not isinstance(value, list) or len(value) > MAX_NEW_ITEMS:
        raise BadRequest(f"'{param}' must be a list of at most {MAX_NEW_ITEMS} items", param=param)
    try:
        return input_items(value)
    except ItemError as exc:
        raise BadRequest(str(exc).replace("input", param, 1), param=exc.param.replace("input", param, 1)) from None


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if (not isinstance(value, dict) or len(value) > MAX_METADATA
            or not all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                       for k, v in value.items())):
        raise BadRequest(f"'metadata' must map at most {MAX_METADATA} keys (64 characters) to strings (512)",
                         param="metadata")
    return value


def _list(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}


def _found(r: httpx.Response, conversation_id: str) -> dict[str, Any]:
    if r.status_code == 404:
        raise _not_found(conversation_id)
    return r.json()  # type: ignore[no-any-return]


def _not_found(conversation_id: str) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id}' not found.", code="not_found")


def _safe(value: str) -> str:
    """An id as a path segment (ids are a prefix, _ and alphanumerics: anything else is
    not found)."""
    if not value.replace("_", "").isalnum() or len(value) > 100:
        raise NotFound(f"No object found with id '{value}'.", code="not_found")
    return value
