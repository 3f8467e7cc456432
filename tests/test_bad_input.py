"""Bad input: exit code 2 and one `error: FILE: key: ...` line, no traceback, nothing written or echoed."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from sim.cli import main
from sim.config.scenario import load_scenario
from sim.io import tomltext
from sim.io.limits import RUN_MAX_REQUESTS, RUN_MAX_TOKENS
from sim.studies import run_size
from sim.studies.run_size import estimate

ROOT = Path(__file__).resolve().parents[1]
CONVOY = ROOT / "scenarios" / "convoy.toml"
ORACLE = ROOT / "tests" / "data" / "oracle"
LLAMA = ROOT / "sim" / "catalog" / "models" / "llama-2-7b.json"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the `sim` command in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    code = exit_info.value.code
    return (code if isinstance(code, int) else 0), out, err


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The single error line of a command that must fail with exit code 2."""
    code, out, err = cli(capsys, *args)
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def scenario(tmp_path: Path, **changes: Any) -> Path:
    """A small scenario file (fixed lengths, 20 requests) with top-level tables replaced by `changes`."""
    data: dict[str, Any] = {
        "name": "small",
        "model": {"name": "llama-2-7b", "gpu": "A100-80GB"},
        "workload": {
            "arrival": {"kind": "poisson", "rate": 10.0},
            "prompt": {"kind": "fixed", "value": 100},
            "output": {"kind": "fixed", "value": 10},
        },
        "horizon": {"max_requests": 20},
        "policies": {"c": {"scheduler": "continuous"}},
        **changes,
    }
    path = tmp_path / "small.toml"
    path.write_text(tomltext.dumps(data))
    return path


# --- scenario files -----------------------------------------------------------------------------------


def test_binary_non_utf8_and_folder_scenarios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bin.toml").write_bytes(bytes(range(256)))
    assert "bin.toml: not a UTF-8 text file" in refused(capsys, "run", tmp_path / "bin.toml")
    (tmp_path / "latin.toml").write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    assert "latin.toml: not a UTF-8 text file" in refused(capsys, "run", tmp_path / "latin.toml")
    (tmp_path / "dir.toml").mkdir()
    assert "dir.toml: is a folder, not a scenario file" in refused(capsys, "run", tmp_path / "dir.toml")
    (tmp_path / "nul.toml").write_bytes(b"\x00\x00\x00")
    assert "nul.toml: not valid TOML" in refused(capsys, "sweep", tmp_path / "nul.toml")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("workload.output.cv=inf", "workload.output.cv"),
        ("workload.arrival.rate=inf", "workload.arrival.rate"),
        ("workload.arrival.rate=nan", "workload.arrival.rate"),
        ("horizon.duration_s=inf", "horizon.duration_s"),
        ("workload.arrival.rate=1e308", "workload.arrival.rate"),
        ("horizon.duration_s=1e300", "horizon.duration_s"),
        ("workload.prompt.max=1e30", "workload.prompt.max"),
        ("model.max_model_len=9223372036854775807", "model.max_model_len"),
        ("model.num_kv_blocks=9223372036854775807", "model.num_kv_blocks"),
        ("policies.static.batch_timeout_s=inf", "policies.static.batch_timeout_s"),
        ("calibration.bandwidth_eff=0", "calibration.bandwidth_eff"),
        ("calibration.step_overhead_s=-1", "calibration.step_overhead_s"),
        ("calibration.compute_eff_prefill=0", "calibration.compute_eff_prefill"),  # divided by zero
        ("calibration.compute_eff_decode=20", "calibration.compute_eff_decode"),
        ("calibration.bandwidth_eff=1.5", "calibration.bandwidth_eff"),  # a fraction of the peak
        ("calibration.bogus=0.5", "calibration.bogus"),  # named no file
    ],
)
def test_numbers_out_of_range_are_refused(
    capsys: pytest.CaptureFixture[str], override: str, key: str
) -> None:
    """Infinite, NaN or unrepresentable values fail at once (they used to run until memory was gone)."""
    line = refused(capsys, "run", CONVOY, "--set", override)
    assert f"convoy.toml: {key}:" in line


def test_policy_names_cannot_leave_the_output_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario(tmp_path, policies={"../escape": {"scheduler": "continuous"}})
    assert "policies.../escape: a policy name is letters" in refused(
        capsys, "run", path, "--out", tmp_path / "o"
    )
    assert not (tmp_path / "escape").exists()


