"""verifyd.GroupClient: one call to the daemons of every tensor-parallel rank at once, as
client/group_client.h.

A TP scheduler holds the same sequences on every rank's daemon (the MLA latent KV is shared by all
heads, so every rank stores the whole cache) while each rank computes its own heads: a step sends
the same append/commit/release to all ranks and a per-rank verify (its own q). Calls run
concurrently on one long-lived worker thread per rank (gRPC releases the GIL while it waits), so a
group call takes as long as the slowest rank. Results come back per rank, in rank order; when any
rank failed a GroupError is raised (the lowest failing rank's code, "rank r: message") whose
`.results` holds every rank's result or error.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional, Sequence

from .client import Client, SequenceLike
from .errors import VerifydError, first_error, invalid_argument

__all__ = ["GroupClient"]


class GroupClient:
    def __init__(self, targets: Sequence[str] = (), *, clients: Optional[List[Client]] = None,
                 **client_options):
        """One Client per target (rank r = targets[r]), or existing `clients`."""
        if clients is None:
            clients = [Client(t, **client_options) for t in targets]
        if not clients:
            raise invalid_argument("a group needs at least one rank")
        self.ranks: List[Client] = list(clients)
        self._pools = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"verifyd-rank{r}")
                       for r in range(len(self.ranks))]

    @property
    def size(self) -> int:
        return len(self.ranks)

    def rank(self, r: int) -> Client:
        return self.ranks[r]

    def close(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=True)
        for c in self.ranks:
            c.close()

    def __enter__(self) -> "GroupClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def for_each_rank(self, fn: Callable[[int, Client], Any], *,
                      raise_on_error: bool = True) -> List[Any]:
        """fn(rank, client) on every rank concurrently; the per-rank results (a VerifydError in
        place of a result when raise_on_error is False)."""
        def run(r: int):
            try:
                return fn(r, self.ranks[r])
            except VerifydError as e:
                return e
        futures = [pool.submit(run, r) for r, pool in enumerate(self._pools)]
        results = [f.result() for f in futures]
        if raise_on_error:
            error = first_error(results)
            if error is not None:
                raise error
        return results

    def append(self, sequence_id: int, kv: Any, **kwargs) -> list:
        """The same append to every rank."""
        return self.for_each_rank(lambda r, c: c.append(sequence_id, kv, **kwargs))

    def verify(self, layer: int, sequences: Sequence[SequenceLike], q: Sequence[Any],
               tree_kv: Any, **kwargs) -> list:
        """Rank r gets q[r] (its heads); tree_kv is the same for every rank (one tensor) or one
        per rank (a list)."""
        if len(q) != self.size:
            raise invalid_argument(f"q has {len(q)} entries, must equal the group size "
                                   f"{self.size}", "Verify")
        per_rank_kv = isinstance(tree_kv, (list, tuple))
        if per_rank_kv and len(tree_kv) != self.size:
            raise invalid_argument(f"tree_kv has {len(tree_kv)} entries, must equal the group "
                                   f"size {self.size}", "Verify")
        seqs = list(sequences)
        return self.for_each_rank(lambda r, c: c.verify(
            layer, seqs, q[r], tree_kv[r] if per_rank_kv else tree_kv, **kwargs))

    def commit(self, sequence_id: int, accepted_path: Sequence[int], **kwargs) -> list:
        return self.for_each_rank(lambda r, c: c.commit(sequence_id, accepted_path, **kwargs))

    def release(self, sequence_id: int, **kwargs) -> list:
        return self.for_each_rank(lambda r, c: c.release(sequence_id, **kwargs))

    def stats(self, **kwargs) -> list:
        return self.for_each_rank(lambda r, c: c.stats(**kwargs))

    def health(self, service: str = "", **kwargs) -> list:
        return self.for_each_rank(lambda r, c: c.health(service, **kwargs))
