"""--conc: ranges of powers of two, lists, single levels; everything else rejected with a reason. Also the
precision a sweep reads from the model config."""

from __future__ import annotations

import pytest

from k2bench.errors import UserError
from k2bench.harness.cli import main
from k2bench.harness.plan.settings_text import parse_concurrency


@pytest.mark.parametrize(
    ("text", "levels"),
    [
        ("4..128", [4, 8, 16, 32, 64, 128]),
        ("1..4", [1, 2, 4]),
        ("64..64", [64]),
        (" 8 .. 32 ", [8, 16, 32]),
        ("4,8,32", [4, 8, 32]),
        ("4, 12, 48", [4, 12, 48]),
        ("64", [64]),
        ("1", [1]),
    ],
)
def test_accepted(text: str, levels: list[int]) -> None:
    assert parse_concurrency(text) == levels


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("0..128", "at least 1"),
        ("0", "at least 1"),
        ("4,0", "at least 1"),
        ("128..4", "lower bound is above"),
        ("3..128", "powers of two"),
        ("4..100", "powers of two"),
        ("-4..8", "expected a range"),
        ("4-128", "expected a range"),
        ("4..", "expected a range"),
        ("abc", "expected a range"),
        ("", "expected a range"),
        ("4,,8", "expected a range"),
        ("2.5", "expected a range"),
        ("8,8", "listed twice"),
        ("100000", "above the limit"),
    ],
)
def test_rejected_with_reason(text: str, reason: str) -> None:
    with pytest.raises(UserError, match=reason):
        parse_concurrency(text)


def test_cli_rejects_bad_conc_with_one_line_and_nonzero_exit(capsys, tmp_path) -> None:
    code = main(["sweep", "--url", "http://127.0.0.1:9", "--conc", "3..100", "--db", f"sqlite:///{tmp_path}/x.db"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert "powers of two" in err and "Traceback" not in err


def test_counts_per_level_as_numbers_or_multiples_of_concurrency() -> None:
    from k2bench.harness.plan.settings_text import parse_count
    from k2bench.harness.run.sweep import SweepConfig
    from k2bench.workloads.loader import resolve

    w = resolve(None, 64, 8)
    assert parse_count("40", "--num-prompts") == (40, None)
    assert parse_count("1x", "--num-prompts") == (None, 1.0)
    default = SweepConfig(levels=[4, 128], workload=w)
    assert [default.prompts_for(c) for c in (4, 128)] == [40, 1280]  # InferenceX: 10 x conc
    assert [default.warmup_for(c) for c in (4, 128)] == [8, 256]  # and 2 x conc
    scaled = SweepConfig(levels=[4, 128], workload=w, num_prompts_x=1.0, warmup_x=0.5)
    assert [scaled.prompts_for(c) for c in (4, 128)] == [4, 128]
    assert [scaled.warmup_for(c) for c in (4, 128)] == [2, 64]
    assert SweepConfig(levels=[4], workload=w, num_prompts=7).prompts_for(4) == 7


@pytest.mark.parametrize("flag,value", [("--num-prompts", "abc"), ("--num-prompts", "0x"), ("--warmup", "-1x"),
                                        ("--num-prompts", "nanx"), ("--warmup", "infx")])
def test_bad_counts_rejected(flag: str, value: str, capsys) -> None:
    assert main(["sweep", "--url", "http://127.0.0.1:9", f"{flag}={value}"]) == 2
    err = capsys.readouterr().err
    assert err.strip().startswith("k2bench: error:") and flag in err


@pytest.mark.parametrize(
    ("config", "precision"),
    [
        ({"torch_dtype": "bfloat16", "quantization_config": {"quant_method": "quark",
                                                             "global_quant_config": {"weight": {"dtype": "fp4"}}}},
         "mxfp4"),
        ({"quantization_config": {"quant_method": "mxfp4"}}, "mxfp4"),
        ({"torch_dtype": "bfloat16", "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}},
         "nvfp4"),
        ({"torch_dtype": "bfloat16", "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
         "fp8"),
        ({"torch_dtype": "bfloat16"}, "bfloat16"),
    ],
)
def test_precision_read_from_the_model_config(tmp_path, config: dict, precision: str) -> None:
    """The recorded precision is part of the fingerprint: an NVFP4 or FP8 checkpoint must not read as MXFP4/BF16."""
    import json

    from k2bench.harness.record.provenance import precision_of

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert precision_of(tmp_path) == precision
