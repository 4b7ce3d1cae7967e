"""Delta-debugging reduction: from a model that fails a check to a small, self-contained repro.

``signature`` says what a failure is (kind, figures) and how one run of a candidate is judged;
``worker`` judges one candidate in its own process; ``oracle`` runs the worker with a timeout, so a
crash or hang is a signature and not the end of the search; ``candidate`` cuts a graph down to a
set of its nodes, feeding the cut values their recorded values; ``search`` drives the reductions;
``repro`` writes and replays the repro folder.
"""

from __future__ import annotations

from cuvil.reduce.search import ReduceResult, reduce_graph
from cuvil.reduce.signature import FailureSignature, Outcome

__all__ = ["FailureSignature", "Outcome", "ReduceResult", "reduce_graph"]
