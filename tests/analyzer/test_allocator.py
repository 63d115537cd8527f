"""``hopline analyze`` keeps Polars' freed memory for a few seconds (analyzer/allocator.py): set
before Polars is imported, or it does nothing, and never over a decay the user chose."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hopline.analyzer import allocator

SETTING = allocator.SETTING


def child_setting(env: dict[str, str], *argv: str) -> str:
    """``_RJEM_MALLOC_CONF`` as Polars left it in a fresh process that loads ``hopline analyze``
    with ``argv`` (Polars appends what it found to its own defaults: jemalloc takes the last of
    each key)."""
    code = "import hopline.analyzer.cli, os; print(os.environ['_RJEM_MALLOC_CONF'])"
    run = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, check=True)
    return run.stdout.strip()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != allocator.VARIABLE}
    return {**env, **extra}


def test_the_analyze_command_sets_the_decay_before_polars_reads_it():
    value = child_setting(clean_env())
    assert value == f"{allocator.POLARS_DEFAULT},{SETTING}"  # ours after Polars' defaults: ours win


def test_a_parent_that_imported_polars_does_not_count_as_a_users_choice():
    # Polars writes its default into the environment, and a child inherits it
    value = child_setting(clean_env(_RJEM_MALLOC_CONF=allocator.POLARS_DEFAULT))
    assert value.endswith(SETTING)


@pytest.mark.parametrize("users", ["dirty_decay_ms:100", "muzzy_decay_ms:0,narenas:2"])
def test_a_decay_the_user_set_is_kept(users):
    assert child_setting(clean_env(_RJEM_MALLOC_CONF=users)) == f"{allocator.POLARS_DEFAULT},{users}"


def test_other_jemalloc_options_of_the_user_stay_beside_the_decay():
    assert child_setting(clean_env(_RJEM_MALLOC_CONF="narenas:2")) == f"{allocator.POLARS_DEFAULT},narenas:2,{SETTING}"


@pytest.mark.parametrize(("argv", "kept"), [
    (["--max-memory", "2GiB"], False),
    (["--max-memory=5GiB"], False),
    (["--max-memory", "6GiB"], True),
    (["--max-memory=64GiB", "--json"], True),
    (["--max-memory", "2GiB", "--max-memory", "8GiB"], True),  # the last one counts, as for the option
    (["--max-memory", "lots"], False),  # not a size: the command says so; nothing is set
])  # fmt: skip
def test_the_pages_are_kept_only_at_a_budget_of_at_least_the_default(argv, kept):
    """Kept pages are not in the budget's per-event figure: below the default budget they could
    take the peak past it (bench/README.md)."""
    value = child_setting(clean_env(), "analyze", "/some/log", *argv)
    assert value.endswith(SETTING) is kept
    assert (value == allocator.POLARS_DEFAULT) is not kept


def test_the_threshold_is_the_default_budget():
    from hopline.analyzer import bounded

    assert allocator.MIN_BUDGET == bounded.DEFAULT_MAX_MEMORY


def test_too_late_once_polars_is_imported(monkeypatch):
    import polars  # noqa: F401 - imported by the test session already; the point is that it is

    monkeypatch.delenv(allocator.VARIABLE, raising=False)
    assert allocator.keep_freed() is False
    assert allocator.VARIABLE not in os.environ


def test_environ_for_a_process_to_start():
    assert allocator.environ({"A": "1"}) == {"A": "1", allocator.VARIABLE: SETTING}
    assert allocator.environ({allocator.VARIABLE: "dirty_decay_ms:1"})[allocator.VARIABLE] == "dirty_decay_ms:1"
