"""``torchmem lint``: memory anti-patterns in PyTorch source, in the conventions linters use.

Exit codes: 0 nothing found, 1 findings, 2 bad input (a missing path, an unknown code, a bad
``[tool.torchmem.lint]`` table, or a file that cannot be parsed: that file is reported as a ``TM000``
line). This command imports no torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any


def _codes(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "lint",
        help="find memory anti-patterns in PyTorch source (static; no torch needed)",
        description="Check Python files and folders for memory anti-patterns: graphs kept across steps, "
        "evaluation without no_grad, empty_cache in the loop, retain_graph in a loop, CUDA in DataLoader "
        "workers, torch.load without map_location, tensors logged, zero_grad(set_to_none=False). "
        "Configure with [tool.torchmem.lint] in pyproject.toml (select, ignore, exclude); silence one "
        "line with '# noqa: TM001'.",
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or folders (default: .)")
    p.add_argument(
        "--format",
        choices=("text", "json", "github"),
        default="text",
        help="text (path:line:col: CODE message), json, or github (workflow annotations)",
    )
    p.add_argument("--select", type=_codes, metavar="CODES", help="only these codes or prefixes (TM001,TM00)")
    p.add_argument("--ignore", type=_codes, metavar="CODES", help="skip these codes or prefixes")
    p.add_argument(
        "--all",
        action="store_true",
        help="also show the rules and forms of lower measured precision (severity 'info'; "
        "docs/lint.md, 'Default output'); a code given to --select by its full name is shown anyway",
    )
    p.add_argument("--explain", metavar="CODE", help="print the page of one rule (why, wrong, right)")
    p.add_argument("--list-rules", action="store_true", help="list every rule with its code")
    p.add_argument("--no-config", action="store_true", help="do not read [tool.torchmem.lint]")
    p.add_argument("--quiet", "-q", action="store_true", help="print the findings only (no summary line)")


def _err(message: str) -> int:
    print(f"torchmem: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from torchmem.lint import RULES, LintConfigError, explain_rule, lint_paths
    from torchmem.lint._rules import DEFAULT_FORMS, WARNING
    from torchmem.lint._run import config_notes

    if args.explain is not None:
        try:
            print(explain_rule(args.explain), end="")
        except KeyError:
            return _err(f"no rule {args.explain!r}; `torchmem lint --list-rules` lists them")
        return 0
    if args.list_rules:
        for rule in RULES.values():
            forms = sorted(form for code, form in DEFAULT_FORMS if code == rule.code)
            form_names = "/".join(forms) + (" forms" if len(forms) > 1 else " form")
            shown = "--all" if not forms else "default" if forms == [""] else f"default ({form_names})"
            print(f"{rule.code}  {rule.name:<26} {shown:<28} {rule.summary}")
        return 0
    paths = args.paths or ["."]
    try:
        findings = lint_paths(paths, select=args.select, ignore=args.ignore, config=not args.no_config)
    except FileNotFoundError as exc:
        return _err(str(exc))
    except LintConfigError as exc:
        return _err(str(exc))
    named = {c.upper() for c in args.select or () if c.upper() in RULES}  # --select TM010: wanted
    hidden = [f for f in findings if not (args.all or f.severity == WARNING or f.code in named)]
    if hidden:
        findings = [f for f in findings if args.all or f.severity == WARNING or f.code in named]
    if not args.no_config and not args.quiet:
        for note in config_notes(paths):
            print(f"torchmem: note: {note}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    elif args.format == "github":
        for f in findings:
            level = "error" if f.code == "TM000" else f.severity if f.severity == WARNING else "notice"
            msg = f"{f.message} (fix: {f.fix})".replace("%", "%25").replace("\n", "%0A")
            print(f"::{level} file={f.path},line={f.line},col={f.col},title={f.code} {f.name}::{msg}")
    else:
        for f in findings:
            print(f)
        if findings and not args.quiet:
            by_code = Counter(f.code for f in findings)
            codes = ", ".join(f"{c}: {n}" for c, n in sorted(by_code.items()))
            noun = "problem" if len(findings) == 1 else "problems"
            print(
                f"Found {len(findings)} {noun} ({codes}). "
                "`torchmem lint --explain CODE` shows why and the fix."
            )
        if hidden and not args.quiet:
            by_code = Counter(f.code for f in hidden)
            codes = ", ".join(f"{c}: {n}" for c, n in sorted(by_code.items()))
            print(
                f"{len(hidden)} more of lower measured precision not shown ({codes}): "
                "`torchmem lint --all` shows them."
            )
    if any(f.code == "TM000" for f in findings):
        return 2
    return 1 if findings else 0
