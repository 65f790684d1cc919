"""The sequences of one Verify: a tree per sequence and the commit of its previous tree riding on
the call. Shared by the gRPC client (client.py) and the data plane's descriptors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

from ._proto import pb
from .errors import invalid_argument

__all__ = ["VerifySequence", "SequenceLike", "as_sequence"]


@dataclass
class VerifySequence:
    """One sequence of a Verify: its tree (`parents[i]` = -1 for a root, else an index < i) and,
    optionally, the commit of its previous tree riding on this call (`commit_previous`: the
    accepted path, a root then each a child of the previous; [] rejects the whole tree)."""
    sequence_id: int
    parents: Sequence[int]
    commit_previous: Optional[Sequence[int]] = None

    def to_proto(self):
        s = pb.VerifySequence(sequence_id=int(self.sequence_id),
                              parents=[int(p) for p in self.parents])
        if self.commit_previous is not None:
            path = [int(a) for a in self.commit_previous]
            s.commit_previous.CopyFrom(pb.CommitSpec(commit_length=len(path), accepted_path=path))
        return s


SequenceLike = Union[VerifySequence, Tuple[int, Sequence[int]],
                     Tuple[int, Sequence[int], Optional[Sequence[int]]]]


def as_sequence(s: SequenceLike) -> VerifySequence:
    if isinstance(s, VerifySequence):
        return s
    if isinstance(s, tuple) and len(s) in (2, 3):
        return VerifySequence(*s)
    raise invalid_argument("sequences entries must be VerifySequence or (sequence_id, parents[, "
                           f"commit_previous]) tuples, not {type(s).__name__}", "Verify")