# --- run size -----------------------------------------------------------------------------------------


def test_size_estimate_matches_rate_times_duration(tmp_path: Path) -> None:
    path = scenario(tmp_path, horizon={"duration_s": 50.0})
    size = estimate(load_scenario(path), tmp_path)
    assert size.requests == pytest.approx(10.0 * 50.0)
    assert size.tokens == pytest.approx(500 * (100 + 10))
    capped = scenario(tmp_path, horizon={"duration_s": 50.0, "max_requests": 7})
    assert estimate(load_scenario(capped), tmp_path).requests == 7


def test_closed_loop_and_staged_estimates(tmp_path: Path) -> None:
    staged = {"kind": "staged", "stages": [[2.0, 10.0], [4.0, 10.0]]}
    path = scenario(
        tmp_path, workload={"arrival": staged, "prompt": {"kind": "fixed", "value": 5}, "ignore_eos": True},
        horizon={"duration_s": 15.0},
    )  # fmt: skip
    size = estimate(load_scenario(path), tmp_path)
    assert size.requests == pytest.approx(2 * 10 + 4 * 5)
    assert size.tokens == pytest.approx(40 * (5 + 1024))  # ignore_eos: every request runs to max_tokens
    users = {"kind": "closed_loop", "users": 4, "think_time_s": 1.0}
    lengths = {"prompt": {"kind": "fixed", "value": 5}, "output": {"kind": "fixed", "value": 1}}
    path = scenario(tmp_path, workload={"arrival": users, **lengths}, horizon={"duration_s": 10.0})
    # Each user's cycle is at least its 1 s think time: at most 4 x (1 + 10 / 1) requests.
    assert estimate(load_scenario(path), tmp_path).requests <= 44


def test_large_run_is_refused_with_its_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(
        capsys, "run", CONVOY, "--set", "workload.arrival.rate=1000", "--set", "horizon.duration_s=5000"
    )
    assert "about 5,000,000 requests" in line and f"limit {RUN_MAX_REQUESTS:,}" in line and "--force" in line
    line = refused(capsys, "sweep", CONVOY, "--set", "sweep.rates=[2000]", "--set", "sweep.params={}",
                   "--set", "horizon.duration_s=1000")  # fmt: skip
    assert line.startswith("error: sweep point (rate = 2000.0): ") and "about 2,000,000 requests" in line


def test_force_runs_past_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_size, "RUN_MAX_REQUESTS", 10)
    path = scenario(tmp_path)
    assert "about 20 requests (limit 10)" in refused(capsys, "run", path, "--out", tmp_path / "a")
    assert not (tmp_path / "a").exists()
    code, _, err = cli(capsys, "run", path, "--out", tmp_path / "b", "--force")
    assert code == 0, err
    assert json.loads((tmp_path / "b" / "c" / "summary.json").read_text())["requests"]["arrived"] == 20


def test_schema_states_the_run_limits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "schema")
    horizon = json.loads(out)["$defs"]["HorizonSection"]["description"]
    assert (
        code == 0 and f"{RUN_MAX_REQUESTS:,} requests" in horizon and f"{RUN_MAX_TOKENS:,} tokens" in horizon
    )


# --- output paths -------------------------------------------------------------------------------------


def test_out_naming_a_file_is_refused_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "taken"
    target.write_text("keep me\n")
    for command in ("run", "sweep"):
        line = refused(capsys, command, CONVOY, "--out", target)
        assert "--out" in line and "is a file, not a folder" in line
    assert target.read_text() == "keep me\n"


def test_out_in_a_read_only_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere; stand in for the permission check a user would fail
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    try:
        assert "is not writable" in refused(capsys, "run", CONVOY, "--out", locked / "out")
    finally:
        locked.chmod(0o755)
    assert list(locked.iterdir()) == []


def test_replay_out_into_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(
        capsys, "replay-steps", ORACLE / "basic.trace.json", "--out", tmp_path / "nowhere" / "s.jsonl"
    )
    assert "nowhere does not exist" in line


