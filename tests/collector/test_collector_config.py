"""Command-line parsing: durations, --model-config (KV bytes per token), the command's errors; the
settings declared once (issue 21): option, environment variable, config-file key, default and help
of every setting come from ``CollectorConfig``'s declarations, and the README's table is theirs.

Before: each setting was written four times under changing names (typer option, config object,
environment, app factory), only the two tokens had environment variables, there was no config
file, and ``--help`` cut words at 80 and 100 columns ("HOPLINE_READ_TOK…", issue 24 item 6).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from hopline.collector import cli
from hopline.collector.config import CollectorConfig, markdown_table, settings
from hopline.collector.kv_cache import parse_model_config
from hopline.middleware.contract.units import parse_duration
from support.servers import env_without_hopline


def test_durations():
    assert parse_duration("14d") == 14 * 86400
    assert parse_duration("90s") == parse_duration("90") == 90
    assert parse_duration("1.5h") == 5400
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("two weeks")


def test_model_config_inline_and_from_a_hugging_face_config(tmp_path):
    # 2 (K and V) x 32 layers x 8 KV heads x 128 dims x 2 bytes (bf16) = 131072 bytes per token
    assert parse_model_config("llama=32,8,128,bf16") == ("llama", 131072)
    config = {
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "hidden_size": 2048,
        "torch_dtype": "bfloat16",
    }  # no head_dim: hidden_size / heads = 64 -> 2 x 48 x 4 x 64 x 2 = 49152
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert parse_model_config(f"qwen={tmp_path}") == ("qwen", 49152)
    assert parse_model_config(f"qwen={tmp_path / 'config.json'}") == ("qwen", 49152)
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_model_config("no-equals-sign")
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_model_config("m=32,8,128,float13")


def test_bad_fsync_policy_is_refused(tmp_path):
    with pytest.raises(ValueError, match="fsync must be one of batch, interval, none"):
        CollectorConfig(data_dir=tmp_path, fsync="sometimes")


def test_command_reports_a_bad_model_config_and_exits_2(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hopline.collector",
            "--data-dir",
            str(tmp_path),
            "--model-config",
            "m=/nonexistent.json",
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env_without_hopline(),
        timeout=60,
    )
    assert r.returncode == 2
    assert "--model-config m: cannot read model config /nonexistent.json" in r.stderr


def test_help_has_an_example():
    r = subprocess.run(
        [sys.executable, "-m", "hopline.collector", "--help"],
        check=False,
        capture_output=True,
        text=True,
        env={**env_without_hopline(), "COLUMNS": "200"},
        timeout=60,
    )
    assert r.returncode == 0
    assert "hopline collector --port 9400 --data-dir" in r.stdout


README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_table_of_settings_is_the_declarations():
    text = README.read_text()
    start = text.index("<!-- collector-settings")
    block = text[text.index("\n", start) + 1 : text.index("<!-- /collector-settings -->")]
    assert block == markdown_table()
    # every option the command had before the settings were declared once is still there
    options = [row.split("`")[1] for row in block.splitlines()[2:]]
    assert set(OPTIONS_BEFORE) <= set(options), set(OPTIONS_BEFORE) - set(options)
    assert [row.split("`")[3] for row in block.splitlines()[2:]] == [
        "HOPLINE_" + o[2:].replace("-", "_").upper() for o in options
    ]


OPTIONS_BEFORE = (
    "--data-dir", "--host", "--port", "--token", "--read-token", "--open-reads", "--model-config", "--retention",
    "--tail", "--fsync", "--fsync-interval", "--max-body", "--grace", "--ttl", "--max-open", "--max-open-bytes",
    "--finished-cache", "--recent-requests", "--dedup-capacity", "--dedup-window", "--otlp-resource",
    "--otlp-export", "--log-level",
)  # fmt: skip


class Started(Exception):
    pass


def configured(monkeypatch, args: list[str], env: dict[str, str] | None = None) -> CollectorConfig:
    """The config the command would start with (the start itself is replaced)."""
    seen = []

    def check_can_start(config, host, port):
        seen.append(config)
        raise Started

    monkeypatch.setattr(cli, "check_can_start", check_can_start)
    for name in [s.env for _, s in settings()] + ["HOPLINE_CONFIG"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    app = typer.Typer(add_completion=False)
    cli.register(app)
    with pytest.raises(Started):
        app(args, prog_name="hopline collector", standalone_mode=False)
    return seen[0]


def test_each_setting_comes_from_its_option_its_environment_variable_or_the_config_file(tmp_path, monkeypatch):
    file = tmp_path / "collector.toml"
    file.write_text('grace = "5s"\nttl = "1m"\ntail = ["/a/*.ndjson", "/b/*.ndjson"]\nmax-body = 1000\nport = 0\n')
    config = configured(
        monkeypatch,
        ["--data-dir", str(tmp_path), "--config", str(file), "--grace", "1s", "--open-reads",
         "--model-config", "m=32,8,128,bf16"],
        {"HOPLINE_TTL": "30s", "HOPLINE_FSYNC": "interval"},
    )  # fmt: skip
    assert config.grace == 1.0  # the command line over the file
    assert config.ttl == 30.0  # the environment over the file
    assert config.tail == ("/a/*.ndjson", "/b/*.ndjson") and config.max_body == 1000 and config.port == 0
    assert config.fsync == "interval" and config.open_reads and config.model_config == {"m": 131072}
    # nothing given: the declarations' defaults, as CollectorConfig has them
    assert configured(monkeypatch, ["--data-dir", str(tmp_path)]) == CollectorConfig(data_dir=tmp_path)
    # the data dir from the environment alone
    assert configured(monkeypatch, [], {"HOPLINE_DATA_DIR": str(tmp_path)}).data_dir == tmp_path


def run_collector(*args: str, env: dict[str, str] | None = None, columns: int = 200):
    return subprocess.run(
        [sys.executable, "-m", "hopline.collector", *args],
        check=False, capture_output=True, text=True, timeout=60,
        env={**env_without_hopline(), "COLUMNS": str(columns), **(env or {})},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('grace = "5s"\nnot-a-setting = 1\n', "unknown setting 'not-a-setting'"),
        ("grace = \n", "cannot read"),
        ('grace = "soon"\n', "--grace: not a duration: 'soon'"),
        ('fsync = "sometimes"\n', "--fsync must be one of batch, interval, none"),
        ('healthz-min-free = "lots"\n', "--healthz-min-free: not a size: 'lots'"),
    ],
)
def test_a_bad_config_file_is_one_line_and_exit_2(tmp_path, content, says):
    file = tmp_path / "c.toml"
    file.write_text(content)
    r = run_collector("--data-dir", str(tmp_path), "--port", "0", "--config", str(file))
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("columns", [80, 100])
def test_help_keeps_every_word_whole_at_80_and_100_columns(columns):
    """Each option's help, environment variable and default appear whole, and no line is wider
    than the terminal (before: rich's table cut "HOPLINE_READ_TOK…", "(DIR/events/date…")."""
    r = run_collector("--help", columns=columns)
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= columns
    text = " ".join(re.sub(r"-\n\s+", "-", r.stdout).split())  # words a line break split at a hyphen
    for _, s in settings():
        assert f"{s.option} " in text and s.env in text
        assert " ".join(s.help.split()) in text, s.option
        if s.show is not None:
            assert f"default: {s.show}" in text, s.option
    assert "--token \"$HOPLINE_TOKEN\" --read-token \"$HOPLINE_READ_TOKEN\" \\" in r.stdout  # the example as written


# --- field = option = keyword, and one default (issue 37, item 4) --------------------------------
# A setting is its field (name, default, parse, help) plus the code that uses it: the command's
# option is the field's name with dashes, and every part of the collector takes the field under
# that name from the config (``from_config``), with no default of its own to drift from it.


def test_every_setting_is_the_option_of_its_own_name():
    """``hopline collector``'s options, read off the built command: one per setting field, spelled
    as the field (``max_open`` -> ``--max-open``, ``HOPLINE_MAX_OPEN``), and nothing else but --config."""
    app = typer.Typer(add_completion=False)
    cli.register(app)
    command = typer.main.get_command(app)
    params = {p.name: p for p in command.params if p.name not in ("config_file", "help")}
    fields = {f.name for f, _ in settings()}
    assert set(params) == fields
    for name, param in params.items():
        assert param.opts == ["--" + name.replace("_", "-")], name
        assert param.envvar == "HOPLINE_" + name.upper(), name


def _trivial(value) -> bool:
    """Defaults that say "none", "off" or "one" rather than a tuned number."""
    return value in (None, True, False, 0, 1, "", ()) or value == {} or callable(value)


def own_defaults(cls: type, config: CollectorConfig) -> list[str]:
    """Parameters of ``cls`` that carry a default a setting or limit of ``config`` owns: one named as
    a config field, or one whose value is a config field's (not a trivial one) in a part built from
    the config (``from_config``)."""
    import dataclasses
    import inspect

    owned = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    wrong = []
    for name, param in inspect.signature(cls.__init__).parameters.items():
        default = param.default
        if default is inspect.Parameter.empty:
            continue
        if name in owned:
            wrong.append(f"{cls.__name__}({name}={default!r}): the config's {name} is {owned[name]!r}")
        elif hasattr(cls, "from_config") and not _trivial(default):
            same = [field for field, value in owned.items() if not _trivial(value) and value == default]
            wrong += [f"{cls.__name__}({name}={default!r}) is the config's {field}" for field in same]
    return wrong


def collector_classes() -> list[type]:
    import importlib
    import inspect
    import pkgutil

    import hopline.collector as package

    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name == "__main__":  # runs the command
            continue
        module = importlib.import_module(f"hopline.collector.{info.name}")
        found += [
            c for _, c in inspect.getmembers(module, inspect.isclass)
            if c.__module__ == module.__name__ and "__init__" in vars(c) and c is not CollectorConfig
        ]  # fmt: skip
    return found


def test_no_part_of_the_collector_has_a_default_of_its_own_for_a_setting(tmp_path):
    config = CollectorConfig(data_dir=tmp_path)
    classes = collector_classes()
    # the parts build_collector wires are among those checked
    names = {c.__name__ for c in classes}
    built = {
        "Joiner", "Recorder", "EventStore", "RecentKeys", "WindowSummaries", "Ingestor", "Tailer", "OtlpReceiver"
    }  # fmt: skip
    assert built <= names
    assert all(hasattr(c, "from_config") for c in classes if c.__name__ in built)
    assert [w for c in classes for w in own_defaults(c, config)] == []


def test_the_default_check_sees_a_second_default(tmp_path):
    config = CollectorConfig(data_dir=tmp_path)

    class Named:  # a setting's name with a default of its own
        def __init__(self, *, grace: float = 2.0) -> None: ...

    class Renamed:  # the config's default under another name, in a part built from the config
        def __init__(self, *, max_requests: int = 100_000, enabled: bool = True) -> None: ...

        @classmethod
        def from_config(cls, config: CollectorConfig) -> Renamed: ...

    assert len(own_defaults(Named, config)) == 1
    assert own_defaults(Renamed, config) == [
        "Renamed(max_requests=100000) is the config's max_open",
        "Renamed(max_requests=100000) is the config's recent_requests",
        "Renamed(max_requests=100000) is the config's otlp_max_spans",
    ]


def test_each_part_built_from_the_config_takes_its_values(tmp_path):
    """``build_collector`` on a config whose every tuned value differs from the defaults: each part
    holds the config's value (a ``from_config`` that forgot one would keep the part's own)."""
    from hopline.collector.app import build_collector

    config = CollectorConfig(
        data_dir=tmp_path, grace=3.0, ttl=120.0, max_open=7, max_open_bytes=9 * 2**20, finished_cache=5,
        recent_requests=11, model_config={"m": 64}, max_events_per_request=13, max_finished_bytes=2**20,
        label_cap=3, scope_cap=4, fsync="interval", fsync_interval=0.25, healthz_min_free=2**20,
        dedup_capacity=17, dedup_window=30.0, window=5.0, window_keep=60.0, window_by="model",
        window_scope_cap=6, window_settle=2.0, max_future=9.0, tail=("/x/*.ndjson",), tail_interval=0.125,
        otlp_resource={"replica": ("k8s.pod.name",)},
    )  # fmt: skip
    c = build_collector(config)
    j = c.joiner
    assert (j.grace, j.ttl, j.max_open, j.max_open_bytes, j.finished_cache) == (3.0, 120.0, 7, 9 * 2**20, 5)
    assert (j.recent.capacity, j.kv_bytes_per_token, j.max_events_per_request, j.max_finished_bytes) == (
        11, {"m": 64}, 13, 2**20
    )  # fmt: skip
    assert j.traces.max_traces == 7
    assert (c.recorder.service.cap, c.recorder.scopes.cap) == (3, 4)
    assert (c.store.fsync, c.store.fsync_interval, c.store.healthz_min_free) == ("interval", 0.25, 2**20)
    dedup = c.ingestor.dedup
    assert (dedup.dedup_capacity, dedup.dedup_window, c.ingestor.max_future) == (17, 30.0, 9.0)
    w = j.windows
    assert (w.width, w.keep, w.by, w.scope_cap, w.settle_s) == (5.0, 12, ("model",), 6, 2.0)
    assert c.otlp.resource_map == {"replica": ("k8s.pod.name",)}
    from hopline.collector.tail import Tailer

    tailer = Tailer.from_config(config, lambda data: None)
    assert (tailer.patterns, tailer.tail_interval) == (("/x/*.ndjson",), 0.125)
    assert tailer.state_path.parent == tmp_path
