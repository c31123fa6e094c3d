"""Data pipeline: row validation errors name file:line and field, atomic writes, a resumable epoch stream,
strata and pass-rate filtering, prompt/completion encoding."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from grpo_jax.data import (
    Cursor,
    DataError,
    PromptStream,
    encode_completions,
    encode_prompts,
    epoch_order,
    filter_by_pass_rate,
    load_jsonl,
    next_batch,
    next_indices,
    strata_summary,
    write_jsonl,
)
from grpo_jax.tokenizer import CharTokenizer

GOOD = '{"prompt": "1+1=", "answer": "2"}'


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"prompt": "x", ', "invalid JSON"),
        ("[1, 2]", "row must be a JSON object, got list"),
        ('{"answer": "2"}', "missing required field 'prompt'"),
        ('{"prompt": ""}', "field 'prompt' is empty"),
        ('{"prompt": 5}', "field 'prompt' must be str, got int"),
        ('{"prompt": "x", "references": 3}', "field 'references' must be str/list, got int"),
        ('{"prompt": "x", "pass_rate": 1.5}', "field 'pass_rate' must be in \\[0, 1\\]"),
        ('{"prompt": "x", "pass_rate": true}', "field 'pass_rate' must be int/float, got bool"),
    ],
)
def test_bad_row_names_file_line_and_field(tmp_path, bad, message):
    path = tmp_path / "rows.jsonl"
    path.write_text(f"{GOOD}\n\n{bad}\n{GOOD}\n")  # the blank line still counts: the bad row is line 3
    with pytest.raises(DataError, match=f"^{path}:3: {message}"):
        load_jsonl(path)


def test_required_fields_are_configurable_and_blank_lines_skipped(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(f"\n{GOOD}\n   \n")
    assert load_jsonl(path, required=("prompt", "answer")) == [{"prompt": "1+1=", "answer": "2"}]
    with pytest.raises(DataError, match=":2: missing required field 'references'"):
        load_jsonl(path, required=("prompt", "references"))


def test_write_is_atomic(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [{"prompt": "\u00e9t\u00e9", "answer": 1}, {"prompt": "b", "references": ["x"]}]
    write_jsonl(path, rows)
    assert load_jsonl(path) == rows

    def exploding():
        yield {"prompt": "new"}
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_jsonl(path, exploding())
    assert load_jsonl(path) == rows  # the old file is untouched
    assert os.listdir(tmp_path) == ["rows.jsonl"]  # and no temp file is left behind


def test_resume_from_saved_cursor_equals_uninterrupted():
    rows = [{"prompt": str(i)} for i in range(23)]
    cursor, straight = Cursor(), []
    for _ in range(10):
        batch, cursor = next_batch(rows, 7, cursor, seed=5)
        straight.append(batch)
    cursor, resumed = Cursor(), []
    for _ in range(4):
        batch, cursor = next_batch(rows, 7, cursor, seed=5)
        resumed.append(batch)
    cursor = Cursor.from_dict(json.loads(json.dumps(cursor.to_dict())))  # as a checkpoint would store it
    for _ in range(6):
        batch, cursor = next_batch(rows, 7, cursor, seed=5)
        resumed.append(batch)
    assert resumed == straight
    # 70 rows served = 3 full epochs of 23 (69) + 1 row of the fourth
    assert cursor == Cursor(epoch=3, index=1)


def test_batches_walk_each_epoch_permutation_across_boundaries():
    n, seed = 23, 1
    served, cursor = [], Cursor()
    for _ in range(10):  # 7 does not divide 23, so batches straddle epoch boundaries
        idx, cursor = next_indices(n, 7, cursor, seed=seed)
        served.extend(idx.tolist())
    expected = np.concatenate([epoch_order(n, e, seed=seed) for e in range(4)])[:70]
    assert served == expected.tolist()
    for e in range(3):
        assert sorted(served[e * n : (e + 1) * n]) == list(range(n))  # every row once per epoch
    idx, after = next_indices(5, 12, Cursor(), seed=0)  # a batch larger than the dataset
    assert len(idx) == 12 and after == Cursor(epoch=2, index=2)


def test_epoch_orders_differ_across_epochs_and_seeds():
    base = epoch_order(50, 0, seed=0)
    assert sorted(base.tolist()) == list(range(50))
    assert not np.array_equal(base, epoch_order(50, 1, seed=0))
    assert not np.array_equal(base, epoch_order(50, 0, seed=1))
    np.testing.assert_array_equal(base, epoch_order(50, 0, seed=0))


def test_prompt_stream_keeps_the_cursor():
    rows = [{"prompt": str(i)} for i in range(10)]
    stream = PromptStream(rows, batch_size=4, seed=2)
    batch, idx = stream.next()
    assert [r["prompt"] for r in batch] == [str(i) for i in idx] and stream.cursor == Cursor(0, 4)
    assert next_batch(rows, 4, Cursor(0, 4), seed=2)[0] == stream.next()[0]


def test_cursor_validation():
    assert Cursor.from_dict({"epoch": np.int64(2), "index": np.array(3)}) == Cursor(2, 3)
    with pytest.raises(DataError, match="Cursor.index must be a non-negative int"):
        Cursor.from_dict({"epoch": 0, "index": 1.5})
    with pytest.raises(DataError, match="exactly the fields"):
        Cursor.from_dict({"epoch": 0})
    with pytest.raises(DataError, match="past the 3 rows"):
        next_indices(3, 1, Cursor(0, 3), seed=0)


RATES = [0.0, 0.125, 0.5, 1.0, 0.875, 0.0]


def test_pass_rate_filter_counts():
    rows = [{"prompt": str(i), "pass_rate": r} for i, r in enumerate(RATES)]
    kept, report = filter_by_pass_rate(rows, 0.1, 0.9)
    # kept: 0.125, 0.5, 0.875; below 0.1: the two zeros; above 0.9: the 1.0
    assert [r["pass_rate"] for r in kept] == [0.125, 0.5, 0.875]
    assert report == {"total": 6, "kept": 3, "below": 2, "above": 1, "lo": 0.1, "hi": 0.9}
    kept, _ = filter_by_pass_rate(rows, 0.5, 0.5)  # both bounds inclusive
    assert [r["pass_rate"] for r in kept] == [0.5]
    with pytest.raises(DataError, match="row 2: field 'pass_rate' missing"):
        filter_by_pass_rate(rows[:2] + [{"prompt": "x"}], 0.0, 1.0)


def test_strata_summary():
    rows = [{"prompt": str(i), "pass_rate": r, "difficulty": d} for i, (r, d) in enumerate(zip(RATES, [2, 10, 2, 0, 1, 2]))]
    # buckets: 0 -> two zeros; (0,0.5) -> 0.125; [0.5,1) -> 0.5, 0.875; 1 -> 1.0
    assert list(strata_summary(rows, "pass_rate").items()) == [("0", 2), ("(0,0.5)", 1), ("[0.5,1)", 2), ("1", 1)]
    # numeric order, not string order (10 after 2)
    assert list(strata_summary(rows + [{"prompt": "y"}]).items()) == [("0", 1), ("1", 1), ("2", 3), ("10", 1), ("missing", 1)]


def test_encode_prompts_and_completions():
    tok = CharTokenizer()
    tokens, mask = encode_prompts(tok, [{"prompt": "1+1="}, {"prompt": "12"}], width=5)
    assert tokens.shape == mask.shape == (2, 5)
    assert tok.decode(tokens[1][mask[1]]) == "12" and mask[1].tolist() == [0, 0, 0, 1, 1]
    tokens, mask = encode_completions(tok, ["<think>a</think>", "b"])
    # row 0: 3 tokens + EOS; row 1: 'b' + EOS, right-padded to 4
    assert tokens[1].tolist() == [tok.encode("b")[0], tok.eos_id, tok.pad_id, tok.pad_id]
    assert mask.sum(axis=1).tolist() == [4, 2]


def test_non_utf8_byte_names_file_line_and_column(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(GOOD.encode() + b'\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: not UTF-8 \(byte 0xe9 at column 16\)"):
        load_jsonl(path)


def test_empty_jsonl_files_name_the_file_and_the_setting(tmp_path):
    from grpo_jax.config import TaskConfig
    from grpo_jax.data import load_task_data
    from grpo_jax.tasks import get_task

    empty, good = tmp_path / "empty.jsonl", tmp_path / "good.jsonl"
    empty.write_text("\n  \n")
    good.write_text(GOOD + "\n")
    task = get_task("arithmetic")
    with pytest.raises(DataError, match=r"empty\.jsonl: no rows .*task\.train_path"):
        load_task_data(task, TaskConfig(train_path=str(empty)), 0)
    with pytest.raises(DataError, match=r"empty\.jsonl: no rows .*task\.eval_path.*task\.n_eval=0"):
        load_task_data(task, TaskConfig(train_path=str(good), eval_path=str(empty), n_eval=4), 0)
    rows, eval_rows, _ = load_task_data(task, TaskConfig(train_path=str(good), eval_path=str(empty), n_eval=0), 0)
    assert len(rows) == 1 and eval_rows == []


def _math_rows(path, n: int, *, repeat: int = 1) -> str:
    """A jsonl_math training file of n distinct prompts, each written `repeat` times in a row."""
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                            for i in range(n) for _ in range(repeat)))
    return str(path)


def test_a_file_task_without_an_eval_file_holds_out_a_slice_of_its_training_file(tmp_path):
    """No task.eval_path: min(n_eval, 10% of the distinct prompts) are held out, drawn by the seed, and none
    of them is trained on, not even a repeat of one; the same seed draws the same slice."""
    from grpo_jax.config import TaskConfig
    from grpo_jax.data import holdout_summary, load_task_data
    from grpo_jax.tasks import get_task

    task = get_task("jsonl_math", tokenizer_path="unused")
    path = _math_rows(tmp_path / "train.jsonl", 60, repeat=2)  # 120 rows, 60 prompts
    cfg = TaskConfig(name="jsonl_math", train_path=path, n_eval=500)
    rows, eval_rows, report = load_task_data(task, cfg, 0)
    assert len(eval_rows) == 6 == len({r["prompt"] for r in eval_rows})  # 10% of 60 prompts, each once
    assert not {r["prompt"] for r in rows} & {r["prompt"] for r in eval_rows}
    assert len(rows) == 120 - 12 and report["rows"] == len(rows)  # both copies of a held prompt left training
    assert report["eval_holdout"] == {"rows": 12, "of": 120, "prompts": 6, "seed": 0}
    assert holdout_summary(report["eval_holdout"]).startswith(
        "no task.eval_path: holding out 12 of 120 training rows for evaluation")
    again, other = load_task_data(task, cfg, 0)[1], load_task_data(task, cfg, 1)[1]
    assert again == eval_rows and other != eval_rows
    small = load_task_data(task, TaskConfig(name="jsonl_math", train_path=path, n_eval=2), 0)[1]
    assert len(small) == 2  # task.n_eval caps the slice below 10%
    _, none, report = load_task_data(task, TaskConfig(name="jsonl_math", train_path=path, n_eval=0), 0)
    assert none == [] and "eval_holdout" not in report


def test_a_training_file_too_small_to_hold_out_from_asks_for_task_eval_path(tmp_path):
    """Fewer than 10 distinct prompts leave none to hold out: one line naming the file, task.eval_path and
    task.n_eval=0 (not "set task.train_path", which is set)."""
    from grpo_jax.config import TaskConfig
    from grpo_jax.data import load_task_data
    from grpo_jax.tasks import get_task

    task = get_task("jsonl_math", tokenizer_path="unused")
    path = _math_rows(tmp_path / "few.jsonl", 9, repeat=3)
    with pytest.raises(DataError, match=r"few\.jsonl: no task\.eval_path, and 9 distinct prompts are too few.*"
                                        r"set task\.eval_path.*task\.n_eval=0") as err:
        load_task_data(task, TaskConfig(name="jsonl_math", train_path=path, n_eval=4), 0)
    assert "\n" not in str(err.value) and "train_path" not in str(err.value)
    with pytest.raises(ValueError, match=r"'train' split.*set task\.train_path"):
        task.generate("train", 4, 0)