# --- options ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["capacity", "llama-2-7b", "--gpu", "A100-80GB", "--max-model-len", "0"],
        ["capacity", "llama-2-7b", "--gpu", "A100-80GB", "--tp", "0"],
        ["sweep", str(CONVOY), "--jobs", "0"],
        ["replay-steps", str(ORACLE / "basic.trace.json"), "--max-model-len", "0"],
        ["run", str(CONVOY), "--bogus"],
    ],
)
def test_bad_options_give_one_error_line(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    refused(capsys, *args)


def test_near_miss_gpu_name_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(capsys, "run", CONVOY, "--set", "model.gpu='A100-80G'")
    assert "model.gpu: unknown GPU 'A100-80G'; did you mean A100-80GB" in line


# --- model config.json --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("hidden_size", "4096", "hidden_size: expected a whole number (got a string)"),
        ("hidden_size", -5, "hidden_size: expected a whole number in [1, "),
        ("num_hidden_layers", 32.5, "num_hidden_layers: expected a whole number (got a fraction)"),
        ("vocab_size", [1], "vocab_size: expected a whole number (got a list)"),
        ("num_attention_heads", 2**40, "num_attention_heads: expected a whole number in [1, "),
        ("tie_word_embeddings", "yes", "tie_word_embeddings: expected true or false"),
        ("torch_dtype", 16, "torch_dtype: expected a string"),
        ("torch_dtype", "float7", "torch_dtype: unknown dtype"),
        ("model_type", ["llama"], "model_type: expected a string"),
    ],
)
def test_malformed_config_json_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any, expected: str
) -> None:
    config = json.loads(LLAMA.read_text())
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    line = refused(capsys, "capacity", tmp_path / "config.json", "--gpu", "A100-80GB")
    assert f"config.json: {expected}" in line


@pytest.mark.parametrize("text", [b"[1, 2]", b"\xff\xfe\x00", b"{", b"[" * 100_000])
def test_config_json_that_is_no_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: bytes
) -> None:
    (tmp_path / "config.json").write_bytes(text)
    assert "config.json: " in refused(capsys, "capacity", tmp_path / "config.json", "--gpu", "A100-80GB")


# --- traces and logs ----------------------------------------------------------------------------------


def test_trace_with_a_huge_prompt_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2^63 - 1 prompt tokens overflowed the token arithmetic into negative latencies."""
    (tmp_path / "t.csv").write_text(
        "arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,9223372036854775807,10\n"
    )
    path = scenario(tmp_path, workload={"arrival": {"kind": "trace", "path": "t.csv"}},
                    horizon={"max_requests": 5, "drain": True})  # fmt: skip
    line = refused(capsys, "run", path, "--out", tmp_path / "o")
    assert "t.csv: line 3: column 'prompt_tokens': expected a whole number in [1, 16777216]" in line


def test_trace_errors_never_echo_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Pointed at a secrets file, the error names the file (and line and column), not what it holds."""
    secret = "hunter2-s3cr3t"
    (tmp_path / "secrets").write_text(f"password={secret}\nuser=root\n")
    (tmp_path / "cells.csv").write_text(f"arrival_s,prompt_tokens,output_tokens\n0,{secret},1\n")
    (tmp_path / "rows.jsonl").write_text(f'{{"arrival_s": 0}}\n{{"{secret}": 1\n')
    for name, expected in [
        ("secrets", "secrets: no arrival column"),
        ("cells.csv", "cells.csv: line 2: column 'prompt_tokens': not a finite number"),
        ("rows.jsonl", "rows.jsonl: line 2: not valid JSON"),
    ]:
        path = scenario(tmp_path, workload={"arrival": {"kind": "trace", "path": name}})
        line = refused(capsys, "run", path, "--out", tmp_path / "o")
        assert expected in line and secret not in line and "password" not in line
    empirical = {"kind": "empirical", "path": "secrets", "column": "tokens"}
    path = scenario(tmp_path, workload={"arrival": {"kind": "poisson", "rate": 1.0}, "prompt": empirical,
                                        "output": {"kind": "fixed", "value": 1}})  # fmt: skip
    line = refused(capsys, "run", path, "--out", tmp_path / "o")
    assert "secrets: no column 'tokens'" in line and secret not in line


