"""The one error type for bad user input: it collects every problem, then raises once."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken rule: which key, what value, what the rule is, and how to fix it."""

    key: str
    value: object
    rule: str
    fix: str = ""

    def render(self) -> str:
        value = str(self.value).lower() if isinstance(self.value, bool) else self.value
        shown = self.key if value == "" else f"{self.key}={value}"
        text = f"{shown}: {self.rule}"
        return f"{text} (fix: {self.fix})" if self.fix else text


class ConfigError(ValueError):
    """Raised with every problem found, so a user fixes them all in one pass."""

    def __init__(self, problems: list[Problem], title: str = "Invalid run config"):
        self.problems = list(problems)
        self.title = title
        n = len(self.problems)
        lines = [f"{title} ({n} problem{'s' if n != 1 else ''}):"]
        lines += ["  " + p.render() for p in self.problems]
        super().__init__("\n".join(lines))


class ProblemList:
    """Accumulates problems; `raise_if_any()` raises one ConfigError holding them all."""

    def __init__(self) -> None:
        self.items: list[Problem] = []

    def add(self, key: str, value: object, rule: str, fix: str = "") -> None:
        self.items.append(Problem(key, value, rule, fix))

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self, title: str = "Invalid run config") -> None:
        if self.items:
            raise ConfigError(self.items, title)
