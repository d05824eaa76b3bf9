"""``torchmem lint``: memory anti-patterns in PyTorch source, found statically (the ``ast`` module only).

Each rule has a stable code (``TM001``...), a one-line message with the names from the code, the fix, and
a page (``explain_rule("TM003")``, ``torchmem lint --explain TM003``). The checks favour precision: a
value counts as a tensor carrying an autograd graph only when local data flow shows it, so look-alikes
(``loss.item()`` accumulated, ``.detach()`` stored, work under ``no_grad``) are not flagged.

This package imports no torch: it runs wherever Python does.

Example:
    >>> from torchmem.lint import lint_source
    >>> src = "for x in loader:\\n    loss = model(x).sum()\\n    loss.backward()\\n    hist.append(loss)\\n"
    >>> print(lint_source(src, "train.py")[0].code)
    TM001
"""

from __future__ import annotations

from torchmem.lint._config import LintConfigError
from torchmem.lint._finding import LintFinding
from torchmem.lint._pages import PAGES
from torchmem.lint._rules import RULES, LintRule
from torchmem.lint._run import lint_paths, lint_source

__all__ = ["RULES", "LintConfigError", "LintFinding", "LintRule", "explain_rule", "lint_paths", "lint_source"]


def explain_rule(code: str) -> str:
    """The page of one rule (Markdown: what it finds, why, wrong, right, when it does not fire).

    Raises:
        KeyError: ``code`` is not a rule's code.

    Example:
        >>> from torchmem.lint import explain_rule
        >>> explain_rule("tm003").splitlines()[0]
        '# TM003 empty-cache-in-loop'
    """
    key = code.strip().upper()
    if key not in PAGES:
        raise KeyError(code)
    return PAGES[key]