def test_replay_trace_errors_never_echo_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = "hunter2-s3cr3t"
    (tmp_path / "t.json").write_text(
        json.dumps([{"id": "a", "arrival_step": secret, "prompt_len": 1, "max_tokens": 1}])
    )
    line = refused(capsys, "replay-steps", tmp_path / "t.json")
    assert "t.json: request 0: field 'arrival_step': expected a whole number" in line and secret not in line
    (tmp_path / "big.json").write_text(
        json.dumps([{"id": 1, "arrival_step": 0, "prompt_len": 2**63 - 1, "max_tokens": 1}])
    )
    assert "field 'prompt_len': expected a whole number in [1, " in refused(
        capsys, "replay-steps", tmp_path / "big.json"
    )


def test_cut_gzip_log_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cut gzip used to end in click's bare 'Aborted.'."""
    whole = (ORACLE / "basic.steps.jsonl.gz").read_bytes()
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    line = refused(
        capsys, "replay-steps", ORACLE / "basic.trace.json", "--compare", tmp_path / "cut.jsonl.gz"
    )
    assert "cut.jsonl.gz: cannot read steps log: a cut or damaged gzip file" in line
    (tmp_path / "cfg.jsonl.gz").write_bytes(gzip.compress(b'{"config": {"block_size": "16"}}\n'))
    line = refused(
        capsys, "replay-steps", ORACLE / "basic.trace.json", "--compare", tmp_path / "cfg.jsonl.gz"
    )
    assert "cfg.jsonl.gz: line 1: config.block_size: expected a whole number" in line


def test_cut_gzip_trace_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(ROOT / "tests" / "data" / "traces" / "splitwise_conv_head200.csv", tmp_path / "t.csv")
    whole = gzip.compress((tmp_path / "t.csv").read_bytes())
    (tmp_path / "t.csv.gz").write_bytes(whole[: len(whole) // 2])
    path = scenario(tmp_path, workload={"arrival": {"kind": "trace", "path": "t.csv.gz"}})
    assert "t.csv.gz: a cut or damaged gzip file" in refused(capsys, "run", path, "--out", tmp_path / "o")


@pytest.mark.parametrize("value", ["[]", "{}", "3"])
def test_scheduler_that_is_no_name(capsys: pytest.CaptureFixture[str], value: str) -> None:
    """A list as scheduler name raised TypeError (unhashable) instead of naming the key."""
    line = refused(capsys, "run", CONVOY, "--set", f"policies.static.scheduler={value}")
    assert "convoy.toml: policies.static.scheduler: unknown scheduler" in line


def test_validate_and_calibrate_outputs_are_checked_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    assert "is a file, not a folder" in refused(
        capsys, "validate", "ground-truth", "--out", tmp_path / "file"
    )
    line = refused(capsys, "calibrate", "--write", tmp_path / "missing" / "c.toml")
    assert "folder" in line and "does not exist" in line


# --- calibration files ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[[", "c.toml: not valid TOML"),
        ("calibration = 3\n", "c.toml: calibration: expected a table of parameters"),
        ("[calibration]\nattn_fixed_s = 'a'\n", "c.toml: calibration.attn_fixed_s: expected a number"),
        ("[calibration]\nattn_fixed_s = -1\n", "c.toml: calibration.attn_fixed_s: must be in [0, 1]"),
        ("[calibration]\ngemm_compute_eff_fp8 = 0\n", "c.toml: calibration.gemm_compute_eff_fp8: must be in"),
        ("[calibration]\nattn_compute_eff = nan\n", "c.toml: calibration.attn_compute_eff: must be in"),
    ],
)
def test_bad_kernel_calibration_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    """Malformed TOML and non-numbers were tracebacks; zero or negative values gave nonsense step times."""
    (tmp_path / "c.toml").write_text(text)
    line = refused(capsys, "step", "llama-2-7b", "--gpu", "H100", "--prefill", "8", "--calibration",
                   tmp_path / "c.toml")  # fmt: skip
    assert expected in line


def test_bad_roofline_calibration_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.toml").write_text("[calibration]\nbandwidth_eff = 'a'\n")
    line = refused(capsys, "validate", "ground-truth", "--calibration", tmp_path / "c.toml", "--row", "x")
    assert "c.toml: calibration.bandwidth_eff: expected a number (got 'a')" in line


