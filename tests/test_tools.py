"""The Python tool on the host: finding a call, running it in a fresh sandbox, the appended text, per-row
statistics and their metrics, the proposed alarms, and the multi-turn loop driven by a scripted model."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_jax.config import MonitorConfig, ToolConfig
from grpo_jax.monitor import Monitor
from grpo_jax.rewards.sandbox import SandboxPool, SandboxResult
from grpo_jax.tools import (
    TOOL_ALARM_RULES,
    ToolStats,
    call_at_end,
    find_call,
    run_call,
    run_calls,
    run_turns,
    tool_metrics,
    tool_result,
    tool_timings,
    truncate_output,
)

CFG = ToolConfig(wall_s=3.0, cpu_s=2.0)


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(2) as p:
        yield p


# ------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("kwargs, field", [
    ({"call_open": ""}, "call_open"),
    ({"output_close": "   "}, "output_close"),
    ({"call_close": "<python>"}, "call_close"),
    ({"output_open": "</python>"}, "output_open"),
    ({"max_turns": 0}, "max_turns"),
    ({"max_output_chars": 2.5}, "max_output_chars"),
    ({"wall_s": float("inf")}, "wall_s"),
    ({"cpu_s": -1}, "cpu_s"),
])
def test_bad_tool_config_is_one_line_naming_the_field(kwargs, field):
    with pytest.raises(ValueError) as e:
        ToolConfig(**kwargs)
    assert str(e.value).startswith(f"ToolConfig.{field}:") and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------ finding a call


def test_a_complete_call_is_found_with_its_span():
    text = "Let me compute.\n<python>\nprint(6 * 7)\n</python>"
    call = find_call(text, CFG)
    assert call.code == "\nprint(6 * 7)\n"
    assert text[call.start:call.end] == "<python>\nprint(6 * 7)\n</python>" and call.end == len(text)
    assert call_at_end(text, CFG) == "\nprint(6 * 7)\n"
    assert call_at_end(text + " \n", CFG) == "\nprint(6 * 7)\n"  # trailing whitespace: still the end


def test_an_unclosed_call_keeps_decoding():
    for text in ("<python>\nprint(1)\n", "<python>\nprint(1)\n</pyth", "no call at all", "</python> alone"):
        assert find_call(text, CFG) is None and call_at_end(text, CFG) is None


def test_markers_inside_the_code_strings_are_code():
    text = '<python>\nprint("</python>")\ns = """a\n</python>\n"""\nprint("<python>")\n</python>'
    call = find_call(text, CFG)
    assert call.code == '\nprint("</python>")\ns = """a\n</python>\n"""\nprint("<python>")\n'
    assert call.end == len(text)
    # still inside the string: the call is not complete yet
    assert find_call('<python>\nprint("</python>', CFG) is None
    assert find_call('<python>\nx = """\n</python>', CFG) is None


def test_two_calls_are_found_in_order_and_the_end_is_the_last():
    text = "<python>print(1)</python> then <python>print(2)</python>"
    first = find_call(text, CFG)
    second = find_call(text, CFG, first.end)
    assert (first.code, second.code) == ("print(1)", "print(2)") and second.end == len(text)
    assert call_at_end(text, CFG) == "print(2)"
    assert call_at_end(text + " and more", CFG) is None
    assert find_call(text, CFG, second.end) is None


def test_other_markers_are_configurable():
    cfg = ToolConfig(call_open="<tool_call>", call_close="</tool_call>")
    assert call_at_end("<tool_call>print(1)</tool_call>", cfg) == "print(1)"
    assert call_at_end("<python>print(1)</python>", cfg) is None


# ------------------------------------------------------------------------------------ running and formatting


def test_a_print_is_the_output(pool):
    (result,) = run_calls(["print(6 * 7)"], CFG, pool)
    assert result.text == "<output>\n42\n</output>\n"
    assert (result.status, result.error, result.timeout, result.truncated) == ("ok", False, False, False)


def test_an_exception_shows_what_printed_and_the_last_traceback_line():
    result = run_call("print('before')\nx = 1 / 0\n", CFG)
    assert result.text == "<output>\nbefore\nZeroDivisionError: division by zero (line 2)\n</output>\n"
    assert result.error and not result.timeout


