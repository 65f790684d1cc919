"""What `python -m verifyd` prints: the same views as verifyctl (client/verifyctl/render.cc), so an
operator reads one layout whichever tool a box has."""
from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple

__all__ = ["format_bytes", "format_stats", "format_sequences", "format_progress",
           "format_compaction", "to_dict"]


def _table(rows: Sequence[Tuple[str, object]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "".join(f"{k}{' ' * (width - len(k) + 2)}{v}\n" for k, v in rows)


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole > 0 else "-"


def format_bytes(n: float) -> str:
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    unit = 0
    while n >= 1024.0 and unit < 4:
        n /= 1024.0
        unit += 1
    return f"{n:.0f} B" if unit == 0 else f"{n:.2f} {units[unit]}"


def format_stats(s) -> str:
    cap = float(s.capacity_tokens)
    f = s.fragmentation
    return _table([
        ("backend", s.backend), ("mps", "on" if s.mps_active else "off"), ("layers", s.layers),
        ("heads", s.heads), ("max tree nodes", s.max_tree_nodes),
        ("softmax scale", f"{s.softmax_scale:.6g}"), ("kv dtype", s.kv_dtype or "bf16"),
        ("kv token bytes", f"{s.kv_bytes_per_token}  (per layer)"),
        ("kv pool", format_bytes(float(s.kv_pool_bytes))), ("capacity tokens", s.capacity_tokens),
        ("used tokens", f"{s.used_tokens}  ({_pct(s.used_tokens, cap)})"),
        ("pending tokens", f"{s.pending_tokens}  ({_pct(s.pending_tokens, cap)})"),
        ("free tokens", f"{s.free_tokens}  ({_pct(s.free_tokens, cap)})"),
        ("largest free run", s.largest_free_run), ("sequences", f.sequences),
        ("committed tokens", f.tokens), ("fragment runs", f.runs),
        ("outside first run", f.tokens_outside_first_run),
        ("fragmented ratio", f"{f.fragmented_ratio:.4f}"),
        ("shared tokens", s.shared_tokens), ("shared references", s.shared_references),
    ])


def format_sequences(sequences: Iterable, total: int, truncated: bool = False) -> str:
    rows: List[List[str]] = [["SEQUENCE", "COMMITTED", "PENDING", "SHARED", "IDLE", "LEASE LEFT"]]
    listed = 0
    for s in sequences:
        listed += 1
        # Past the lease: the daemon's next sweep releases it.
        left = f"{s.lease_remaining_seconds:.1f}s" if s.lease_remaining_seconds > 0 else "expiring"
        rows.append([str(s.sequence_id), str(s.committed_length), str(s.pending_tree_nodes),
                     str(s.shared_tokens), f"{s.idle_seconds:.1f}s", left])
    width = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    # The id left-aligned, the numbers right-aligned, two spaces between columns.
    lines = ["  ".join(r[c].ljust(width[c]) if c == 0 else r[c].rjust(width[c])
                       for c in range(len(r))) for r in rows]
    more = " (more follow)" if truncated else ""
    return "\n".join(lines) + f"\n{listed} of {total} sequences{more}\n"


def _state(status) -> str:
    return type(status).State.Name(status.state)


def format_progress(status, width: int = 40) -> str:
    planned, moved = float(status.bytes_planned), float(status.bytes_moved)
    done = _state(status) == "DONE"
    fraction = min(max(moved / planned, 0.0), 1.0) if planned > 0 else (1.0 if done else 0.0)
    filled = int(fraction * width + 0.5)
    return (f"[{'#' * filled}{'.' * (width - filled)}] {100.0 * fraction:5.1f}%  "
            f"{format_bytes(moved)} / {format_bytes(planned)}  {_state(status)}")


def _fragmentation(f) -> str:
    return (f"{f.runs} runs over {f.sequences} sequences, {f.tokens_outside_first_run} of "
            f"{f.tokens} tokens outside the first run ({100.0 * f.fragmented_ratio:.2f}%)")


def format_compaction(s) -> str:
    rows = [("operation", s.operation_id), ("state", _state(s)),
            ("bytes moved",
             f"{format_bytes(s.bytes_moved)} ({s.bytes_moved} of {s.bytes_planned} planned)"),
            ("tokens moved", s.tokens_moved), ("time", f"{s.seconds:.3f} s"),
            ("throughput", f"{format_bytes(s.bytes_per_second)}/s"),
            ("before", _fragmentation(s.before)), ("after", _fragmentation(s.after))]
    if s.error:
        rows.append(("error", s.error))
    if s.note:
        rows.append(("note", s.note))
    return _table(rows)


def to_dict(message) -> dict:
    """The message as verifyctl -o json prints it: proto field names, defaults included."""
    from google.protobuf.json_format import MessageToDict  # noqa: PLC0415 - only for -o json
    kwargs = {"preserving_proto_field_name": True}
    try:
        return MessageToDict(message, including_default_value_fields=True, **kwargs)
    except TypeError:  # protobuf >= 5.26 renamed it
        return MessageToDict(message, always_print_fields_with_no_presence=True, **kwargs)
