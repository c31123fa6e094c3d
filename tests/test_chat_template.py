"""Chat templates with a real Hugging Face tokenizer built offline: `HFTokenizer.render_chat` / `encode` give
exactly transformers' `apply_chat_template` text and ids; the template is read from tokenizer_config.json or
chat_template.jinja; which rows the loader renders (task.chat, task.system_prompt) and what it refuses; decode
drops the template's control tokens but keeps the think/answer tags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_jax.config import TaskConfig
from grpo_jax.data import DataError, encode_prompts, load_task_data
from grpo_jax.tasks import chat, get_task
from grpo_jax.tokenizer import TAGS, HFTokenizer
from tests.launchers import load_launcher

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
hf_math = load_launcher("hf_math")  # experiments/hf_math.py: the offline Qwen-style tokenizer it builds
CHATML, build_bpe_tokenizer = hf_math.CHATML, hf_math.build_bpe_tokenizer
CONTROL = hf_math.CONTROL_TOKENS  # pad, turn start, turn end (= EOS)

TRAIN_TEXTS = [f"Tom has {a} apples and gets {b} more. How many apples does he have? system user assistant"
               for a in range(20) for b in range(15)]  # 300 short strings


def build_chatml_tokenizer(folder, *, chat_template: str | None = CHATML, special_tags: bool = True) -> Path:
    """experiments/hf_math.py's offline Qwen-style tokenizer (byte-level BPE, ChatML, control tokens), saved to
    `folder` (returned); the think/answer tags registered as special tokens by default, as some checkpoints
    do, so that decode is seen to keep them anyway."""
    build_bpe_tokenizer(str(folder), TRAIN_TEXTS, vocab_size=400, chat_template=chat_template,
                        special_tags=special_tags)
    return Path(folder)


def chatml(turns) -> str:
    """CHATML rendered by hand, with the assistant's turn opened."""
    return "".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in turns) + "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    return build_chatml_tokenizer(tmp_path_factory.mktemp("chatml"))


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory):
    return build_chatml_tokenizer(tmp_path_factory.mktemp("no_template"), chat_template=None)


@pytest.fixture(scope="module")
def tok(chat_dir):
    return HFTokenizer(chat_dir)


def write_rows(path, rows, *, blank_first: bool = False) -> str:
    path.write_text(("\n" if blank_first else "") + "".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def load(path, tokenizer, **cfg):
    cfg.setdefault("n_eval", 0)
    return load_task_data(get_task("jsonl"), TaskConfig(name="jsonl", train_path=str(path), **cfg), 0, tokenizer)


SYSTEM = {"role": "system", "content": "Think inside <think> </think>, then answer inside <answer> </answer>."}
USER = {"role": "user", "content": "Tom has 3 apples and gets 4 more. How many apples does he have?"}
CONVERSATIONS = {
    "user only": [USER],
    "system + user": [SYSTEM, USER],
    "multi-turn": [SYSTEM, USER, {"role": "assistant", "content": "<think>3+4</think><answer>7</answer>"},
                   {"role": "user", "content": "And with 2 more? Caf\u00e9 \u2615 \u00fcber"}],  # non-ASCII: bytes
    "no system, two turns": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                             {"role": "user", "content": "12+30="}],
}


# ------------------------------------------------------------------------- the same text and ids as HF

@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_render_and_encode_equal_apply_chat_template(chat_dir, tok, name):
    """What the sampler is given (render_chat, then encode) must be what the model saw in chat fine-tuning:
    transformers' apply_chat_template, text and ids, token for token."""
    msgs = CONVERSATIONS[name]
    hf = transformers.AutoTokenizer.from_pretrained(str(chat_dir))
    text = tok.render_chat(msgs)
    assert text == hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == chatml(msgs)
    ids = hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # a BatchEncoding (a dict) in transformers 5.x
    assert tok.encode(text) == list(ids)
    # the control tokens are single ids, not spelt out in bytes: one <|im_start|> per turn + the open one
    assert tok.encode(text).count(hf.convert_tokens_to_ids("<|im_start|>")) == len(msgs) + 1
    assert tok.encode(text).count(tok.eos_id) == len(msgs)  # <|im_end|> is the EOS