def test_an_infinite_loop_hits_the_time_limit():
    result = run_call("while True:\n    pass\n", ToolConfig(wall_s=1.0, cpu_s=1.0))
    assert result.status in ("timeout", "cpu_limit") and result.error and result.timeout
    assert "TimeoutError: the call" in result.text and result.text.startswith("<output>\n")


def test_the_memory_limit_is_the_tools():
    grab = "b = bytearray(200 * 2 ** 20)\nprint(len(b))"
    assert run_call(grab, CFG).text == f"<output>\n{200 * 2 ** 20}\n</output>\n"  # fits in the default 512 MB
    small = run_call(grab, ToolConfig(memory_mb=128, wall_s=3.0, cpu_s=2.0))
    assert small.status == "memory" and small.error and not small.timeout
    assert small.text == "<output>\nMemoryError: the call ran past its 128 MB memory limit\n</output>\n"


def test_huge_output_is_cut_and_says_how_much():
    result = run_call("print('x' * 5000)", CFG)
    assert result.truncated and not result.error
    assert result.text == "<output>\n" + "x" * 1000 + "\n[output cut: 4000 more characters]\n</output>\n"
    flood = run_call("while True:\n    print('y' * 1000)\n", CFG)  # stopped at the sandbox's 1 MiB cap
    assert flood.status == "output_limit" and flood.truncated and not flood.error
    assert "more than" in flood.text and "stopped for printing too much" in flood.text


def test_a_second_call_sees_nothing_of_the_first(pool):
    first, second = run_calls([
        "x = 41\nopen('state.txt', 'w').write('kept?')\nimport os\nprint(sorted(os.listdir('.')))",
        "import os\nprint(sorted(os.listdir('.')))\nprint('x' in globals())\nprint(x)",
    ], CFG, pool)
    assert first.text == "<output>\n['state.txt']\n</output>\n"
    assert second.text == "<output>\n[]\nFalse\nNameError: name 'x' is not defined (line 4)\n</output>\n"


def _sandbox(status: str, stdout: str = "", stderr: str = "", returncode: int | None = 1) -> SandboxResult:
    return SandboxResult(status, returncode, stdout, stderr, 0.5)


@pytest.mark.parametrize("status, stderr, line", [
    ("timeout", "", "TimeoutError: the call ran past its 3 s wall-clock limit and was stopped"),
    ("cpu_limit", "", "TimeoutError: the call used up its 2 s of CPU time and was stopped"),
    ("memory", "MemoryError\n", "MemoryError: the call ran past its 512 MB memory limit"),
    ("error", "", "the call exited with status 1"),
    ("error", 'Traceback:\n  File "<solution>", line 3\n    x = (\n        ^\nSyntaxError: bad\n',
     "SyntaxError: bad (line 3)"),
    ("setup_failed", "", "the call was stopped (setup_failed)"),
])
def test_error_lines_name_the_cause(status, stderr, line):
    result = tool_result(_sandbox(status, "partial\n", stderr), CFG)
    assert result.text == f"<output>\npartial\n{line}\n</output>\n" and result.error


def test_formatting_of_empty_and_exact_fit_output():
    assert tool_result(_sandbox("ok", returncode=0), CFG).text == "<output>\n</output>\n"
    assert truncate_output("a" * 10, 10, stopped=False) == ("a" * 10, False)
    assert truncate_output("a" * 11, 10, stopped=False) == ("a" * 10 + "\n[output cut: 1 more characters]", True)
    cfg = ToolConfig(output_open="[out]", output_close="[/out]")
    assert tool_result(_sandbox("ok", "7\n", returncode=0), cfg).text == "[out]\n7\n[/out]\n"


# ------------------------------------------------------------------------------------ statistics


def test_metrics_of_a_hand_built_batch():
    stats = [
        ToolStats(),
        ToolStats(calls=2, errors=1, timeouts=1, seconds=1.5),
        ToolStats(calls=3, truncations=1, seconds=0.25),
        ToolStats(calls=1, errors=1, seconds=0.5),
    ]
    assert tool_metrics(stats) == {
        "tool/calls_per_row": 6 / 4, "tool/call_rate": 3 / 4, "tool/error_rate": 2 / 6,
        "tool/timeout_rate": 1 / 6, "tool/truncated_frac": 1 / 6,
    }
    assert tool_timings(stats) == {"tool/seconds": 2.25}  # binary fractions: exact
    silent = tool_metrics([ToolStats(), ToolStats()])
    assert silent["tool/call_rate"] == 0.0 and silent["tool/error_rate"] == 0.0
    with pytest.raises(ValueError, match="stats is empty"):
        tool_metrics([])


