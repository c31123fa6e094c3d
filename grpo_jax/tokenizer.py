"""Tokenizers behind one interface: a small deterministic character tokenizer for the shipped tasks and an
adapter for local Hugging Face tokenizers.

`CharTokenizer` gives one id per character of a fixed alphabet plus *atomic* think/answer tags, so a tag
costs one token and a 3-digit addition completion is about a dozen tokens: short completions are what
make the CPU experiments fit in minutes. Ids depend only on (alphabet, tags), never on the machine or a
vocabulary file, so a model trained on one machine decodes the same on another.

Neither tokenizer raises on model output: unknown characters encode to `unk_id`, and any id (negative,
out of range) decodes to something printable or is dropped.

Chat templates: `render_chat(messages)` is the prompt text of a conversation with the assistant's turn
opened, exactly transformers' `apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`
(the HF adapter calls it). The text keeps the template's control tokens (`<|im_start|>` ...), and
`encode` maps them to their ids, so encoding the rendered text gives the ids `apply_chat_template` would.
"""

from __future__ import annotations

import abc
import json
import re
import string
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

TAGS = ("<think>", "</think>", "<answer>", "</answer>")
CONTROL = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0..3 in CharTokenizer
# One alphabet for every shipped task, so all of them share ids (and one model can serve several tasks).
TASK_ALPHABET = string.digits + string.ascii_lowercase + " +-*/=:.,?!'()"
# A task whose policy calls a Python tool (grpo_jax/tools.py) needs its markers as single tokens too: the sampler
# pauses a row when it emits the close marker's id. Same strings as config.ToolConfig's defaults.
TOOL_TAGS = ("<python>", "</python>", "<output>", "</output>")
# What code and its printed output or error line add to TASK_ALPHABET ("NameError: name 'x_1' is not defined
# (line 1)", "[output cut: ...]", a line break per printed line). '<' and '>' are characters as well as the first
# and last of every tag: `CharTokenizer.encode` matches whole tags first, so a tag's text is always its one id.
TOOL_ALPHABET = TASK_ALPHABET + string.ascii_uppercase + "\n\t_\"[]{}<>;#%&|^~@$\\`"


class Tokenizer(abc.ABC):
    """What the trainer, sampler and data pipeline need from a tokenizer."""

    vocab_size: int
    pad_id: int
    bos_id: int | None  # None when the tokenizer has no BOS token (e.g. Qwen2)
    eos_id: int

    @abc.abstractmethod
    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Token ids of `text`; no EOS is ever added, BOS only on request."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int], *, stop_at_eos: bool = True, skip_special: bool = False) -> str:
        """Text of `ids`, cut before the first EOS when `stop_at_eos`; never raises. `skip_special` drops
        control tokens (CharTokenizer keeps them by default, HFTokenizer drops them: see there)."""

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt text of a conversation ([{"role", "content"}, ...]) ending in an open assistant turn."""
        raise ValueError(f"{type(self).__name__} has no chat template: 'messages' rows and task.system_prompt "
                         "need a Hugging Face tokenizer that has one")

    def _bos(self, add_bos: bool) -> list[int]:
        if not add_bos:
            return []
        if self.bos_id is None:
            raise ValueError(f"{type(self).__name__} has no BOS token; call with add_bos=False")
        return [self.bos_id]

    def encode_batch(
        self, texts: Sequence[str], *, width: int | None = None, left_pad: bool = True, add_bos: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(tokens int32 [B, P], mask bool [B, P]) padded with `pad_id`, on the left by default (prompts).

        P = `width`, or the longest row when None. A row longer than `width` is an error: silently
        truncating a prompt would change the problem the reward checks.
        """
        rows = [self.encode(t, add_bos=add_bos) for t in texts]
        return pad_rows(rows, width=width, pad_id=self.pad_id, left_pad=left_pad)


