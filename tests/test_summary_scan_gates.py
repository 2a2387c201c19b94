"""The cheap checks that spare the built-in summarizer a regex scan find what the scan
found: ids in tool results behind their literal-text gates (also when a letter is
written with a character re.IGNORECASE folds onto it and str.lower() does not), exit
codes in each wrapper's spelling, paths between any kind of whitespace, and the
remembered normalisations, which stay bounded."""

from __future__ import annotations

from ctxd.daemon.summarizers import cues
from ctxd.daemon.summarizers.paths import _find_paths
from ctxd.daemon.summarizers.tool_ids import result_failed, result_ids


def targets(result: str, command: str = "", creates: bool = False) -> list[str]:
    return [target for target, _ in result_ids(result, creates, command)]


def test_ids_behind_their_gates_are_found() -> None:
    assert targets("see PR #42 and https://github.com/o/r/pull/7") == ["pr:42", "pr:7"]
    pushed = "To github.com:o/r.git\n   1a2b3c4..5d6e7f8  main -> main\n"
    assert targets(pushed, "git push") == ["1a2b3c4", "5d6e7f8"]
    assert targets("Switched to a new branch 'feat/x'\n", "git checkout -b feat/x") == [
        "branch:feat/x"
    ]
    assert targets("[main 1a2b3c4] fix the thing\n 1 file changed", "git commit -m x") == [
        "1a2b3c4"
    ]
    assert targets("commit 1a2b3c4d5e6f\nAuthor: someone") == ["1a2b3c4d5e6f"]
    assert targets('{"job_id": "build 98765", "state": "queued"}') == ["build:98765"]


def test_a_job_word_spelt_with_a_long_s_is_still_read() -> None:
    # "ſ" matches s under re.IGNORECASE but str.lower() keeps it, so "task" is not in
    # the lowered text; the gate must not skip the pattern
    found = targets('Started TAſK 123456 for "deploy"')
    assert [t for t in found if t.endswith(":123456")], found


def test_results_without_id_text_name_nothing() -> None:
    assert targets("def main():\n    return compute(values)\n" * 50) == []


def test_exit_codes_in_each_wrapper() -> None:
    assert result_failed('{"output": "x", "metadata": {"exit_code": 2}}')
    assert result_failed("Process exited with code 1")
    assert not result_failed("Exit code: 0\nok")
    assert result_failed("Exit code: 3\nboom")
    assert not result_failed("no code here")


def test_paths_between_any_whitespace() -> None:
    text = "改\u3000src/app.py\u2003docs/x.md\x1cMakefile and\xa0lib/util.rs"
    assert _find_paths(text, 24) == ["src/app.py", "docs/x.md", "Makefile", "lib/util.rs"]
    assert _find_paths("one two three", 24) == []


def test_remembered_texts_are_bounded() -> None:
    long_text = "word " * 1000
    before = cues._trim_cached.cache_info().currsize
    assert cues._trim(long_text, 50) == cues._trim_uncached(long_text, 50)
    assert cues._trim(long_text, 50).endswith("…")
    assert cues._norm(long_text) == cues._norm_uncached(long_text)
    # a text past the bound is computed, not kept
    assert cues._trim_cached.cache_info().currsize == before
    assert cues._norm("  A  B.  ") == "a b"
