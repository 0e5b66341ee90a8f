"""The tables of README.md, BENCHMARKS.md and docs/ are what their commands print from the stored rows
(`benchmarks/doc_tables.py`): a block edited by hand, or rows stored anew without `make bench-tables`, fails here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import doc_tables

DOCUMENT = """# A document

<!-- table: python rows.py --from-json -->
| a | b |
|---|---|
| 1 | 2.50 |
<!-- /table -->

Between the blocks.

<!-- text: python other.py --from-json -->
```text
n  cost
4     9
```
<!-- /text -->
"""
PRINTED = {
    "python rows.py --from-json": "| a | b |\n|---|---|\n| 1 | 2.50 |\n",
    "python other.py --from-json": "n  cost\n4     9\n",
}


def _printed(commands: list[str]) -> dict[str, str]:
    return {command: PRINTED[command] for command in commands}


def test_every_document_block_is_what_its_command_prints() -> None:
    stale = doc_tables.stale_blocks(doc_tables.documents())
    assert not stale, "run `make bench-tables`; blocks that differ: " + ", ".join(
        f"{block.document.name}: {block.command}" for block in stale
    )


def test_the_documents_have_blocks() -> None:
    found = [block for path in doc_tables.documents() for block in doc_tables.blocks(path.read_text(), path)]
    assert {block.document.name for block in found} >= {"README.md", "BENCHMARKS.md"}


def test_an_edited_number_is_found_and_rewritten(tmp_path: Path) -> None:
    document = tmp_path / "doc.md"
    document.write_text(DOCUMENT)
    assert doc_tables.stale_blocks([document], _printed) == []
    document.write_text(DOCUMENT.replace("2.50", "2.49"))
    stale = doc_tables.stale_blocks([document], _printed)
    assert [block.command for block in stale] == ["python rows.py --from-json"]
    assert doc_tables.rewrite([document], _printed) == [document]
    assert document.read_text() == DOCUMENT


def test_a_block_is_rewritten_whole_and_the_text_around_it_kept() -> None:
    emptied = DOCUMENT.replace("| 1 | 2.50 |\n", "").replace("4     9\n", "")
    assert doc_tables.regenerate(emptied, PRINTED) == DOCUMENT
