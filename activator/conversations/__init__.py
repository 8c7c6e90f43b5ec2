"""The Responses and Conversations APIs on the activator: the routes (``responses``,
``conversations``) and the pure translation between a response's items and a chat
completion (``items``). What is stored lives at the controller
(``warm_pool.conversations``), reached over its API.

May import ``thaw`` and the rest of ``activator``.
"""
