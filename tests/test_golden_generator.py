"""The golden vectors are what the reference implementation of ClickHouse's load balancing
(tests/golden/generate.py, written from ClickHouse's source) computes: regenerated here and
compared with the committed file, so that neither can drift from the other unnoticed."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).parent / "golden" / "generate.py"


@pytest.fixture(scope="module")
def generate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("golden_generate", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_committed_vectors_are_what_the_reference_computes(generate: ModuleType) -> None:
    committed = generate.VECTORS.read_text()
    cases = generate.load()
    assert len(cases) >= 40
    assert generate.dump([generate.regenerate(case) for case in cases]) == committed


@pytest.mark.parametrize(
    ("case_id", "field", "wrong"),
    [
        (5, "expected", ["example01-01-2", "example01-02-2", "zzzzzzzzzzzzzz"]),  # errors ignored
        (13, "order_groups", [["sde301", "sde505", "sfe10101"]]),  # prefix ignored
        (72, "expected", ["a", "b", "c"]),  # slowdowns ignored
        (75, "expected_errors_after_each_call", [3, 1, 0, 0]),  # leftover kept
        (86, "attempts", ["a", "a", "b"]),
    ],
)
def test_a_wrong_vector_is_caught(generate: ModuleType, case_id: int, field: str, wrong: object) -> None:
    (case,) = [c for c in generate.load() if c["id"] == case_id]
    tampered = copy.deepcopy(case)
    tampered[field] = wrong
    assert generate.regenerate(tampered) == case


def test_the_check_command(generate: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["--check"]) == 0
    cases = generate.load()
    cases[0]["expected"] = list(reversed(cases[0]["expected"]))
    path = tmp_path / "ordering.jsonl"
    path.write_text(generate.dump(cases))
    assert generate.main(["--check", "--path", str(path)]) == 1
    assert f"ids [{cases[0]['id']}]" in capsys.readouterr().err
    assert generate.main(["--path", str(path)]) == 0  # regenerating repairs it
    assert path.read_text() == generate.VECTORS.read_text()