def test_template_read_from_chat_template_jinja(tmp_path, monkeypatch):
    """A folder whose tokenizer_config.json has no template but a chat_template.jinja beside it (how recent
    transformers save it): the template is found, also by a transformers that reads only the config."""
    folder = build_chatml_tokenizer(tmp_path / "tok", chat_template=None)
    assert "chat_template" not in json.loads((folder / "tokenizer_config.json").read_text())
    assert HFTokenizer(folder).chat_template is None
    (folder / "chat_template.jinja").write_text(CHATML)
    msgs = CONVERSATIONS["system + user"]
    assert HFTokenizer(folder).chat_template == CHATML and HFTokenizer(folder).render_chat(msgs) == chatml(msgs)

    original = transformers.AutoTokenizer.from_pretrained

    def config_only(*args, **kwargs):  # a transformers version that ignores chat_template.jinja
        hf = original(*args, **kwargs)
        hf.chat_template = None
        return hf

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", config_only)
    assert HFTokenizer(folder).render_chat(msgs) == chatml(msgs)  # HFTokenizer read the file itself


# ---------------------------------------------------------------------- which rows the loader renders

PLAIN = [{"prompt": "12+30=", "answer": "42"}, {"prompt": "7*6=", "answer": "42"}]


def test_messages_row_without_a_template_names_file_and_line(plain_dir, tmp_path):
    path = write_rows(tmp_path / "chats.jsonl", [{"messages": [USER], "answer": "7"}], blank_first=True)
    plain = HFTokenizer(plain_dir)
    with pytest.raises(DataError, match=f"^{path}:2: the tokenizer in {plain_dir} has no chat template"):
        load(path, plain)
    with pytest.raises(DataError, match=f"^{path}:2: rendering a chat needs the task's tokenizer"):
        load(path, None)
    prompts = write_rows(tmp_path / "plain.jsonl", PLAIN)
    with pytest.raises(DataError, match=f"^{prompts}:1: the tokenizer .* has no chat template"):
        load(prompts, plain, system_prompt="Be brief.")  # a system prompt needs a chat to sit in


def test_chat_never_refuses_messages_rows(tok, tmp_path):
    path = write_rows(tmp_path / "chats.jsonl", [{"messages": [USER], "answer": "7"}])
    with pytest.raises(DataError, match=f"^{path}:1: the row has 'messages' but task.chat=never"):
        load(path, tok, chat="never")


@pytest.mark.parametrize("folder", ["plain_dir", "chat_dir"])
def test_plain_prompts_are_used_as_written_without_a_system_prompt(folder, tmp_path, request):
    """chat=auto renders only conversations: a base model's plain prompts are not wrapped in a template."""
    path = write_rows(tmp_path / "plain.jsonl", PLAIN)
    rows, _, report = load(path, HFTokenizer(request.getfixturevalue(folder)))
    assert rows == PLAIN and "chat" not in report


def test_system_prompt_renders_plain_rows_as_user_turns(tok, tmp_path):
    path = write_rows(tmp_path / "plain.jsonl", PLAIN)
    rows, _, report = load(path, tok, system_prompt=SYSTEM["content"])
    turns = [SYSTEM, {"role": "user", "content": "12+30="}]
    assert rows[0]["prompt"] == chatml(turns) and rows[0]["messages"] == turns and rows[0]["answer"] == "42"
    assert report["chat"] == {"mode": "auto", "system_prompt": SYSTEM["content"], "rendered_train_rows": 2}
    rows, _, report = load(path, tok, chat="always")  # always, no system prompt: the user turn alone
    assert rows[1]["prompt"] == "<|im_start|>user\n7*6=<|im_end|>\n<|im_start|>assistant\n"
    assert report["chat"]["rendered_train_rows"] == 2


def test_report_counts_messages_rows_anywhere_in_the_file(tok, tmp_path):
    """A file whose first row is a plain prompt and whose second is a conversation: the second is rendered,
    the first used as written, and the data report says one row was rendered (it counts every row, not
    only the first, so "chat" is reported)."""
    path = write_rows(tmp_path / "mixed.jsonl", [PLAIN[0], {"messages": [USER], "answer": "7"}])
    rows, _, report = load(path, tok)
    assert rows[0]["prompt"] == PLAIN[0]["prompt"] and rows[1]["prompt"] == chatml([USER])
    assert report["chat"] == {"mode": "auto", "system_prompt": "", "rendered_train_rows": 1}


