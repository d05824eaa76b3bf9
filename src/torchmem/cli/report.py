"""``torchmem report CAPTURE``: the summary of a capture file, as text or JSON, a PNG plot, an HTML page."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from torchmem.cli import UsageError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="summarise a capture file (torchmem run); write an HTML report or a PNG timeline",
        description="Summarise a capture file written by `torchmem run`. A truncated capture (a killed "
        "run) is reported up to where it stops.",
    )
    p.add_argument(
        "capture",
        metavar="CAPTURE",
        nargs="+",
        help="the capture file (.jsonl) written by torchmem run; several (a distributed job's ranks, "
        "run.rank*.jsonl, or a program's child processes) are merged into one report",
    )
    p.add_argument("--html", metavar="OUT.html", help="write a self-contained HTML report")
    p.add_argument("--plot", metavar="OUT.png", help="write the timeline as a PNG (needs torchmem[plot])")
    p.add_argument("--json", action="store_true", help="print the capture as JSON instead of the summary")
    p.add_argument(
        "--force",
        "-f",
        action="store_true",
        help="replace an HTML report or plot torchmem wrote before (never any other file)",
    )


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _not_the_capture(path: str, option: str, capture: str) -> None:
    """An output must never be the capture being read (``--html x.jsonl`` for ``x.jsonl``)."""
    from torchmem._outputs import OutputExistsError

    if _same_file(path, capture):
        example = "report.html" if option == "--html" else "timeline.png"
        raise OutputExistsError(
            f"{option} {path!r} is the capture being read: writing the report there would overwrite the "
            "input capture.",
            "give the report its own path, e.g. "
            + shlex.join(["torchmem", "report", capture, option, example]),
        )


def _merged(args: argparse.Namespace, paths: list[str]) -> int:
    from torchmem.analysis.ranks import merge_captures
    from torchmem.capture.file import read_capture

    if args.html or args.plot:
        option = "--html" if args.html else "--plot"
        raise UsageError(
            f"{option} takes one capture; {len(paths)} were given (a distributed job's ranks are merged as "
            "text or --json only).",
            "run torchmem report on one rank's capture for its page or plot, e.g. "
            + shlex.join(["torchmem", "report", paths[0], option, args.html or args.plot]),
        )
    merged = merge_captures([read_capture(p) for p in paths])
    from torchmem.report.ranks import write_merged, write_merged_json

    (write_merged_json if args.json else write_merged)(merged, sys.stdout)
    return 0


def run(args: argparse.Namespace) -> int:
    from torchmem.capture.file import read_capture

    paths = [args.capture] if isinstance(args.capture, str) else list(args.capture)
    if len(dict.fromkeys(os.path.abspath(p) for p in paths)) > 1:
        return _merged(args, list(dict.fromkeys(paths)))
    args.capture = paths[0]
    from torchmem.report._output import check_writable

    # Every check before any output: a missing extra or a bad path leaves nothing half done.
    for option, out in (("--html", args.html), ("--plot", args.plot)):
        if out:
            _not_the_capture(out, option, args.capture)
    if args.plot:
        from torchmem.report.plot import require_matplotlib

        require_matplotlib()
        check_writable(args.plot, "plot", kind="png", force=args.force, protect=[args.capture])
    if args.html:
        check_writable(args.html, "HTML report", kind="html", force=args.force, protect=[args.capture])
    if args.html and args.plot and os.path.abspath(args.html) == os.path.abspath(args.plot):
        raise UsageError(
            f"--html and --plot are the same file {args.html!r}.", "Give each output its own path."
        )
    cap = read_capture(args.capture)

    if args.json:
        from torchmem.report import json as report_json

        report_json.write(cap, sys.stdout)
    else:
        from torchmem.report.summary import write_summary

        write_summary(cap, sys.stdout)
    # With --json, stdout is JSON only: what was written is said on stderr.
    said = sys.stderr if args.json else sys.stdout
    if args.html:
        from torchmem.report.html import write_html

        print(f"HTML report: {write_html(cap, args.html, force=args.force)}", file=said)
    if args.plot:
        from torchmem.report.plot import write_plot

        print(f"timeline plot: {write_plot(cap, args.plot, force=args.force)}", file=said)
    return 0
