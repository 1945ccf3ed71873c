"""Tokenizer (Hugging Face `tokenizers`), the chat template (jinja2), and streaming detokenization."""

from __future__ import annotations

import json
from pathlib import Path


class TokenizerError(ValueError):
    pass


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # {"content": "<|eos|>", ...} in some tokenizer_config.json files
        return value.get("content")
    return value


class Tokenizer:
    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer as HFTokenizer

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{model_dir}: no tokenizer.json (the server needs it for text prompts)")
        self._tok = HFTokenizer.from_file(str(path))
        conf_path = model_dir / "tokenizer_config.json"
        conf = json.loads(conf_path.read_text()) if conf_path.is_file() else {}
        self.bos_token = _token_text(conf.get("bos_token"))
        self.eos_token = _token_text(conf.get("eos_token"))
        self.add_bos = bool(conf.get("add_bos_token", False))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.vocab_size = self._tok.get_vocab_size()
        template = conf.get("chat_template")
        if not template and (model_dir / "chat_template.jinja").is_file():  # newer HF layout
            template = (model_dir / "chat_template.jinja").read_text()
        if isinstance(template, list):  # [{"name": "default", "template": "..."}]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        self._template = None
        if template:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(template)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        # encode_batch releases the GIL while it works (encode does not), so a long prompt tokenised in
        # the server's worker thread does not stall the event loop
        ids = self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        if add_special and self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def vocab_strings(self) -> list[str]:
        """Every vocabulary entry as the tokenizer stores it (for the server's bytes-per-token bound)."""
        return list(self._tok.get_vocab(with_added_tokens=True))

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise TokenizerError("this model's tokenizer_config.json has no chat_template; use /v1/completions")
        import jinja2

        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"chat template failed: {exc}") from exc


def _raise(msg: str):
    raise TokenizerError(msg)


class Detokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding the whole output.

    Text is released only once it no longer ends in a partial UTF-8 character (U+FFFD).
    """

    def __init__(self, tok: Tokenizer, prompt_tail: list[int]):
        self.tok = tok
        self.ids = list(prompt_tail[-4:])
        self.prefix = 0
        self.read = len(self.ids)

    def push(self, token: int) -> str:
        self.ids.append(token)
        prefix_text = self.tok.decode(self.ids[self.prefix : self.read])
        text = self.tok.decode(self.ids[self.prefix :])
        if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
            delta = text[len(prefix_text) :]
            self.prefix = self.read
            self.read = len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held back at the end of the stream."""
        prefix_text = self.tok.decode(self.ids[self.prefix : self.read])
        text = self.tok.decode(self.ids[self.prefix :])
        return text[len(prefix_text) :] if len(text) > len(prefix_text) else ""
