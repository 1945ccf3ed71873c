"""Request parsing, stop strings and streaming detokenization (no model)."""

from __future__ import annotations

import pytest

from k2bench.engine.runtime.protocol import (
    RequestError,
    StopStrings,
    parse_common,
    parse_messages,
    parse_prompt,
)

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from k2bench.engine.model.tiny import write_tiny_checkpoint
    from k2bench.engine.runtime.tokenizer import Tokenizer

    d = write_tiny_checkpoint(tmp_path_factory.mktemp("tok") / "t", quant="bf16")
    return Tokenizer(d)


def test_streamed_text_equals_the_whole_decode_even_through_multibyte_characters(tok):
    from k2bench.engine.runtime.tokenizer import Detokenizer

    text = "Hello, wörld — naïve café 🙂 done. The quick brown fox."
    ids = tok.encode(text)
    d = Detokenizer(tok, [])
    pieces = [d.push(t) for t in ids]
    pieces.append(d.flush())
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_strings_cut_before_the_match_and_never_leak_a_prefix():
    s = StopStrings(["STOP", "\n\n"])
    out, hit = [], False
    for piece in ["Hello ", "wor", "ld S", "TO", "P and more"]:
        text, hit = s.feed(piece)
        out.append(text)
        if hit:
            break
    assert hit and "".join(out) == "Hello world "  # the "S" that arrived early was held back, never sent
    s = StopStrings(["xyz"])
    sent = "".join(s.feed(p)[0] for p in ["abc", "xy"]) + s.flush()
    assert sent == "abcxy"  # no match: everything comes out at the end


def test_chat_template_and_messages(tok):
    msgs = parse_messages({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    assert msgs == [{"role": "user", "content": "hi"}]
    rendered = tok.apply_chat_template(msgs)
    assert rendered.startswith("<|im_user|>user<|im_middle|>hi<|im_end|>") and rendered.endswith("<|im_middle|>")
    with pytest.raises(RequestError):
        parse_messages({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})


def test_parse_common_defaults_and_limits():
    req = parse_common({"max_tokens": 5, "temperature": 0, "stop": "x", "stream": True,
                        "stream_options": {"include_usage": True}}, ("m",), 16)
    assert req.params.max_tokens == 5 and req.params.greedy and req.stop == ["x"] and req.include_usage
    assert parse_common({}, ("m",), None).max_tokens is None
    assert parse_common({"max_completion_tokens": 7}, ("m",), None).params.max_tokens == 7
    for bad in ({"temperature": -1}, {"top_p": 1.5}, {"max_tokens": 0}, {"model": "x"}, {"stream": 1},
                {"stop_token_ids": ["a"]}, {"logprobs": 2}):
        with pytest.raises(RequestError):
            parse_common(bad, ("m",), 16)
    assert parse_prompt({"prompt": ["hi"]}, 10) == "hi"
    assert parse_prompt({"prompt": [[1, 2]]}, 10) == [1, 2]
    with pytest.raises(RequestError, match="vocabulary"):
        parse_prompt({"prompt": [1, 10]}, 10)


def test_encoding_a_long_text_leaves_other_threads_running(tok):
    """The server tokenises in a worker thread so that /health keeps answering; that only helps if the
    tokenizer lets go of the GIL (the `tokenizers` single-text encode holds it for the whole call)."""
    import threading
    import time

    text = "hello world " * 40_000
    span: list[float] = []
    ticks: list[float] = []
    worker = threading.Thread(target=lambda: (span.append(time.monotonic()), tok.encode(text),
                                              span.append(time.monotonic())))
    worker.start()
    while worker.is_alive():
        ticks.append(time.monotonic())
        time.sleep(0.001)
    start, end = span
    middle = [t for t in ticks if start + (end - start) / 4 < t < end - (end - start) / 4]
    assert middle, f"no other thread ran during {end - start:.2f} s of encoding"
    assert tok.encode(text) == tok._tok.encode(text, add_special_tokens=False).ids
