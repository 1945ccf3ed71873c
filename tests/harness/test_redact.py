"""The redaction rules: each secret shape is masked, and look-alikes that are not secrets are kept."""

from __future__ import annotations

import os
import shlex
import stat

import pytest

from k2bench.harness import redact

SECRET_NAMES = ["HF_TOKEN", "OPENAI_API_KEY", "MY_DB_PASS", "DB_PASSWD", "ORACLE_PWD", "GITHUB_PAT", "CLIENT_SECRET",
                "AWS_SECRET_ACCESS_KEY", "GOOGLE_APPLICATION_CREDENTIALS", "BASIC_AUTH", "SENTRY_DSN", "DBPASSWORD",
                "HFTOKEN", "apiKey", "--api-key", "--hf-token", "--db-password", "access_token", "sig", "X-Amz-Signature"]
PLAIN_NAMES = ["PWD", "OLDPWD", "KEYBOARD_LAYOUT", "MONKEY_MODE", "TOKENIZERS_PARALLELISM", "PATH", "PATH_INFO",
               "OMP_NUM_THREADS", "PASSENGER_HOME", "--max-num-batched-tokens", "--max-tokens", "--ssl-keyfile",
               "AUTHOR", "--port", "CUDA_VISIBLE_DEVICES", "page"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name: str) -> None:
    assert redact.is_secret_name(name)


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_names_that_only_look_like_secrets(name: str) -> None:
    assert not redact.is_secret_name(name)


@pytest.mark.parametrize(("given", "masked"), [
    ("http://user:pa55w0rd@host:8000/v1", "http://user:***@host:8000/v1"),
    ("postgresql+psycopg2://bench:pw@db.example:5432/k2", "postgresql+psycopg2://bench:***@db.example:5432/k2"),
    ("https://ghp_abcdefghijklmnopqrstuvwx@github.com/o/r", "https://***@github.com/o/r"),
    ("https://h/x?token=abc&page=2", "https://h/x?token=***&page=2"),
    ("https://h/blob?sv=1&sig=Zm9v%2B&se=2", "https://h/blob?sv=1&sig=***&se=2"),
    ("https://h/cb?code=1&access_token=t0k#frag", "https://h/cb?code=1&access_token=***#frag"),
    ("see http://a:b@h and http://c:d@i", "see http://a:***@h and http://c:***@i"),
    ("redis://:p@ss@cache:6379/0", "redis://:***@cache:6379/0"),
])
def test_url_user_info_and_query_tokens_are_masked(given: str, masked: str) -> None:
    assert redact.text(given) == masked
    assert redact.text(masked) == masked  # masking twice changes nothing


@pytest.mark.parametrize("plain", [
    "http://127.0.0.1:8000", "postgresql://postgres@127.0.0.1:54329/k2", "sqlite:////tmp/k.db",
    "https://h/x?page=2&sort=asc", "mail me at someone@example.com", "PWD=/home/x", "KEYBOARD_LAYOUT=us",
])
def test_text_without_secrets_is_unchanged(plain: str) -> None:
    assert redact.text(plain) == plain


def test_environment() -> None:
    env = {"HF_TOKEN": "x", "MY_DB_PASS": "p", "GH_PAT": "t", "PWD": "/home/x", "KEYBOARD_LAYOUT": "us",
           "OMP_NUM_THREADS": "1", "K2BENCH_DB": "postgresql://u:p@h/d", "DATABASE_URL": "mysql://a:b@h/d"}
    assert redact.env(env) == {"HF_TOKEN": "***", "MY_DB_PASS": "***", "GH_PAT": "***", "PWD": "/home/x",
                               "KEYBOARD_LAYOUT": "us", "OMP_NUM_THREADS": "1", "K2BENCH_DB": "postgresql://u:***@h/d",
                               "DATABASE_URL": "mysql://a:***@h/d"}


