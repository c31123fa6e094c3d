"""Row formats of public datasets, mapped onto the pipeline's native row and the reward that scores it.

A native row is {"prompt": str} or {"messages": [...]} plus the fields its reward reads ("answer" for
math and science, "tests" / "entry_point" for code, "references" for translation) and "solution", the
ideal completion in the <think>/<answer> format every task teaches (the supervised warm start's target).
Each format names the columns it reads (`a|b`: either name) and what it makes of them:

    format        columns                                        native row                    reward
    humaneval     prompt, test, entry_point [, canonical_solution] prompt, tests, entry_point   code
    mbpp          text|prompt, test_list [, code, test_setup_code, test_imports]
                                                                 prompt (+ the tests), tests   code
    mcq           question, choices, answer (letter or 0-based index)
                                                                 prompt (+ lettered options), answer letter, choices
                                                                                               science
    arc           question|question_stem, choices ({"text": [...], "label": [...]}), answerKey (a label)
                                                                 as mcq                        science
    gsm8k         question, answer ("... #### 42")              prompt, answer "42"           math
    math          problem, solution ("... \\boxed{...}")          prompt, answer (the last box) math
    translation   source|src, target|tgt [, source_lang|src_lang, target_lang|tgt_lang]
                                                                 prompt, references, answer    translation
    wmt           translation ({"de": "...", "en": "..."}; the pair from task options source_lang/target_lang,
                  else the two languages, into English when one is "en")
                                                                 as translation                translation
    prompt_answer prompt|messages [, answer, solution, ...]     the row as it is; a `prompt` that is a list
                                                                 of turns (TRL's conversational prompt) is
                                                                 its `messages`; no `answer`: TRL's
                                                                 `solution` (its last box, or a one-line
                                                                 answer)                       math

`detect_format` picks the first format of that table whose columns a row has (so a HumanEval row, which
has a `prompt`, is not taken for a native one); the other columns of a row pass through unchanged.
Every error is a `RowError` naming the column; the data loader adds the file and line. A format may read
task options (`RowFormat.options`, e.g. wmt's language pair), which `adapt_row` passes it by name.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from grpo_jax.config import ROW_FORMATS, registry
from grpo_jax.rewards.math import boxed_contents
from grpo_jax.tasks.base import formatted
from grpo_jax.tasks.chat import check_messages

Row = dict[str, Any]
NATIVE = "prompt_answer"
LETTERS = "ABCDEFGHIJ"  # the option letters the science reward grades (2..10 options)

MBPP_PROMPT = "{text}\nYour code should pass these tests:\n\n{tests}\n"  # as in the MBPP paper (Austin et al. 2021)
HUMANEVAL_PROMPT = ("Complete the following Python function. Write the whole function, with its imports, in a "
                    "```python code block.\n\n```python\n{stub}\n```")
TRANSLATION_PROMPT = "Translate the following text{direction}:\n\n{source}"
_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, "<<48/2=24>>": not part of the prose
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # "1,000" -> "1000" (a few GSM8K answers have separators)
# English names of the language codes of WMT's pairs, for the prompt ("from German into English"); another
# code is shown as it is.
LANGUAGE_NAMES: Mapping[str, str] = MappingProxyType({
    "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "et": "Estonian", "fi": "Finnish",
    "fr": "French", "gu": "Gujarati", "hi": "Hindi", "ja": "Japanese", "kk": "Kazakh", "lt": "Lithuanian",
    "lv": "Latvian", "pl": "Polish", "ps": "Pashto", "ro": "Romanian", "ru": "Russian", "ta": "Tamil",
    "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese"})


class RowError(ValueError):
    """A row that does not fit its format; the message names the column."""


@dataclass(frozen=True)
class RowFormat:
    name: str
    columns: tuple[tuple[str, ...], ...]  # required columns; each a tuple of accepted names
    family: str  # the reward family that scores it: a key of FAMILY_REWARDS
    adapt: Callable[..., Row]  # raw row (+ the options below, as keyword arguments) -> native row (raises RowError)
    options: tuple[str, ...] = ()  # the task options the format reads (adapt_row passes those given)

    def fits(self, row: Mapping[str, Any]) -> bool:
        return all(any(name in row for name in names) for names in self.columns)

    def describe(self) -> str:
        return f"{self.name} ({', '.join('|'.join(names) for names in self.columns)})"


# ----------------------------------------------------------------------------------- column access

def _missing(row: Mapping[str, Any], names: tuple[str, ...], fmt: str) -> RowError:
    alternatives = " or ".join(repr(n) for n in names)
    return RowError(f"missing column {alternatives} (format {FORMATS[fmt].describe()}); "
                    f"the row has {', '.join(sorted(map(str, row))) or 'no columns'}")


def _text(row: Mapping[str, Any], fmt: str, *names: str) -> str:
    """The first of `names` the row has, which must be a non-blank string."""
    for name in names:
        if name in row:
            value = row[name]
            if not isinstance(value, str) or not value.strip():
                raise RowError(f"column {name!r} must be a non-empty string, got {value!r:.80}")
            return value
    raise _missing(row, names, fmt)


def _optional_text(row: Mapping[str, Any], *names: str) -> str:
    for name in names:
        value = row.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise RowError(f"column {name!r} must be a string, got {type(value).__name__}")
            return value
    return ""


def _strings(row: Mapping[str, Any], fmt: str, name: str) -> list[str]:
    """Column `name` as a non-empty list of non-blank strings."""
    if name not in row:
        raise _missing(row, (name,), fmt)
    value = row[name]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise RowError(f"column {name!r} must be a non-empty list of non-empty strings, got {value!r:.80}")
    return value


def _fence(code: str) -> str:
    return f"```python\n{code.strip(chr(10))}\n```"


# ----------------------------------------------------------------------------------- the formats

def gsm8k_row(row: Row) -> Row:
    """GSM8K: the answer is worked reasoning ending in "#### 42"; the gold answer is what follows the last
    "####" (thousands separators removed), the reasoning (calculator annotations removed) is the thought."""
    question, full = _text(row, "gsm8k", "question"), _text(row, "gsm8k", "answer")
    if "####" not in full:
        raise RowError("column 'answer' has no '#### <final answer>' line (GSM8K answers end with one)")
    reasoning, gold = full.rsplit("####", 1)
    gold = _THOUSANDS.sub("", gold.strip())
    if not gold:
        raise RowError("column 'answer' has nothing after its '####'")
    thought = _CALCULATOR.sub("", reasoning).strip() or gold
    return {**row, "prompt": question, "answer": gold, "solution": formatted(thought, gold)}


def math_row(row: Row) -> Row:
    """MATH (Hendrycks et al.): the gold answer is the content of the solution's last \\boxed{...} (nested
    braces balanced, e.g. \\boxed{\\frac{1}{2}}); the worked solution is the thought."""
    problem, solution = _text(row, "math", "problem"), _text(row, "math", "solution")
    boxes = boxed_contents(solution)
    if not boxes:
        raise RowError("column 'solution' has no \\boxed{...} answer")
    if boxes[-1] is None:
        raise RowError("column 'solution': the last \\boxed{ has unbalanced braces")
    if not boxes[-1].strip():
        raise RowError("column 'solution': the last \\boxed{} is empty")
    answer = boxes[-1].strip()
    return {**row, "prompt": problem, "answer": answer, "solution": formatted(solution.strip(), answer)}


def mbpp_row(row: Row) -> Row:
    """MBPP (Austin et al. 2021; the sanitized split names the task `prompt`): the prompt shows the asserts,
    which name the function to write; each assert is a test case, after the setup code and imports."""
    text, asserts = _text(row, "mbpp", "text", "prompt"), _strings(row, "mbpp", "test_list")
    imports = row.get("test_imports") or []
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise RowError(f"column 'test_imports' must be a list of strings, got {imports!r:.80}")
    setup = "\n".join([*imports, _optional_text(row, "test_setup_code")]).strip()
    out = {**row, "prompt": MBPP_PROMPT.format(text=text.strip(), tests="\n".join(asserts)),
           "tests": [f"{setup}\n{a}" if setup else a for a in asserts]}
    code = _optional_text(row, "code")
    if code.strip():
        out["solution"] = formatted("write the function", _fence(code))
    return out


def humaneval_row(row: Row) -> Row:
    """HumanEval (Chen et al. 2021): the stub (signature and docstring) is shown in a code block; `test`
    defines check(candidate), which the code reward calls on `entry_point`."""
    stub, test = _text(row, "humaneval", "prompt"), _text(row, "humaneval", "test")
    entry = _text(row, "humaneval", "entry_point")
    if not entry.isidentifier():
        raise RowError(f"column 'entry_point' must be a Python identifier, got {entry!r:.80}")
    out = {**row, "prompt": HUMANEVAL_PROMPT.format(stub=stub.strip("\n")), "tests": test, "entry_point": entry}
    body = _optional_text(row, "canonical_solution")
    if body.strip():
        out["solution"] = formatted("complete the function", _fence(stub + body))
    return out


def mcq_row(row: Row) -> Row:
    """Multiple choice: the options are listed under the question as "A. ...", and the answer (a letter,
    "(B)" too, or a 0-based index as MMLU writes it) becomes the option letter the science reward grades."""
    question = _text(row, "mcq", "question")
    choices = row.get("choices")
    if choices is None:
        raise _missing(row, ("choices",), "mcq")
    if (not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS)
            or not all(isinstance(c, (str, int, float)) and not isinstance(c, bool) for c in choices)):
        raise RowError(f"column 'choices' must be a list of 2..{len(LETTERS)} options (strings or numbers), "
                       f"got {choices!r:.80}")
    letters = LETTERS[: len(choices)]
    if "answer" not in row:
        raise _missing(row, ("answer",), "mcq")
    answer = row["answer"]
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        letter = letters[answer]
    elif isinstance(answer, str) and answer.strip().strip("()").upper() in tuple(letters):
        letter = answer.strip().strip("()").upper()
    else:
        raise RowError(f"column 'answer' must be an option letter ({letters[0]}..{letters[-1]}) or a 0-based "
                       f"index below {len(choices)}, got {answer!r:.80}")
    return _lettered(row, question, choices, letter)


def _lettered(row: Row, question: str, choices: list, letter: str) -> Row:
    """The native multiple-choice row: the options listed under the question as "A. ...", the gold option
    letter as the answer, the options as strings (what the science reward reads)."""
    options = "\n".join(f"{letter_}. {choice}" for letter_, choice in zip(LETTERS, choices))
    thought = _optional_text(row, "explanation").strip() or "compare the options"
    return {**row, "prompt": f"{question.strip()}\n\n{options}", "answer": letter,
            "choices": [str(c) for c in choices], "solution": formatted(thought, letter)}


def arc_row(row: Row) -> Row:
    """ARC (Clark et al. 2018; OpenBookQA's `question_stem` and CommonsenseQA ship the same shape): `choices`
    is {"text": [...], "label": [...]} and `answerKey` one of the labels. The options are lettered A, B, ...
    in the order given (a few ARC rows label them "1".."4", which the science reward does not grade), so the
    gold letter is the one at the answer key's position."""
    question = _text(row, "arc", "question", "question_stem")
    if "choices" not in row:
        raise _missing(row, ("choices",), "arc")
    choices = row["choices"]
    texts = choices.get("text") if isinstance(choices, Mapping) else None
    labels = choices.get("label") if isinstance(choices, Mapping) else None
    if (not isinstance(texts, list) or not isinstance(labels, list) or len(texts) != len(labels)
            or not 2 <= len(texts) <= len(LETTERS) or not all(isinstance(t, str) and t.strip() for t in texts)
            or not all(isinstance(x, str) and x.strip() for x in labels) or len(set(labels)) != len(labels)):
        raise RowError(f"column 'choices' must be {{\"text\": [...], \"label\": [...]}}: 2..{len(LETTERS)} non-empty "
                       f"option texts and as many distinct labels, got {choices!r:.120}")
    key = _text(row, "arc", "answerKey").strip()
    if key not in labels:
        raise RowError(f"column 'answerKey' must be one of the labels {labels}, got {row['answerKey']!r:.80}")
    return _lettered(row, question, texts, LETTERS[labels.index(key)])


def translation_row(row: Row) -> Row:
    """Translation pairs: the target (a string or a list of references) is scored by chrF; the prompt names
    the languages when the row gives them."""
    source = _text(row, "translation", "source", "src")
    name = next((n for n in ("target", "tgt") if n in row), None)
    if name is None:
        raise _missing(row, ("target", "tgt"), "translation")
    refs = [row[name]] if isinstance(row[name], str) else row[name]
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
        raise RowError(f"column {name!r} must be a non-empty string or list of them, got {row[name]!r:.80}")
    src_lang = _optional_text(row, "source_lang", "src_lang").strip()
    tgt_lang = _optional_text(row, "target_lang", "tgt_lang").strip()
    return _translated(row, source, refs, src_lang, tgt_lang)


def _translated(row: Row, source: str, refs: list[str], src_lang: str, tgt_lang: str) -> Row:
    """The native translation row: the prompt (naming the languages given), the references chrF scores."""
    direction = (f" from {src_lang}" if src_lang else "") + (f" into {tgt_lang}" if tgt_lang else "")
    return {**row, "prompt": TRANSLATION_PROMPT.format(direction=direction, source=source.strip()),
            "references": refs, "answer": refs[0], "solution": formatted("translate", refs[0])}


def language_pair(languages: list[str], source_lang: str = "", target_lang: str = "") -> tuple[str, str]:
    """(source, target) among the language keys of a `translation` object: the task options when given (one
    of them is enough when there are two keys, the other is the remaining key); else, of two keys of which
    one is "en", the other into English, the direction WMT's configs name (wmt14 "de-en", "fr-en", ...;
    the dataset writes the keys sorted, so their order says nothing). Anything else is ambiguous: RowError."""
    for option, lang in (("source_lang", source_lang), ("target_lang", target_lang)):
        if lang and lang not in languages:
            raise RowError(f"column 'translation' has no {lang!r} text (task option {option}={lang!r}); "
                           f"it has {', '.join(languages)}")
    if source_lang and target_lang:
        pair = (source_lang, target_lang)
    elif (source_lang or target_lang) and len(languages) == 2:
        other = next(x for x in languages if x != (source_lang or target_lang))
        pair = (source_lang, other) if source_lang else (other, target_lang)
    elif not (source_lang or target_lang) and len(languages) == 2 and "en" in languages:
        pair = (next(x for x in languages if x != "en"), "en")
    else:
        raise RowError(f"column 'translation' has the languages {', '.join(languages)}: which to translate from "
                       "and into is ambiguous; set task.options source_lang and target_lang (keys of the object)")
    if pair[0] == pair[1]:
        raise RowError(f"task options source_lang and target_lang are both {pair[0]!r}: name two languages")
    return pair


def wmt_row(row: Row, *, source_lang: str = "", target_lang: str = "") -> Row:
    """WMT (and every Hugging Face `Translation` dataset): {"translation": {"de": "...", "en": "..."}}; the
    pair is `language_pair`'s, the prompt names the languages (English names of the usual codes)."""
    pairs = row.get("translation")
    if "translation" not in row:
        raise _missing(row, ("translation",), "wmt")
    if (not isinstance(pairs, Mapping) or len(pairs) < 2
            or not all(isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in pairs.items())):
        raise RowError(f"column 'translation' must be an object of two or more {{language: non-empty text}}, "
                       f"got {pairs!r:.120}")
    src, tgt = language_pair(list(pairs), source_lang, target_lang)
    return _translated(row, pairs[src], [pairs[tgt]], LANGUAGE_NAMES.get(src, src), LANGUAGE_NAMES.get(tgt, tgt))


TRL_SOLUTION_CHARS = 200  # a one-line `solution` up to this long is a final answer, longer is a worked solution


def trl_answer(solution: Any) -> str | None:
    """The reference answer in a TRL-style `solution` column (TRL's accuracy reward compares a completion with
    it): the content of its last balanced \\boxed{...}, else the column itself when it is one line of at most
    TRL_SOLUTION_CHARS characters (surrounding $ removed); None for anything else (a worked solution without a
    box, a non-string): the row then needs an `answer`."""
    if not isinstance(solution, str) or not solution.strip():
        return None
    boxes = [b for b in boxed_contents(solution) if b is not None and b.strip()]
    if boxes:
        return boxes[-1].strip()
    text = solution.strip()
    if "\n" in text or len(text) > TRL_SOLUTION_CHARS:
        return None
    return text.strip("$").strip() or None


def native_row(row: Row) -> Row:
    """The pipeline's own rows: a `prompt` string or a `messages` conversation (not both); the other
    fields are checked by the loader against the task's required fields. A `prompt` that is a list of turns
    (TRL's conversational format: [{"role": "user", "content": ...}]) is read as the row's `messages`, and a
    row without `answer` takes it from a TRL-style `solution` (`trl_answer`)."""
    if "answer" not in row and (answer := trl_answer(row.get("solution"))) is not None:
        row = {**row, "answer": answer}
    if isinstance(row.get("prompt"), list):
        if "messages" in row:
            raise RowError("the row has both a conversational 'prompt' (a list of turns) and 'messages': keep one")
        row = {**{k: v for k, v in row.items() if k != "prompt"}, "messages": row["prompt"]}
    if "prompt" in row and "messages" in row:
        raise RowError("the row has both 'prompt' and 'messages': keep one")
    if "messages" in row:
        problem = check_messages(row["messages"])
        if problem:
            raise RowError(problem)
    return row


# The formats by name, in detection order: the order of config.ROW_FORMATS, the one list of their names (less
# "auto", which picks one of them). A format listed there and not defined here, or the reverse, fails at import.
_NAMES = tuple(name for name in ROW_FORMATS if name != "auto")
FORMATS: Mapping[str, RowFormat] = MappingProxyType(registry("row format", _NAMES, {f.name: f for f in (
    RowFormat("humaneval", (("prompt",), ("test",), ("entry_point",)), "code", humaneval_row),
    RowFormat("mbpp", (("text", "prompt"), ("test_list",)), "code", mbpp_row),
    RowFormat("mcq", (("question",), ("choices",), ("answer",)), "mcq", mcq_row),
    RowFormat("arc", (("question", "question_stem"), ("choices",), ("answerKey",)), "mcq", arc_row),
    RowFormat("gsm8k", (("question",), ("answer",)), "math", gsm8k_row),
    RowFormat("math", (("problem",), ("solution",)), "math", math_row),
    RowFormat("translation", (("source", "src"), ("target", "tgt")), "translation", translation_row),
    RowFormat("wmt", (("translation",),), "translation", wmt_row, ("source_lang", "target_lang")),
    RowFormat(NATIVE, (("prompt", "messages"),), "math", native_row),
)}))

# The rewards of each family: correctness (weight 1) then the think/answer format reward.
FAMILY_REWARDS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "math": {"name": "math", "kwargs": {}},
    "code": {"name": "code", "kwargs": {}},  # run sandboxed (grpo_jax/rewards/sandbox.py)
    "mcq": {"name": "science", "kwargs": {}},
    "translation": {"name": "translation", "kwargs": {"metric": "chrf"}},
})


