"""The regression sets: all pass now, and any change (score or version) fails with a diff listing."""

import json
import shutil

import pytest

from grpo_jax.rewards import REWARDS, regress
from grpo_jax.rewards.registry import reward_version


def test_every_reward_has_a_regression_file_with_cases():
    names = {p.stem for p in regress.REGRESSION_DIR.glob("*.jsonl")}
    assert names == set(REWARDS)
    cases = regress.load_cases()
    assert all(c.path.stem == c.data["reward"] for c in cases)
    assert len(cases) >= 100


def test_regression_sets_pass(capsys):
    assert regress.main([]) == 0
    assert "0 changed" in capsys.readouterr().out


@pytest.fixture
def copied_sets(tmp_path):
    for name in ("format", "math"):
        shutil.copy(regress.REGRESSION_DIR / f"{name}.jsonl", tmp_path)
    return tmp_path


def _rewrite_first(path, **changes):
    lines = path.read_text().splitlines()
    case = json.loads(lines[0])
    case.update(changes)
    lines[0] = json.dumps(case)
    path.write_text("\n".join(lines) + "\n")
    return case


def test_changed_expected_score_fails_with_listing(copied_sets, capsys):
    case = _rewrite_first(copied_sets / "format.jsonl", expected=0.0)  # the first format case scores 1
    assert regress.main(["--dir", str(copied_sets)]) == 1
    out = capsys.readouterr().out
    assert f"CHANGED format.jsonl:1 [format] {case['id']}: expected 0.0, got 1.0" in out
    # re-recording a changed score without a version bump is refused and writes nothing
    before = (copied_sets / "format.jsonl").read_text()
    assert regress.main(["--dir", str(copied_sets), "--record"]) == 2
    assert (copied_sets / "format.jsonl").read_text() == before


def test_stale_version_fails_and_record_updates_it(copied_sets, capsys):
    _rewrite_first(copied_sets / "math.jsonl", version="0")
    assert regress.main(["--dir", str(copied_sets)]) == 1
    assert f"recorded version '0' != current '{reward_version('math')}'" in capsys.readouterr().out
    assert regress.main(["--dir", str(copied_sets), "--record"]) == 0  # scores unchanged: allowed
    assert regress.main(["--dir", str(copied_sets)]) == 0


def test_record_after_a_version_bump(copied_sets, monkeypatch):
    """An intentional change: bump the version, then --record rewrites scores and versions."""
    _rewrite_first(copied_sets / "format.jsonl", expected=0.0)
    bumped = str(int(reward_version("format")) + 1)
    monkeypatch.setattr(REWARDS["format"], "reward_version", bumped)
    assert regress.main(["--dir", str(copied_sets), "--record"]) == 0
    first = json.loads((copied_sets / "format.jsonl").read_text().splitlines()[0])
    assert (first["expected"], first["version"]) == (1.0, bumped)
    assert regress.main(["--dir", str(copied_sets)]) == 0


def test_malformed_case_file_names_the_line(tmp_path):
    (tmp_path / "format.jsonl").write_text('{"id": "x", "reward": "format"}\n')
    with pytest.raises(ValueError, match="format.jsonl:1: case is missing fields"):
        regress.load_cases(tmp_path)