def test_arguments_both_flag_forms_urls_and_quoted_commands() -> None:
    argv = ["sweep", "--api-key", "s3cret", "--db", "postgresql://bench:pw0rd@db.example/k2",
            "--server-args", "--hf-token=abc123 --tp 4", "--token=t0k", "--conc", "4",
            "--server-cmd", "env HF_TOKEN=hf1 MY_PASS='a b' {python} srv.py --port {port} --max-tokens 9"]
    masked = redact.argv(argv)
    text = " ".join(masked)
    for secret in ("s3cret", "pw0rd", "abc123", "t0k", "hf1", "a b"):
        assert secret not in text
    assert masked[:3] == ["sweep", "--api-key", "***"] and "postgresql://bench:***@db.example/k2" in masked
    assert "'--hf-token=***' --tp 4" in masked and "--token=***" in masked and masked[8:10] == ["--conc", "4"]
    assert shlex.split(masked[-1]) == ["env", "HF_TOKEN=***", "MY_PASS=***", "{python}", "srv.py", "--port", "{port}",
                                       "--max-tokens", "9"]
    assert redact.values_in_argv(argv) == {"s3cret", "pw0rd", "abc123", "t0k", "hf1", "a b"}


def test_command_line_with_leading_environment() -> None:
    cmd = redact.command("AITER_X=1 SECRET_KEY=zz PWD=/w python3 -m srv --api-key k9 --port 8")
    assert cmd == "AITER_X=1 SECRET_KEY='***' PWD=/w python3 -m srv --api-key '***' --port 8"
    assert redact.command("x 'unbalanced http://u:p@h") == "x 'unbalanced http://u:***@h"
    plain = "python serve.py --port {port} --notes 'two words'"
    assert redact.command(plain) == plain  # nothing secret: kept as written, not re-quoted


def test_known_values_are_scrubbed_from_free_text_with_short_ones_left() -> None:
    secrets = redact.Secrets(["s3cret-key", None, "ab"]).add_env({"HF_TOKEN": "hf-val", "OMP_NUM_THREADS": "16"})
    secrets.add_text("http://u:pw0rd@h")
    line = "server: auth s3cret-key, hf-val, pw0rd; 16 threads; ab"
    assert secrets.scrub(line) == "server: auth ***, ***, ***; 16 threads; ab"


def test_deep_masks_every_string_and_keeps_other_values() -> None:
    meta = {"extra": {"base_url": "http://u:p@h", "n": 3, "l": ["x?token=t", None]}}
    assert redact.deep(meta) == {"extra": {"base_url": "http://u:***@h", "n": 3, "l": ["x?token=***", None]}}


def test_scrub_file_rewrites_owner_only(tmp_path) -> None:
    log = tmp_path / "server.log"
    log.write_text("listening; key=s3cret-key\n")
    os.chmod(log, 0o644)
    redact.scrub_file(log, redact.Secrets(["s3cret-key"]))
    assert log.read_text() == "listening; key=***\n"
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["server.log"]


def test_a_secret_named_switch_does_not_hide_the_next_flag() -> None:
    words = ["--return-tokens-as-token-ids", "--port", "8000", "--api-key", "k3y-value"]
    assert redact.argv(words) == ["--return-tokens-as-token-ids", "--port", "8000", "--api-key", "***"]
    assert redact.values_in_argv(words) == {"k3y-value"}


def test_a_request_error_keeps_no_url_password() -> None:
    import aiohttp
    import yarl
    from multidict import CIMultiDict, CIMultiDictProxy

    from k2bench.harness.load.loadgen import _describe

    url = yarl.URL("http://bench:Pw0rd-x@h:1/v1/completions")
    info = aiohttp.RequestInfo(url, "POST", CIMultiDictProxy(CIMultiDict()), url)
    error = _describe(aiohttp.ClientResponseError(info, (), status=500, message="boom"))
    assert "Pw0rd-x" not in error and "url='http://bench:***@h:1/v1/completions'" in error
