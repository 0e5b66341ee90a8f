import pytest

from checkmate import format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000), ("4096", 4096), (" 2 KiB ", 2048), ("8gib", 8 * 2**30), (7, 7)],
)
def test_parse_bytes(text, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["-1", "12 parsecs", "", "MiB", -5, float("inf"), True])
def test_parse_bytes_rejects_nonsense(text) -> None:
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_format_bytes() -> None:
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(10) == "10 B"
