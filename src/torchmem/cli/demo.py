"""``torchmem demo``: a small training script with a real leak, found and named; then the fix, flat.

Runs the bundled ``torchmem/_demo/train.py`` under ``torchmem run`` on the default device (CUDA when present,
else the CPU), shows the live status line, the leak report (allocation site, holder, fix), runs the fixed
version (``--fixed``) and shows its memory stays flat, and writes the HTML report of the leaky run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from typing import Any

from torchmem._outputs import OutputError
from torchmem.cli import UsageError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="see torchmem find a real leak in a small training script, then the fix")
    p.add_argument("--steps", type=int, default=40, help="training steps per run (default 40)")
    p.add_argument("--device", "-d", help="device (default: CUDA when present, else CPU)")
    p.add_argument(
        "--output-dir",
        "-o",
        default=None,
        help="where captures and the report go (default: a new folder in the system's temporary "
        "directory, so nothing is left in your working tree); earlier demo files there are replaced",
    )


def _script() -> str:
    from torchmem import _demo

    return os.path.join(os.path.dirname(os.path.abspath(_demo.__file__)), "train.py")


def _out_dir(path: str | None) -> str:
    if path is None:
        return tempfile.mkdtemp(prefix="torchmem-demo-")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"Cannot create the demo folder {path!r}: {exc.strerror or exc}.",
            "Choose another --output-dir, or leave it out (a temporary folder is used).",
        ) from None
    return path


def run(args: argparse.Namespace) -> int:
    from torchmem._format import fmt_bytes
    from torchmem.devices import default_device, resolve
    from torchmem.run.launcher import run_session

    if args.steps < 12:
        raise UsageError(
            f"--steps must be 12 or more, not {args.steps}.",
            "The leak detector needs a few steps after its warm-up.",
        )
    dev = resolve(args.device) if args.device else default_device()
    out = _out_dir(args.output_dir)
    script = _script()
    err = sys.stderr
    html = os.path.join(out, "report.html")
    print(f"torchmem demo on {dev}: {script}", file=err)
    print(
        "1/2  The training script keeps each validation loss tensor (no torch.no_grad()) - a classic leak.\n",
        file=err,
    )
    argv = [script, "--steps", str(args.steps), "--device", str(dev)]
    # The demo's own files (leaky.jsonl, fixed.jsonl, report.html) from an earlier demo are replaced; any
    # other file of those names is refused, as everywhere in torchmem.
    code, leaky = run_session(
        script,
        argv,
        capture=os.path.join(out, "leaky.jsonl"),
        device=dev,
        html=html,
        err=err,
        force=True,
    )
    if code != 0:
        return code
    print(
        "\n2/2  The same script with --fixed (no_grad() for validation, losses kept as numbers).\n", file=err
    )
    code, fixed = run_session(
        script,
        [*argv, "--fixed"],
        capture=os.path.join(out, "fixed.jsonl"),
        device=dev,
        err=err,
        quiet=True,
        force=True,
    )
    if code != 0:
        return code
    lines = ["", "Result:"]
    for label, res in (("leaky", leaky), ("fixed", fixed)):
        rep = res.leak
        first = rep.series[0][1] if rep is not None and rep.series else None
        last = rep.series[-1][1] if rep is not None and rep.series else None
        verdict = (
            f"LEAK {fmt_bytes(int(rep.bytes_per_step))}/step"
            if rep is not None and rep.detected_at is not None
            else "flat: no leak"
        )
        lines.append(
            f"  {label:<6} memory after step 1: {fmt_bytes(first):>10}, after step {res.steps}: "
            f"{fmt_bytes(last):>10}  -> {verdict}"
        )
    if leaky.leak is not None and leaky.leak.culprits:
        c = leaky.leak.culprits[0]
        lines.append(f"  culprit: {c.site} held by {c.holder}")
        lines.append(f"  fix: {c.fix}")
    if os.path.exists(html):
        lines.append(f"  HTML report of the leaky run: {os.path.abspath(html)}")
    captures = [os.path.abspath(os.path.join(out, name)) for name in ("leaky.jsonl", "fixed.jsonl")]
    lines.append(f"  captures: {captures[0]}, {captures[1]}")
    lines.append(f"  see one again: {shlex.join(['torchmem', 'report', captures[0]])}")
    print("\n".join(lines), file=err)
    return 0
