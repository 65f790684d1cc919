"""python -m verifyd [--target unix:///run/verifyd/verifyd-0.sock] [--timeout 10] [-o table|json]
COMMAND: health | stats | compact [--budget-bytes N] — an operator tool for Python-only boxes
(the same views as verifyctl). Exit 0 on success (health: only when SERVING), 1 on a failed call,
2 on bad usage."""
from __future__ import annotations

import argparse
import json
import sys

from .client import Client
from .errors import VerifydError


def _table(rows) -> str:
    width = max(len(k) for k, _ in rows)
    return "".join(f"{k}{' ' * (width - len(k) + 2)}{v}\n" for k, v in rows)


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole > 0 else "-"


def format_stats(s) -> str:
    cap = float(s.capacity_tokens)
    f = s.fragmentation
    return _table([
        ("backend", s.backend), ("layers", s.layers), ("heads", s.heads),
        ("max tree nodes", s.max_tree_nodes), ("softmax scale", f"{s.softmax_scale:.6g}"),
        ("capacity tokens", s.capacity_tokens),
        ("used tokens", f"{s.used_tokens}  ({_pct(s.used_tokens, cap)})"),
        ("pending tokens", f"{s.pending_tokens}  ({_pct(s.pending_tokens, cap)})"),
        ("free tokens", f"{s.free_tokens}  ({_pct(s.free_tokens, cap)})"),
        ("largest free run", s.largest_free_run), ("sequences", f.sequences),
        ("committed tokens", f.tokens), ("fragment runs", f.runs),
        ("outside first run", f.tokens_outside_first_run),
        ("fragmented ratio", f"{f.fragmented_ratio:.4f}"),
    ])


def _to_dict(message) -> dict:
    from google.protobuf.json_format import MessageToDict  # noqa: PLC0415
    kwargs = {"preserving_proto_field_name": True}
    try:
        return MessageToDict(message, including_default_value_fields=True, **kwargs)
    except TypeError:  # protobuf >= 5.26 renamed it
        return MessageToDict(message, always_print_fields_with_no_presence=True, **kwargs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m verifyd", description=__doc__.split("\n")[0])
    p.add_argument("--target", default="unix:///run/verifyd/verifyd-0.sock")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per call")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--admin-token", default="")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("health", help="grpc.health.v1 status of the daemon")
    sub.add_parser("stats", help="geometry, occupancy, fragmentation")
    c = sub.add_parser("compact", help="defragment, with progress")
    c.add_argument("--budget-bytes", type=int, default=0)
    c.add_argument("--poll-seconds", type=float, default=0.1)
    args = p.parse_args(argv)

    try:
        client = Client(args.target, timeout=args.timeout, admin_token=args.admin_token)
    except VerifydError as e:
        print(f"verifyd: {e}", file=sys.stderr)
        return 2
    try:
        with client:
            if args.command == "health":
                status = client.health()
                print(json.dumps({"status": status}) if args.output == "json" else status)
                return 0 if status == "SERVING" else 1
            if args.command == "stats":
                s = client.stats()
                print(json.dumps(_to_dict(s), indent=2) if args.output == "json"
                      else format_stats(s), end="\n" if args.output == "json" else "")
                return 0
            op = client.compact(args.budget_bytes)
            status = client.wait_compaction(
                op, poll_interval=args.poll_seconds,
                on_progress=None if args.output == "json" else
                (lambda st: print(f"{st.bytes_moved}/{st.bytes_planned} bytes "
                                  f"{type(st).State.Name(st.state)}", file=sys.stderr)))
            if args.output == "json":
                print(json.dumps(_to_dict(status), indent=2))
            else:
                print(f"operation {status.operation_id}: {type(status).State.Name(status.state)},"
                      f" {status.bytes_moved} bytes moved in {status.seconds:.3f} s")
            return 0 if type(status).State.Name(status.state) == "DONE" else 1
    except VerifydError as e:
        print(f"verifyd: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