# --- sim step -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--batch", "99999999999", "--context", "8"], "--batch in [1, 10000000]"),  # ran out of memory
        (["--batch", "1", "--context", "99999999999"], "--context in [0, 16777216]"),
        (["--prefill", "99999999999"], "--prefill: expected a token count in [1, 16777216]"),
        (["--prefill", "8", "--tp", "3"], "tensor parallel degree 3 must divide the 32 attention heads"),
        (["--prefill", "8", "--tp", "1000"], "--tp"),
    ],
)
def test_step_sizes_out_of_range(capsys: pytest.CaptureFixture[str], args: list[str], expected: str) -> None:
    """A TP degree that cannot split the heads gave a step time, as `sim capacity` refuses it."""
    assert expected in refused(capsys, "step", "llama-3.1-8b", "--gpu", "H200", *args)


@pytest.mark.parametrize(
    "command", [["capacity", "llama-3.1-8b"], ["step", "llama-3.1-8b", "--prefill", "8"]]
)
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--kv-dtype", "int4"], "--kv-dtype: expected one of bf16, fp16, fp8, int8 (got 'int4')"),
        (["--weight-dtype", "int4", "--weight-group-size", "3"], "--weight-group-size: expected 0"),
        (["--weight-group-size", "64"], "--weight-group-size: applies to int4 or int8 weights"),
    ],
)
def test_formats_a_scenario_refuses_are_refused_on_the_command_line(
    capsys: pytest.CaptureFixture[str], command: list[str], args: list[str], expected: str
) -> None:
    """`model.kv_dtype = "int4"` is refused in a scenario; `--kv-dtype int4` gave figures for it."""
    assert expected in refused(capsys, *command, "--gpu", "L4", *args)