# The fields each family's reward reads from a native row (besides the prompt): checked when rows are loaded.
FAMILY_FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "math": ("answer",), "code": ("tests",), "mcq": ("answer",), "translation": ("references",)})


# The fixed wording each format wraps around a row's own text: the format's instruction, which prompt cleaning
# (rewards.sanitize) must never rewrite.
PROMPT_TEMPLATES: Mapping[str, str] = MappingProxyType(
    {"mbpp": MBPP_PROMPT, "humaneval": HUMANEVAL_PROMPT, "translation": TRANSLATION_PROMPT, "wmt": TRANSLATION_PROMPT})


def fixed_text(fmt: str) -> tuple[str, ...]:
    """The literal pieces (between the `{fields}`) of format `fmt`'s prompt template that hold more than
    whitespace; () for a format that uses the row's text as it is."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown row format {fmt!r}; known: {', '.join(FORMATS)}")
    template = PROMPT_TEMPLATES.get(fmt, "")
    return tuple(p for p, *_ in string.Formatter().parse(template) if p.strip())


def detect_format(row: Any, among: tuple[str, ...] | None = None) -> str:
    """The format of a row from its columns: the first of FORMATS (in order; only those in `among` when
    given) whose columns it has."""
    candidates = [f for f in FORMATS.values() if among is None or f.name in among]
    if isinstance(row, Mapping):
        for fmt in candidates:
            if fmt.fits(row):
                return fmt.name
        have = ", ".join(sorted(map(str, row))) or "none"
    else:
        have = f"none (a {type(row).__name__}, not an object)"
    known = "; ".join(f.describe() for f in candidates)
    raise RowError(f"cannot tell the row format from its columns ({have}); the formats read here: {known}. "
                   "Rename the columns or set task.format")


def adapt_row(row: Any, fmt: str, options: Mapping[str, Any] | None = None) -> Row:
    """The native row of a raw row of format `fmt` (a key of FORMATS); RowError names the problem.
    `options` (the task's options) may hold more than the format reads: it gets those it names."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown row format {fmt!r}; known: {', '.join(FORMATS)}")
    if not isinstance(row, dict):
        raise RowError(f"row must be a JSON object, got {type(row).__name__}")
    given = {k: options[k] for k in FORMATS[fmt].options if options and options.get(k)}
    return FORMATS[fmt].adapt(row, **given)


def reward_specs(fmt: str, format_weight: float) -> list[dict[str, Any]]:
    """The reward specs of rows of format `fmt`: its family's correctness reward, then the format reward."""
    main = FAMILY_REWARDS[FORMATS[fmt].family]
    return [{"name": main["name"], "weight": 1.0, "kwargs": dict(main["kwargs"])},
            {"name": "format", "weight": format_weight, "kwargs": {}}]
