"""README.md tells the truth about CI: .ci/run runs README's test command, exactly."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line.strip() for line in lines if line.startswith("    python3 -m venv")]


def test_readme_has_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert "frostc build plans/examples/default.toml" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci_lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    assert readme_commands()[1] in ci_lines


def readme_toml_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [block.split("```", 1)[0] for block in text.split("```toml\n")[1:]]


def test_every_toml_example_parses_validates_and_resolves():
    """A new user copies these: each must be a whole, valid description as written."""
    from frostc.description import parse_description
    from frostc.resolve import resolve
    from frostc.validate import validate

    blocks = readme_toml_blocks()
    assert len(blocks) >= 3
    for block in blocks:
        plan = resolve(validate(parse_description(block)))
        assert plan.launches


def test_the_builder_example_in_the_readme_names_real_keys():
    from frostc.ops.sdpa import KEYS

    text = (ROOT / "README.md").read_text()
    for key in ("cu_seqlens_q", "seq_len_kv", "window_left", "diagonal_alignment", "softcap", "max_seqlen_q"):
        assert key in text and key in KEYS
