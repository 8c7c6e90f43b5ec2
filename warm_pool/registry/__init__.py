"""What the controller serves and for whom, changed at run time: the models and their
revisions (``models``, rows in ``store``), tenants (``tenants``), API keys (``keys``),
a whole file of both at once (``apply``) and pool budgets (``admin``).

May import ``thaw`` and the rest of ``warm_pool``.
"""
