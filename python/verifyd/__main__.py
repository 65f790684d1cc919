"""python -m verifyd [--target unix:///run/verifyd/verifyd-0.sock] [--timeout 10] [-o table|json]
COMMAND, where COMMAND is health | stats | sequences | compact [--budget-bytes N] |
release --sequence ID | fork --sequence ID --new-sequence ID --length K; also --version.
An operator tool for Python-only boxes with verifyctl's commands and views (cli_render.py); the
options may come before or after the command. Exit 0 on success (health: only when SERVING;
compact: only when DONE), 1 on a failed call, 2 on bad usage."""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from . import __version__
from .cli_render import (format_compaction, format_progress, format_sequences, format_stats,
                         to_dict)
from .client import Client
from .errors import VerifydError


def _common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every command takes, before the command or after it. After it they default to
    SUPPRESS, so that a value given before the command is not reset by the subcommand's parser."""
    def d(value):
        return argparse.SUPPRESS if suppress else value
    parser.add_argument("--target", default=d("unix:///run/verifyd/verifyd-0.sock"))
    parser.add_argument("--timeout", type=float, default=d(10.0), help="seconds per call")
    parser.add_argument("-o", "--output", choices=("table", "text", "json"), default=d("table"),
                        help="text is table (verifyctl's name)")
    parser.add_argument("--admin-token", default=d(""))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m verifyd", description=__doc__.split("\n")[0])
    _common(p, suppress=False)
    p.add_argument("--version", action="version", version=f"verifyd-py {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help)
        _common(c, suppress=True)
        return c

    command("health", "grpc.health.v1 status (exit 0 only when SERVING)")
    command("stats", "store occupancy, fragmentation and settings")
    command("sequences", "every live sequence: committed length, pending tree nodes, shared "
                         "tokens, idle time, lease left")
    c = command("compact", "defragment (0 = until converged), with progress")
    c.add_argument("--budget-bytes", type=int, default=0)
    c.add_argument("--poll-seconds", type=float, default=0.1)
    r = command("release", "drop a sequence and free its slots")
    r.add_argument("--sequence", type=int, required=True)
    f = command("fork", "a new sequence on ID's first K committed tokens, sharing their KV")
    f.add_argument("--sequence", type=int, required=True)
    f.add_argument("--new-sequence", type=int, required=True)
    f.add_argument("--length", type=int, required=True)
    return p


def _print_json(message) -> None:
    print(json.dumps(to_dict(message), indent=2))


def _run(client: Client, args) -> int:
    as_json = args.output == "json"
    if args.command == "health":
        status = client.health()
        print(json.dumps({"status": status}) if as_json else status)
        return 0 if status == "SERVING" else 1
    if args.command == "stats":
        s = client.stats()
        _print_json(s) if as_json else print(format_stats(s), end="")
        return 0
    if args.command == "sequences":
        # Every page: an operator looking for leaks wants them all (ids ascending).
        listed = client.all_sequences()
        if as_json:
            print(json.dumps({"sequences": [to_dict(s) for s in listed],
                              "truncated": False, "total_sequences": len(listed)}, indent=2))
        else:
            print(format_sequences(listed, len(listed)), end="")
        return 0
    if args.command == "release":
        freed = client.release(args.sequence)
        print(json.dumps({"freed_slots": freed}) if as_json
              else f"released sequence {args.sequence}: {freed} slots freed")
        return 0
    if args.command == "fork":
        forked = client.fork(args.sequence, args.new_sequence, args.length)
        _print_json(forked) if as_json else print(
            f"forked sequence {args.new_sequence} from {args.sequence}: "
            f"{forked.committed_length} tokens shared; {forked.shared_tokens} shared slots in "
            "the daemon")
        return 0
    op = client.compact(args.budget_bytes)
    if not as_json:
        budget = "until converged" if args.budget_bytes == 0 else f"{args.budget_bytes} bytes"
        print(f"compaction {op} (budget {budget})")
    last: List[Optional[int]] = [None]

    def progress(status) -> None:  # one line per state change (a pipe or a journal reads it)
        if not as_json and status.state != last[0]:
            print(format_progress(status), flush=True)
        last[0] = status.state

    status = client.wait_compaction(op, poll_interval=args.poll_seconds, on_progress=progress)
    _print_json(status) if as_json else print(format_compaction(status), end="")
    return 0 if type(status).State.Name(status.state) == "DONE" else 1


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        client = Client(args.target, timeout=args.timeout, admin_token=args.admin_token)
    except VerifydError as e:
        print(f"verifyd: {e}", file=sys.stderr)
        return 2
    try:
        with client:
            return _run(client, args)
    except VerifydError as e:
        print(f"verifyd: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