def test_unknown_draft_model(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown `--draft-model` was a pydantic traceback."""
    line = refused(capsys, "capacity", "llama-2-7b", "--gpu", "H100", "--draft-model", "nope")
    assert "--draft-model: unknown model 'nope'" in line


def test_replay_parallel_samples_bounded_as_in_a_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`n` up to 10,000,000 was accepted: a million samples of one request replayed for hours."""
    (tmp_path / "t.json").write_text(
        json.dumps([{"id": "a", "arrival_step": 0, "prompt_len": 8, "max_tokens": 2, "n": 1025}])
    )
    line = refused(capsys, "replay-steps", tmp_path / "t.json")
    assert "t.json: request 0: field 'n': expected a whole number in [1, 1024]" in line


def test_empirical_column_without_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A header-only file printed numpy's 'Mean of empty slice' warnings and named the file as given."""
    (tmp_path / "lens.csv").write_text("tokens\n")
    empirical = {"kind": "empirical", "path": "lens.csv", "column": "tokens"}
    path = scenario(tmp_path, workload={"arrival": {"kind": "poisson", "rate": 1.0}, "prompt": empirical,
                                        "output": {"kind": "fixed", "value": 1}})  # fmt: skip
    line = refused(capsys, "run", path, "--out", tmp_path / "o")
    assert f"{tmp_path / 'lens.csv'}: column 'tokens' has no values" in line


@pytest.mark.parametrize("scheduler", ["vllm", "sarathi"])
def test_token_budget_below_max_model_len_without_chunking(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scheduler: str
) -> None:
    """The scheduler's own error named neither the file nor the key."""
    table = {"scheduler": scheduler, "enable_chunked_prefill": False, "max_num_batched_tokens": 50}
    line = refused(capsys, "run", scenario(tmp_path, policies={"p": table}), "--out", tmp_path / "o")
    assert (
        "small.toml: policies.p.max_num_batched_tokens: must be at least model.max_model_len (4096) "
        "when enable_chunked_prefill = false (got 50)"
    ) in line


def test_price_of_an_unknown_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`sim run` accepted a misspelt GPU in [prices]; `sim plan` refused it without naming the file."""
    path = scenario(tmp_path, prices={"H100-SXN": 2.5})
    for args in (["run", path], ["plan", path, "--rate", "1"]):
        line = refused(capsys, *args, "--out", tmp_path / "o")
        assert "small.toml: prices.H100-SXN: unknown GPU 'H100-SXN'" in line


def test_a_context_longer_than_the_model_serves_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """OPT-13B's positions stop at 2,048 (its config's max_position_embeddings, no RoPE scaling): a
    max_model_len of 4,096 (the default) is refused, as vLLM refuses it, naming the key; 2,048 runs."""
    out = tmp_path / "out"
    err = refused(capsys, "run", CONVOY, "--set", "model.name='opt-13b'", "--out", out)
    assert "model.max_model_len: 4096 is longer than opt-13b serves (2048 positions" in err
    assert not out.exists()
    code, _, _ = cli(
        capsys, "run", CONVOY, "--set", "model.name='opt-13b'", "--set", "model.max_model_len=2048",
        "--set", "horizon.duration_s=20", "--out", out,
    )  # fmt: skip
    assert code == 0


def test_step_of_a_model_whose_weights_do_not_fit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.1-70B's 141 GB of weights on one 24 GB L4 gave a step time, though `sim run` refuses the
    replica; the step is refused with the same arithmetic, and runs where the weights fit."""
    line = refused(capsys, "step", "llama-3.1-70b", "--gpu", "L4", "--batch", "1", "--context", "100")
    assert "step: llama-3.1-70b does not fit on L4 x1 at bf16: weights 141.1 GB" in line
    code, _, _ = cli(capsys, "step", "llama-3.1-70b", "--gpu", "H200", "--tp", "2", "--batch", "1",
                     "--context", "100")  # fmt: skip
    assert code == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--batch", "1", "--context", "1000000"], "step: --context: 1000001 positions (the cached tokens"),
        (["--batch", "1", "--context", "131072"], "step: --context: 131073 positions"),
        (["--prefill", "131073"], "step: --prefill: 131073 positions"),
    ],
)
def test_step_longer_than_the_model_serves_is_refused(
    capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    """A decode at context 1,000,000 on Llama-3.1-8B (131,072 positions) gave a step time, though `sim run`
    refuses a max_model_len past the model's positions; refused with the same words, and the limit shown."""
    line = refused(capsys, "step", "llama-3.1-8b", "--gpu", "H200", *args)
    assert expected in line
    assert "is longer than llama-3.1-8b serves (131072 positions" in line
    code, _, _ = cli(capsys, "step", "llama-3.1-8b", "--gpu", "H200", "--batch", "1", "--context", "131071")
    assert code == 0


@pytest.mark.parametrize(
    ("placement", "args", "expected"),
    [
        (["--tp", "8", "--pp", "2"], ["--prefill", "2000000"], "step: --prefill: 2000000 positions"),
        (["--ep", "16", "--dp", "16"], ["--batch", "4", "--context", "163840"], "step: --context: 163841"),
    ],
)
def test_step_of_a_placement_longer_than_the_model_serves_is_refused(
    capsys: pytest.CaptureFixture[str], placement: list[str], args: list[str], expected: str
) -> None:
    """A DeepSeek-V3 step under PP or EP/DP priced a 2,000,000-token prompt (the model serves 163,840
    positions), where the TP-only step refused it; refused with the same words."""
    line = refused(capsys, "step", "deepseek-v3", "--gpu", "H100-SXM", *placement, *args)
    assert expected in line
    assert "is longer than deepseek-v3 serves (163840 positions" in line


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["capacity", "deepseek-v3", "--gpu", "H100-SXM", "--tp", "8", "--pp", "2"], "--weight-dtype"),
        (["step", "deepseek-v3", "--gpu", "H100-SXM", "--ep", "16", "--dp", "16", "--batch", "1", "--context",
          "10"], "step: --weight-dtype"),
    ],
)  # fmt: skip
def test_placement_in_a_format_other_than_the_checkpoints_is_refused(
    capsys: pytest.CaptureFixture[str], args: list[str], start: str
) -> None:
    """Under PP or EP/DP, `--weight-dtype int4` on DeepSeek-V3's FP8 checkpoint was priced as int4 weights,
    where the TP-only commands refuse a format vLLM would not serve; refused with the same words."""
    line = refused(capsys, *args, "--weight-dtype", "int4")
    assert f"{start}: deepseek-v3 is a fp8 checkpoint" in line
    code, _, _ = cli(capsys, *args, "--weight-dtype", "fp8")
    assert code == 0