def test_a_rows_own_system_turn_wins(tok, tmp_path):
    own = {"role": "system", "content": "You are terse."}
    path = write_rows(tmp_path / "chats.jsonl", [{"messages": [own, USER], "answer": "7"},
                                                 {"messages": [USER], "answer": "7"}])
    rows, _, _ = load(path, tok, system_prompt=SYSTEM["content"])
    assert rows[0]["prompt"] == chatml([own, USER]) and SYSTEM["content"] not in rows[0]["prompt"]
    assert rows[1]["prompt"] == chatml([SYSTEM, USER])  # no system turn of its own: the task's is prepended


def test_conversation_ending_with_the_assistant_is_refused(tok, tmp_path):
    path = write_rows(tmp_path / "chats.jsonl", [{"messages": [USER], "answer": "7"},
                                                 {"messages": [USER, {"role": "assistant", "content": "7"}]}])
    with pytest.raises(DataError, match=f"^{path}:2: messages ends with an assistant turn"):
        load(path, tok)


def test_conversation_modes():
    row = {"prompt": "12+30="}
    assert chat.conversation(row) is None and chat.conversation(row, mode="never", system_prompt="S") is None
    assert chat.conversation(row, mode="always") == [{"role": "user", "content": "12+30="}]
    assert chat.conversation(row, system_prompt="S") == [{"role": "system", "content": "S"},
                                                         {"role": "user", "content": "12+30="}]
    with pytest.raises(ValueError, match="chat mode must be one of"):
        chat.conversation(row, mode="sometimes")


# -------------------------------------------------------------------------------------------- decode

def test_decode_drops_control_tokens_but_keeps_the_tags(tok):
    """A completion is scored on what the model wrote: the template's markers go, the tags the rewards
    read stay, even though this tokenizer registers them as special tokens like the markers."""
    specials = {t.content for t in tok.hf.added_tokens_decoder.values() if t.special}
    assert specials == set(CONTROL) | set(TAGS)
    completion = "<think>3 + 4 = 7</think><answer>7</answer>"
    ids = tok.encode(f"<|im_start|>assistant\n{completion}<|im_end|><|endoftext|><|endoftext|>")
    assert tok.decode(ids, stop_at_eos=False) == "assistant\n" + completion
    assert tok.decode(tok.encode(completion + "<|im_end|>trailing")) == completion  # cut at EOS
    assert "<|im_end|>" in tok.decode(ids, stop_at_eos=False, skip_special=False)
    # why the adapter does not ask transformers to skip special tokens: it would drop the tags too
    assert tok.hf.decode(ids, skip_special_tokens=True) == "assistant\n3 + 4 = 77"


# ---------------------------------------------------------------------------------------- end to end

def test_gsm8k_rows_with_a_system_prompt_end_to_end(chat_dir, tmp_path):
    """The jsonl task's own tokenizer, GSM8K rows and a system prompt: every prompt the sampler gets is the
    apply_chat_template text of (system, question), and its ids are apply_chat_template's."""
    rows = [{"question": f"Tom has {a} apples and gets {b} more. How many apples does he have?",
             "answer": f"He has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"}
            for a, b in [(1, 2), (3, 4), (10, 5)]]
    path = write_rows(tmp_path / "gsm8k.jsonl", rows)
    task = get_task("jsonl", tokenizer_path=str(chat_dir))
    tokenizer = task.tokenizer()
    cfg = TaskConfig(name="jsonl", train_path=path, n_eval=0, system_prompt=SYSTEM["content"])
    loaded, _, report = load_task_data(task, cfg, 0, tokenizer)
    assert report["format"] == "gsm8k" and [r["answer"] for r in loaded] == ["3", "7", "15"]
    hf = transformers.AutoTokenizer.from_pretrained(str(chat_dir))
    for raw, row in zip(rows, loaded, strict=True):
        msgs = [SYSTEM, {"role": "user", "content": raw["question"]}]
        assert row["prompt"] == hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    tokens, mask = encode_prompts(tokenizer, loaded)
    ids = hf.apply_chat_template([SYSTEM, {"role": "user", "content": rows[2]["question"]}], tokenize=True,
                                 add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert tokens[2][mask[2]].tolist() == list(ids)
