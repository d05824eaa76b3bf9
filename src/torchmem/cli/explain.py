"""``torchmem explain``: explain a pasted OOM message (or the OOM inside a log) without a GPU."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from torchmem.cli import UsageError, int_at_least

#: Exit code when the text holds no out-of-memory message.
NO_OOM = 3


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "explain",
        help="explain an out-of-memory message: every field, the likely causes, the fixes",
        description="Explain a PyTorch out-of-memory message (CUDA, ROCm, MPS, XPU, CPU; torch 1.x-2.x). "
        "Give the message as arguments, '-' or nothing to read stdin, or --file for a log.",
    )
    p.add_argument("message", nargs="*", help="the OOM message (quote it), or '-' for stdin")
    p.add_argument("--file", "-f", metavar="LOG", help="a log or traceback file; its last OOM is explained")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument(
        "--alloc-conf",
        metavar="CONF",
        default=None,
        help="allocator settings the failing run had (default: PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF "
        "of this shell); fixes already in effect are not suggested",
    )
    p.add_argument("--batch-size", type=int_at_least(1), default=None, help="batch size of the failing step")


def _read(args: argparse.Namespace) -> str:
    if args.file:
        try:
            with open(args.file, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError as exc:
            raise UsageError(
                f"--file {args.file!r}: cannot read it ({exc.strerror or exc}).",
                "Give the path of a log file.",
            ) from None
    if not args.message or args.message == ["-"]:
        if sys.stdin is None or (sys.stdin.isatty() and not args.message):
            print("Paste the OOM message, then Ctrl-D:", file=sys.stderr)
        return sys.stdin.read() if sys.stdin is not None else ""
    return " ".join(args.message)


def run(args: argparse.Namespace) -> int:
    from torchmem.analysis.oom import parse_oom_message
    from torchmem.capture.oom import explain_oom
    from torchmem.devices._allocator import alloc_conf

    text = _read(args)
    parsed = parse_oom_message(text)
    if parsed is None or not parsed.is_oom:
        what = (
            f"It reports {parsed.error_code}, which is not a memory error."
            if parsed is not None and parsed.error_code
            else "No PyTorch out-of-memory message was found in it."
        )
        if args.json:
            print(json.dumps({"is_oom": False, "reason": what}))
        else:
            print(f"torchmem explain: the text holds no out-of-memory error. {what}", file=sys.stderr)
            print(
                "Expected e.g. 'CUDA out of memory. Tried to allocate ...', 'HIP out of memory', "
                "'MPS backend out of memory', 'DefaultCPUAllocator: ...', 'CUBLAS_STATUS_ALLOC_FAILED'.",
                file=sys.stderr,
            )
        return NO_OOM
    conf = args.alloc_conf if args.alloc_conf is not None else alloc_conf()
    # the same path as torchmem.explain_oom(message): a CPU OOM is judged against this machine's memory
    d = explain_oom(text, alloc_conf=conf, batch_size=args.batch_size)
    if args.json:
        print(json.dumps(d.to_dict(), indent=2, default=str))
    else:
        from torchmem.results.oom import render_diagnosis

        print(render_diagnosis(d, fields=True))
    return 0