def pad_rows(
    rows: Sequence[Sequence[int]], *, width: int | None, pad_id: int, left_pad: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Pack variable-length id lists into (tokens int32 [B, P], mask bool [B, P])."""
    longest = max((len(r) for r in rows), default=0)
    width = longest if width is None else width
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"row {i} has {len(r)} tokens, more than width={width}")
    tokens_BxP = np.full((len(rows), width), pad_id, dtype=np.int32)
    mask_BxP = np.zeros((len(rows), width), dtype=bool)
    for i, r in enumerate(rows):
        cols = slice(width - len(r), width) if left_pad else slice(0, len(r))
        tokens_BxP[i, cols] = r
        mask_BxP[i, cols] = True
    return tokens_BxP, mask_BxP


class CharTokenizer(Tokenizer):
    """Ids: 0 pad, 1 bos, 2 eos, 3 unk, then one per tag, then one per alphabet character (in order)."""

    def __init__(self, alphabet: str = TASK_ALPHABET, specials: Sequence[str] = TAGS):
        if not alphabet or len(set(alphabet)) != len(alphabet):
            raise ValueError(f"alphabet must be non-empty with distinct characters, got {alphabet!r}")
        if len(set(specials)) != len(specials) or not all(isinstance(s, str) and len(s) > 1 for s in specials):
            raise ValueError(f"specials must be distinct strings of 2+ characters, got {specials!r}")
        self.alphabet, self.specials = alphabet, tuple(specials)
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, 3
        self._pieces = CONTROL + self.specials + tuple(alphabet)
        self._ids = {p: i for i, p in enumerate(self._pieces) if i >= len(CONTROL)}
        self.vocab_size = len(self._pieces)
        longest_first = sorted(self.specials, key=len, reverse=True)  # '</think>' before a '<t' prefix
        self._split_re = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if specials else None

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Tags first (greedy, longest first), then one id per character; unknown characters -> unk."""
        ids = self._bos(add_bos)
        chunks = self._split_re.split(text) if self._split_re else [text]
        for k, chunk in enumerate(chunks):
            if k % 2:  # odd chunks are the tags the regex captured
                ids.append(self._ids[chunk])
            else:
                ids.extend(self._ids.get(c, self.unk_id) for c in chunk)
        return ids

    def decode(self, ids: Sequence[int], *, stop_at_eos: bool = True, skip_special: bool = False) -> str:
        """Control tokens print as '<pad>' etc. (or vanish with `skip_special`); bad ids print as '<unk>'."""
        out = []
        for raw in ids:
            i = int(raw)
            if stop_at_eos and i == self.eos_id:
                break
            i = i if 0 <= i < self.vocab_size else self.unk_id
            if i < len(CONTROL) and skip_special:
                continue
            out.append(self._pieces[i])
        return "".join(out)

    def to_json(self) -> str:
        return json.dumps({"type": "char", "alphabet": self.alphabet, "specials": list(self.specials)})

    @classmethod
    def from_json(cls, text: str) -> CharTokenizer:
        spec = json.loads(text)
        if not isinstance(spec, dict) or spec.get("type") != "char":
            raise ValueError(f"not a CharTokenizer description: {text[:200]!r}")
        return cls(spec["alphabet"], spec["specials"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and self._pieces == other._pieces

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, alphabet={self.alphabet!r})"


class HFTokenizer(Tokenizer):
    """A `transformers` tokenizer read from a local folder (never the hub) behind the same interface.

    pad falls back to EOS when the tokenizer defines none (common for decoder-only checkpoints); the
    padding is masked out everywhere, so the choice only has to be a valid id.

    The chat template is the folder's: `tokenizer_config.json`'s "chat_template" or a `chat_template.jinja`
    beside it (transformers reads both; the file is read here too in case the installed version does not).

    `decode` drops control tokens by default (`skip_special=True`): the tokenizer's special added tokens
    (BOS/EOS/pad and the template's markers such as `<|im_start|>`, `<|im_end|>`), so a completion is scored
    on the text the model wrote, not on the chat markup. The think/answer tags (`TAGS`) are kept even
    where a tokenizer registers them as special: the rewards read them.
    """

    def __init__(self, path: str | Path):
        folder = Path(path)
        if not folder.is_dir():
            raise FileNotFoundError(
                f"HFTokenizer needs an existing local tokenizer folder, got {str(path)!r} (hub ids are not fetched)"
            )
        from transformers import AutoTokenizer  # deferred: transformers costs seconds; char tasks never need it

        self.folder = folder
        self.hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        if self.hf.eos_token_id is None:
            raise ValueError(f"tokenizer in {folder} defines no EOS token; generation could never stop")
        self.eos_id = int(self.hf.eos_token_id)
        self.pad_id = int(self.hf.pad_token_id) if self.hf.pad_token_id is not None else self.eos_id
        self.bos_id = None if self.hf.bos_token_id is None else int(self.hf.bos_token_id)
        self.vocab_size = len(self.hf)
        if not getattr(self.hf, "chat_template", None) and (folder / "chat_template.jinja").is_file():
            self.hf.chat_template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        specials = {i for i, t in self.hf.added_tokens_decoder.items() if t.special and t.content not in TAGS}
        specials |= {i for i in (self.bos_id, self.eos_id, self.pad_id) if i is not None}
        self.control_ids = frozenset(int(i) for i in specials)

    @property
    def chat_template(self) -> str | None:
        """The Jinja chat template, or None when the folder has none."""
        return getattr(self.hf, "chat_template", None) or None

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        if not self.chat_template:
            raise ValueError(f"the tokenizer in {self.folder} has no chat template (neither a 'chat_template' in "
                             "tokenizer_config.json nor a chat_template.jinja file): 'messages' rows and "
                             "task.system_prompt need one; use plain 'prompt' rows with task.chat=never")
        from jinja2.exceptions import TemplateError  # deferred as transformers (which brings jinja2)

        try:
            return self.hf.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                               add_generation_prompt=True)
        except TemplateError as e:  # the template's raise_exception(), a syntax error, an undefined name
            raise ValueError(f"the chat template in {self.template_file()} failed on this conversation: "
                             f"{type(e).__name__}: {' '.join(str(e).split())} (fix the template, or the row's "
                             "turns it refuses)") from e

    def template_file(self) -> Path:
        """The file the chat template comes from, for error messages: chat_template.jinja when the folder has
        one (recent transformers save it there and prefer it), else tokenizer_config.json."""
        jinja = self.folder / "chat_template.jinja"
        return jinja if jinja.is_file() else self.folder / "tokenizer_config.json"

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        return self._bos(add_bos) + list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], *, stop_at_eos: bool = True, skip_special: bool = True) -> str:
        """Out-of-range ids are dropped: the HF decoders may raise or crash on them."""
        kept = []
        for raw in ids:
            i = int(raw)
            if stop_at_eos and i == self.eos_id:
                break
            if 0 <= i < self.vocab_size and not (skip_special and i in self.control_ids):
                kept.append(i)
        return self.hf.decode(kept, skip_special_tokens=False)

    def __repr__(self) -> str:
        return f"HFTokenizer(vocab_size={self.vocab_size}, name={self.hf.name_or_path!r})"
