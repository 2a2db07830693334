"""Size limits that keep the shipped code readable (make lint).

No file of the shipped packages over 500 lines; no function over 80 lines outside the controllers'
wiring (``controllers/``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = (ROOT / "operator" / "durable_agents", ROOT / "controllers" / "durable_agents_controllers")
FUNCTIONS = ROOT / "operator" / "durable_agents"  # everything shipped but the controllers' wiring
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80


def problems() -> list[str]:
    found: list[str] = []
    for package in SHIPPED:
        for path in sorted(package.rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > MAX_FILE_LINES:
                found.append(f"{path.relative_to(ROOT)}: {lines} lines (limit {MAX_FILE_LINES})")
    for path in sorted(FUNCTIONS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(
                        f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}() is {length} lines"
                        f" (limit {MAX_FUNCTION_LINES})"
                    )
    return found


if __name__ == "__main__":
    issues = problems()
    for line in issues:
        print(line, file=sys.stderr)
    sys.exit(1 if issues else 0)