@pytest.mark.parametrize("extra", [[], ["--json"], ["--quantisation"], ["--compare", "llama-3.1-8b"]])
def test_capacity_at_a_max_model_len_the_model_does_not_serve_is_refused(
    capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    """`--max-model-len 1000000` on Llama-2-7B (4,096 positions) printed capacity figures for it, though
    `sim run` refuses that max_model_len; refused with the same words, naming the option."""
    line = refused(capsys, "capacity", "llama-2-7b", *extra, "--gpu", "H100", "--max-model-len", "1000000")
    assert "--max-model-len: 1000000 is longer than llama-2-7b serves (4096 positions" in line
    code, _, _ = cli(capsys, "capacity", "llama-2-7b", *extra, "--gpu", "H100", "--max-model-len", "4096")
    assert code == 0


@pytest.mark.parametrize(
    ("sets", "key"),
    [(["model.weight_dtype='bf16'"], "model.weight_dtype"), (["model.kv_dtype='bf16'"], "model.kv_dtype")],
)
def test_bf16_on_a_turing_gpu_is_refused_in_a_scenario(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, sets: list[str], key: str
) -> None:
    """A T4 (compute capability 7.5) has no bf16; vLLM refuses bfloat16 below 8.0, and `sim run` ran it."""
    args = ["--set", "model.gpu='T4'", "--set", "model.name='qwen3-4b'"]
    for s in sets:
        args += ["--set", s]
    out = tmp_path / "out"
    line = refused(capsys, "run", CONVOY, *args, "--out", out)
    assert f"{key}: bf16 does not run on T4 (compute capability 7.5)" in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (["step", "qwen3-4b", "--prefill", "8"], "--weight-dtype"),
        (["step", "qwen3-4b", "--prefill", "8"], "--kv-dtype"),
        (["capacity", "qwen3-4b"], "--weight-dtype"),
        (["capacity", "qwen3-4b"], "--kv-dtype"),
    ],
)
def test_bf16_on_a_turing_gpu_is_refused_on_the_command_line(
    capsys: pytest.CaptureFixture[str], command: list[str], option: str
) -> None:
    """`sim step` and `sim capacity` gave figures for bf16 on a T4, which vLLM refuses."""
    line = refused(capsys, *command, "--gpu", "T4", option, "bf16")
    assert f"{option}: bf16 does not run on T4 (compute capability 7.5)" in line


