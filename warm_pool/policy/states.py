"""The groups of worker states the policy reasons with (a worker's state is
``warm_pool.fleet.view``'s, derived from facts); the simulator uses the same groups."""

from __future__ import annotations

# A replica: it serves its model, or is starting to.
SERVING = frozenset(("loading", "ready"))
# Instances that are, or are about to be, standing by (a draining worker ends in
# standby). Asleep workers are not: they are a tier of their own, bounded by their TTL
# and the pool's caps, reclaimed for another model only when no standby is free.
STANDBY_LIKE = frozenset(("launching", "starting", "standby", "draining"))
