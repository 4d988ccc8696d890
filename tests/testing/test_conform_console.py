"""The verdict table prints engine names, settings and details literally (no emoji codes, no markup)."""

from __future__ import annotations

from rich.console import Console

from specround.testing.conform_console import render_report
from specround.testing.verdicts import CheckResult, ConformanceReport


def test_names_with_colons_and_brackets_print_literally() -> None:
    report = ConformanceReport("specround:llama:draft:bf16", 0.01, 10, 2)
    report.results.append(CheckResult("law", 0, "T=1 [top_k=5]", True, 1.5, p_value=0.5))
    report.results.append(
        CheckResult(
            "q-declared", 0, "T=1 [top_k=5]", False, 1.0, detail="off by [bold]0.1[/bold]", advisory=True
        )
    )
    console = Console(width=200, record=True, color_system=None)
    render_report(report, console)
    text = console.export_text()
    assert "specround:llama:draft:bf16" in text
    assert "\N{LLAMA}" not in text
    assert "T=1 [top_k=5]" in text
    assert "off by [bold]0.1[/bold]" in text
