"""Stored responses and conversations at the controller (OpenAI's Responses and
Conversations APIs): the state (``store``) and the routes activators call (``api``).

May import ``thaw`` and the rest of ``warm_pool``.
"""