def test_a_bf16_checkpoint_on_a_turing_gpu_is_served_in_fp16(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's auto dtype serves a bf16 checkpoint in fp16 on a GPU without bf16; the figures said bf16."""
    code, out, _ = cli(capsys, "capacity", "qwen3-4b", "--gpu", "T4", "--json")
    assert code == 0
    figures = json.loads(out)
    assert (figures["weight_dtype"], figures["kv_dtype"]) == ("fp16", "fp16")
    code, out, _ = cli(capsys, "step", "qwen3-4b", "--gpu", "T4", "--prefill", "8", "--json")
    assert code == 0 and json.loads(out)["weight_dtype"] == "fp16"
    code, out, _ = cli(capsys, "capacity", "qwen3-4b", "--gpu", "L4", "--json")
    assert json.loads(out)["weight_dtype"] == "bf16"


def test_gemma2_on_a_turing_gpu_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM serves Gemma-2 on a GPU without bf16 in fp32 (it refuses fp16 for gemma2), a format the
    simulator does not model; it was costed as bf16."""
    line = refused(capsys, "capacity", "gemma-2-9b", "--gpu", "T4")
    assert "gemma-2-9b on T4 (compute capability 7.5)" in line and "fp32" in line


def test_more_kv_blocks_than_the_memory_holds_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`num_kv_blocks` beyond what the GPU has left after the weights is refused with the blocks that fit."""
    big = {"name": "llama-2-7b", "gpu": "A100-80GB", "num_kv_blocks": 4194304}
    line = refused(capsys, "run", scenario(tmp_path, model=big), "--out", tmp_path / "o")
    assert "small.toml: model.num_kv_blocks: 4,194,304 blocks" in line
    assert "at most 7,511 fit" in line and "GB" in line
    assert not (tmp_path / "o").exists()
    few = {"name": "llama-2-7b", "gpu": "A100-80GB", "num_kv_blocks": 40}
    code, _, err = cli(capsys, "run", scenario(tmp_path, model=few), "--out", tmp_path / "p")
    assert code == 0, err


@pytest.mark.parametrize("option", [["--weight-dtype", "fp8"], ["--kv-dtype", "fp8"]])
def test_capacity_quantisation_with_a_chosen_format_is_refused(
    capsys: pytest.CaptureFixture[str], option: list[str]
) -> None:
    """`--quantisation` shows every format and used to ignore `--weight-dtype` and `--kv-dtype` silently."""
    line = refused(capsys, "capacity", "llama-3.1-8b", "--gpu", "H100", "--quantisation", *option)
    assert f"{option[0]} goes without --quantisation" in line


# --- a checkpoint's quantization_config -----------------------------------------------------------------

_CT = {"quant_method": "compressed-tensors", "format": "pack-quantized"}
_Q = "quantization_config"


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        ({"quant_method": "gptq", "bits": "four", "group_size": 128}, f"{_Q}.bits: expected a whole"),
        ({"quant_method": "gptq", "bits": 4, "group_size": "abc"}, f"{_Q}.group_size: expected a wh"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 1.5}, f"{_Q}.group_size: expected a wh"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 7}, f"{_Q}.group_size: expected -1"),
        ({"quant_method": "awq", "w_bit": 4, "q_group_size": 7}, f"{_Q}.q_group_size: expected -1"),
        ({"quant_method": "gptq", "bits": 0, "group_size": 128}, f"{_Q}.bits: expected 4 or 8 (got 0)"),
        ({"quant_method": "awq", "bits": 3}, f"{_Q}.bits: expected 4 or 8 (got 3)"),
        ({**_CT, "config_groups": {"g": {"targets": ["Linear"], "weights": 8}}},
         f"{_Q}.config_groups.g.weights: expected an object (got 8)"),
        ({**_CT, "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": "eight"}}}},
         f"{_Q}.config_groups.g.weights.num_bits: expected a whole number"),
        ({**_CT, "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "group_size": 7}}}},
         f"{_Q}.config_groups.g.weights.group_size: expected -1"),
        ({**_CT, "config_groups": [1]}, f"{_Q}.config_groups: expected an object"),
        ({"quant_method": "fp8", "ignore": "lm_head"}, f"{_Q}.ignore: expected a list of module"),
        ({"quant_method": "fp8", "ignore": ["re:(["]}, f"{_Q}.ignore: 're:([' is no regular"),
        ({"quant_method": 8}, f"{_Q}.quant_method: expected a string"),
    ],
)  # fmt: skip
def test_malformed_quantization_config_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quant: dict[str, Any], expected: str
) -> None:
    config = json.loads(LLAMA.read_text())
    config["quantization_config"] = quant
    (tmp_path / "config.json").write_text(json.dumps(config))
    line = refused(capsys, "capacity", tmp_path / "config.json", "--gpu", "A100-80GB")
    assert f"config.json: {expected}" in line, line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["llama-3.1-8b", "--draft-tp", "2"],
            "error: --draft-tp: expected 1 or the target's tensor parallel",
        ),
        (["llama-2-7b"], "error: --draft-model: qwama-0.5b-instruct's vocabulary"),
    ],
)
def test_capacity_refuses_the_drafts_vllm_refuses(
    capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    line = refused(capsys, "capacity", *args, "--gpu", "H100-SXM", "--draft-model", "qwama-0.5b-instruct")
    assert line.startswith(expected), line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["capacity", "llama-4-scout-fp8", "--gpu", "H100", "--tp", "8", "--weight-dtype", "bf16"],
         "error: --weight-dtype"),
        (["capacity", "deepseek-v3", "--gpu", "H200", "--quantisation"], "error: --quantisation: deepseek"),
        (["step", "llama-4-scout-fp8", "--gpu", "H200", "--tp", "8", "--weight-dtype", "int4", "--batch", "8",
          "--context", "100"], "error: step: --weight-dtype: "),
    ],
)  # fmt: skip
def test_a_quantized_checkpoint_is_served_in_its_own_format_only(
    capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    line = refused(capsys, *args)
    assert line.startswith(expected), line
    assert "its own format" in line or "vLLM serves it in that format" in line, line


def test_a_scenario_serving_a_quantized_checkpoint_in_another_format_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scenario(
        tmp_path, model={"name": "llama-4-scout-fp8", "gpu": "H100", "tp": 8, "weight_dtype": "int4"}
    )
    line = refused(capsys, "run", path, "--out", tmp_path / "out")
    assert "small.toml: model.weight_dtype: llama-4-scout-fp8 is a compressed-tensors checkpoint" in line, (
        line
    )
    assert not (tmp_path / "out").exists()
