"""What a newcomer reads cannot drift from what it describes: CI runs the README's commands, and
the tools index names every tool."""
import re

import tools
from tests.conftest import REPO


def readme_commands(section: str) -> list:
    text = (REPO / "README.md").read_text()
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", body, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_set_up_and_test_commands():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    setup = readme_commands("Set up (two commands)")
    assert len(setup) == 2
    test_command = [c for c in readme_commands("Run") if "pytest" in c]
    assert len(test_command) == 1
    for command in setup + test_command:
        assert command in ci, f"README command not run by .ci/run: {command}"
    assert "bash run.sh" in readme_commands("Run")


def test_every_tool_is_in_the_tools_index():
    """tools/__init__.py is where a newcomer looks for what measures what."""
    index = tools.__doc__
    names = [p.stem for p in (REPO / "tools").glob("*.py") if p.stem != "__init__"]
    names += [p.name for p in (REPO / "tools").glob("*.sh")]
    assert [name for name in names if name not in index] == []
