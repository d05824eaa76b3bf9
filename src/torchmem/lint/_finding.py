"""What ``torchmem lint`` reports: one :class:`LintFinding` per problem, in the conventions linters use."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torchmem.lint._rules import RULES


@dataclass(frozen=True, order=True)
class LintFinding:
    """One problem found in a source file.

    Attributes:
        path: The file, as it was found (relative when the path given was relative).
        line: 1-based line of the code the finding is about.
        col: 1-based column (characters, not bytes).
        code: The rule's stable code (``"TM001"``); ``"TM000"`` is a file that could not be parsed.
        message: One line: what is wrong here, with the names from the code.
        fix: One line: what to write instead.
        form: The rule's variant where it has several (TM001: ``"backward-ran"``, ``"output-kept"``,
            ``"output-in-step"``, ``"backward-in-step"``, ``"no-backward"``; TM002: ``"eval-mode"``,
            ``"by-name"``; TM003: ``"optimizer-step"``; TM010: ``"eval-mode"``, ``"trained-model"``; TM011:
            ``"model-frames"``; TM013: ``"grows"``; ``""`` for the others and the info variant of those).
        severity: ``"warning"``: a rule form precise on held-out code, shown by default; ``"info"``: the
            others, shown by ``torchmem lint --all`` (:data:`torchmem.lint._rules.DEFAULT_FORMS`).

    ``str(finding)`` is the line a linter prints::

        train.py:12:9: TM001 `total` keeps `loss` ... (fix: ...)
    """

    path: str
    line: int
    col: int
    code: str
    message: str
    fix: str
    form: str = ""
    severity: str = "warning"

    @property
    def name(self) -> str:
        """The rule's slug (``"graph-accumulated"``)."""
        rule = RULES.get(self.code)
        return rule.name if rule else ""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message} (fix: {self.fix})"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the fields, the rule's name and where its page is."""
        d = asdict(self)
        d["name"] = self.name
        d["explain"] = f"torchmem lint --explain {self.code}"
        return d
