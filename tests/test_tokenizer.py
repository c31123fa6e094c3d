"""Tokenizers: round trips on task text, atomic tags, unk handling, total decode, padding, HF adapter."""

from __future__ import annotations

import json

import numpy as np
import pytest

from grpo_jax.tasks import SYNTHETIC, TASKS
from grpo_jax.tokenizer import TAGS, TASK_ALPHABET, CharTokenizer, HFTokenizer

TOK = CharTokenizer()


def test_ids_are_fixed_by_the_alphabet():
    # ids: pad 0, bos 1, eos 2, unk 3, four tags 4..7, then the alphabet in order, so '0' is 8 and '1' is 9
    assert (TOK.pad_id, TOK.bos_id, TOK.eos_id, TOK.unk_id) == (0, 1, 2, 3)
    assert TOK.encode("01") == [8, 9]
    assert [TOK.encode(t) for t in TAGS] == [[4], [5], [6], [7]]
    # 10 digits + 26 letters + 14 punctuation/space characters + 8 specials
    assert len(TASK_ALPHABET) == 50 and TOK.vocab_size == 58


@pytest.mark.parametrize("name", SYNTHETIC)
def test_round_trip_on_task_text(name):
    task = TASKS[name]
    for row in task.generate("train", 50, seed=0):
        for text in (row["prompt"], task.solution(row)):
            ids = TOK.encode(text)
            assert TOK.unk_id not in ids
            assert TOK.decode(ids) == text


def test_tags_are_single_tokens_and_matched_greedily():
    ids = TOK.encode("<think>add</think><answer>168</answer>")
    # 1 tag + 'add' + 1 tag + 1 tag + '168' + 1 tag = 10 tokens
    assert len(ids) == 10
    assert ids[0] == TOK.encode("<think>")[0] and ids[-1] == TOK.encode("</answer>")[0]
    # a broken tag is ordinary characters ('<' and '>' are not in the alphabet: unk)
    assert TOK.encode("<thin") == [TOK.unk_id] + TOK.encode("thin")
    # the tag matcher does not care what surrounds it
    assert TOK.encode("a<answer>b") == TOK.encode("a") + TOK.encode("<answer>") + TOK.encode("b")


def test_unknown_characters_map_to_unk_and_never_raise():
    assert TOK.encode("A\u20ac\n") == [TOK.unk_id] * 3
    assert TOK.decode(TOK.encode("1A")) == "1<unk>"
    assert TOK.decode(TOK.encode("1A"), skip_special=True) == "1"


def test_decode_of_arbitrary_ids_never_raises():
    rng = np.random.default_rng(0)
    for _ in range(200):
        ids = rng.integers(-20, TOK.vocab_size + 20, size=int(rng.integers(0, 40)))
        text = TOK.decode(ids, stop_at_eos=False)
        assert isinstance(text, str)
        assert "<pad>" not in TOK.decode(ids, stop_at_eos=False, skip_special=True)


def test_decode_stops_at_eos():
    ids = TOK.encode("12") + [TOK.eos_id] + TOK.encode("34") + [TOK.pad_id]
    assert TOK.decode(ids) == "12"
    assert TOK.decode(ids, stop_at_eos=False) == "12<eos>34<pad>"
    assert TOK.decode(ids, stop_at_eos=False, skip_special=True) == "1234"


def test_encode_batch_pads_left_by_default():
    tokens, mask = TOK.encode_batch(["12", "1+2="])
    one, two, plus, eq = (TOK.encode(c)[0] for c in "12+=")
    assert tokens.dtype == np.int32 and mask.dtype == bool and tokens.shape == (2, 4)
    np.testing.assert_array_equal(tokens, [[0, 0, one, two], [one, plus, two, eq]])
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1], [1, 1, 1, 1]])
    tokens, mask = TOK.encode_batch(["12"], width=3, left_pad=False, add_bos=True)
    np.testing.assert_array_equal(tokens, [[TOK.bos_id, one, two]])
    with pytest.raises(ValueError, match="row 1 has 4 tokens, more than width=3"):
        TOK.encode_batch(["12", "1+2="], width=3)


def test_json_round_trip_and_validation():
    custom = CharTokenizer("ab", specials=("<think>",))
    again = CharTokenizer.from_json(custom.to_json())
    assert again == custom and again.encode("a<think>b") == [5, 4, 6]
    assert CharTokenizer.from_json(json.dumps(json.loads(TOK.to_json()))) == TOK
    with pytest.raises(ValueError, match="distinct"):
        CharTokenizer("aa")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny word-level fast tokenizer built in memory and saved like a checkpoint's tokenizer files."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3, "hello": 4, "world": 5, "again": 6}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="[PAD]", bos_token="[BOS]", eos_token="[EOS]", unk_token="[UNK]"
    )
    path = tmp_path_factory.mktemp("hf_tok")
    fast.save_pretrained(path)
    return path


def test_hf_tokenizer_same_interface(hf_dir):
    tok = HFTokenizer(hf_dir)
    assert (tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id) == (7, 0, 1, 2)
    assert tok.encode("hello world") == [4, 5]
    assert tok.encode("hello", add_bos=True) == [1, 4]
    assert tok.decode([4, 5, 2, 6]) == "hello world"  # cut at EOS
    assert tok.decode([4, -3, 99, 5], stop_at_eos=False) == "hello world"  # bad ids dropped, no raise
    tokens, mask = tok.encode_batch(["hello", "hello world again"])
    np.testing.assert_array_equal(tokens, [[0, 0, 4], [4, 5, 6]])
    np.testing.assert_array_equal(mask, [[0, 0, 1], [1, 1, 1]])


def test_hf_tokenizer_refuses_anything_but_a_local_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="local tokenizer folder.*'gpt2'"):
        HFTokenizer("gpt2")
    with pytest.raises(FileNotFoundError, match="local tokenizer folder"):
        HFTokenizer(tmp_path / "missing")