def test_stats_add_counts_a_result():
    result = tool_result(_sandbox("timeout"), CFG)
    assert ToolStats().add(result).add(result) == ToolStats(2, 2, 2, 0, 1.0)


@pytest.mark.parametrize("stats, fires", [
    ([ToolStats(), ToolStats()], "tool_never_called"),
    ([ToolStats(calls=2, errors=2), ToolStats(calls=1, errors=1)], "tool_always_errors"),
    ([ToolStats(calls=2, errors=1), ToolStats()], None),
])
def test_proposed_alarms_fire_on_a_collapse_only(stats, fires):
    monitor = Monitor(MonitorConfig(rules=TOOL_ALARM_RULES))
    fired = [a.rule.name for step in range(1, 11) for a in monitor.observe(step, tool_metrics(stats))]
    assert fired == ([fires] if fires else [])


# ------------------------------------------------------------------------------------ the multi-turn loop


def _scripted(scripts: dict[str, list[str]], seen: list[list[str]]):
    """A "model": each row's prompt names its script; turn n of a row returns the script's n-th chunk."""

    def generate(texts: list[str]) -> list[str]:
        seen.append(list(texts))
        out = []
        for text in texts:
            prompt = next(p for p in scripts if text.startswith(p))
            out.append(scripts[prompt][text.count("</output>")])
        return out

    return generate


def test_run_turns_with_a_scripted_model(pool):
    cfg = ToolConfig(max_turns=2, wall_s=3.0, cpu_s=2.0)
    scripts = {
        "Q0:": ["I know it: 12."],
        "Q1:": ["<python>print(6 * 7)</python>DROPPED", " so 42; check <python>print(42 + 1)</python>", " 43."],
        "Q2:": ["<python>print(1)</python>", "<python>print(2)</python>", "<python>print(3)</python>", "never"],
    }
    seen: list[list[str]] = []
    convs = run_turns(list(scripts), _scripted(scripts, seen), cfg, pool)
    assert [len(texts) for texts in seen] == [3, 2, 2]  # rows that ended are not generated again
    assert seen[1][0] == "Q1:<python>print(6 * 7)</python><output>\n42\n</output>\n"  # the model reads the output
    no_call, twice, capped = convs
    assert (no_call.stop, no_call.stats, no_call.text) == ("done", ToolStats(), "I know it: 12.")
    assert twice.stop == "done" and (twice.stats.calls, twice.stats.errors) == (2, 0)
    assert twice.text == ("<python>print(6 * 7)</python><output>\n42\n</output>\n so 42; check "
                          "<python>print(42 + 1)</python><output>\n43\n</output>\n 43.")
    assert [s["role"] for s in twice.segments] == ["model", "tool", "model", "tool", "model"]
    assert twice.segments[1] == {"role": "tool", "code": "print(6 * 7)", "status": "ok",
                                 "text": "<output>\n42\n</output>\n"}
    assert capped.stop == "max_turns" and capped.stats.calls == 2
    assert capped.text.endswith("<output>\n2\n</output>\n<python>print(3)</python>")  # kept, not run
    assert twice.to_dict()["tool"] == dataclasses.asdict(twice.stats) and twice.to_dict()["stop"] == "done"


def test_run_turns_cuts_a_row_at_its_character_cap(pool):
    cfg = ToolConfig(max_chars=40, wall_s=3.0, cpu_s=2.0)
    scripts = {"Q:": ["<python>print('z' * 30)</python>", "unreached"]}
    seen: list[list[str]] = []
    (conv,) = run_turns(list(scripts), _scripted(scripts, seen), cfg, pool)
    assert conv.stop == "max_chars" and len(conv.text) == 40 and conv.stats.calls == 1
    assert len(seen) == 1  # the row ended inside the output: no further turn


def test_run_turns_refuses_a_generator_that_drops_rows(pool):
    with pytest.raises(ValueError, match="returned 1 texts for 2 rows"):
        run_turns(["a", "b"], lambda texts: ["x"], CFG, pool)
