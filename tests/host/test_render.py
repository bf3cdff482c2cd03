"""Tables print data as it is: a title or cell with brackets is not rich markup."""

from __future__ import annotations

import io

from rich.console import Console

from edgedeploy.cli import render


def test_a_table_title_with_brackets_is_printed_whole(monkeypatch) -> None:
    console = Console(file=io.StringIO(), width=200)
    monkeypatch.setattr(render, "out", console)
    render.table("power: nvml not installed (extra edgedeploy[agent-nvidia])", ["state"], [["[/] down"]])
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "edgedeploy[agent-nvidia])" in "".join(text.split()), text  # the title wraps to the table's width
    assert "[/] down" in text
