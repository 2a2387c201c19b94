"""Kinds of facts in the built-in summary: corrections win by subject and value, hedges
stay attached, the agent's own artifacts are listed, pointers are per-session ordinals,
and search marks superseded statements. Small hand-written sessions, English and Chinese.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
from helpers import make_config
from summary_builders import assistant, call, result, user
from summary_builders import summarize as run

from ctxd.daemon.engine import Engine
from ctxd.daemon.recall import call_tool, explain
from ctxd.daemon.summarizers.builtin import BuiltinSummarizer
from ctxd.daemon.summary import Summary


def statuses(summary: Summary, section: str = "constraints") -> dict[str, str]:
    return {i.text: i.status for i in summary.sections.get(section, [])}


# ----------------------------------------------------------------- corrections


def test_plain_update_without_correction_words_supersedes_by_subject_and_value() -> None:
    summary = run([
        user(1, "Use a batch size of 500 for the importer."),
        user(2, "Set the exporter batch size to 300."),
        user(3, "Raise the importer batch size to 2000."),
    ])
    assert statuses(summary) == {
        "Use a batch size of 500 for the importer.": "superseded",
        "Set the exporter batch size to 300.": "current",
        "Raise the importer batch size to 2000.": "current",
    }
    new = summary.sections["constraints"][2]
    assert (new.value, new.was) == ("2000", "500")
    assert "- Raise the importer batch size to 2000. (was 500)" in summary.render()


def test_correction_naming_the_old_value_is_rendered_once() -> None:
    summary = run([
        user(1, "Set the invoice due window to 30 days."),
        user(2, "Correction: make the invoice due window 45 days, not 30."),
    ])
    assert statuses(summary) == {
        "Set the invoice due window to 30 days.": "superseded",
        "Correction: make the invoice due window 45 days, not 30.": "current",
    }
    # the new statement names the old value already: no "(was 30)" on top
    assert summary.sections["constraints"][1].was is None


def test_chinese_update_of_a_weekday_and_of_a_long_sentence() -> None:
    summary = run([
        user(1, "每周复盘会安排在周一上午。"),
        user(2, "考虑到月末结算期间上游系统的负载峰值以及上周和财务团队达成的一致意见，"
                "对账任务的批处理大小先定为 500 条，后面再根据监控数据调整。"),
        user(3, "复盘会改到周二上午。"),
        user(4, "经过和运维团队的讨论并结合最近两周的线上监控数据，我们认为对账任务的批处理大小"
                "需要从原来的 500 调整到 2000 条才能满足峰值需求。"),
    ])
    items = summary.sections["constraints"]
    assert [(i.status, i.value) for i in items] == [
        ("superseded", "周一上午"),
        ("superseded", "500"),
        ("current", "周二上午"),
        ("current", "2000"),
    ]
    assert (items[2].subject, items[2].was) == ("复盘会", "周一上午")


def test_a_named_choice_is_a_value_too() -> None:
    summary = run([
        user(1, "Use Redis for the billing job queue."),
        user(2, "Use Redis for the ledger job queue."),
        assistant(3, "We'll use RabbitMQ instead of Redis for the billing job queue."),
        user(4, "计费的缓存用 Memcached。"),
        user(5, "计费的缓存改用 Redis。"),
    ])
    assert statuses(summary) == {
        "Use Redis for the billing job queue.": "superseded",
        "Use Redis for the ledger job queue.": "current",
        "计费的缓存用 Memcached。": "superseded",
        "计费的缓存改用 Redis。": "current",
    }
    [decision] = summary.sections["decisions"]
    assert (decision.subject, decision.value) == ("billing job queue", "rabbitmq")
    assert summary.sections["constraints"][3].subject == "计费的缓存"


def test_similar_subjects_are_not_confused() -> None:
    summary = run([
        user(1, "Set the billing batch size to 500."),
        user(2, "Set the billing page size to 200."),
        user(3, "Use port 7100 for the inventory admin service."),
        user(4, "Use port 5026 for the inventory service."),
        user(5, "Raise the billing batch size to 800."),
        user(6, "计费客户端必须重试 7 次。"),
        user(7, "账本客户端必须重试 4 次。"),
        user(8, "账本客户端的重试改成 2 次。"),
    ])
    assert statuses(summary) == {
        "Set the billing batch size to 500.": "superseded",
        "Set the billing page size to 200.": "current",
        "Use port 7100 for the inventory admin service.": "current",
        "Use port 5026 for the inventory service.": "current",
        "Raise the billing batch size to 800.": "current",
        "计费客户端必须重试 7 次。": "current",
        "账本客户端必须重试 4 次。": "superseded",
        "账本客户端的重试改成 2 次。": "current",
    }


def test_a_superseded_value_stays_superseded_across_compactions() -> None:
    first = run([user(1, "Set the importer batch size to 500.")])
    second = run([user(5, "Raise the importer batch size to 2000.")], previous=first)
    third = run([user(9, "Please tidy the parser module.")], previous=second)
    assert statuses(third) == {
        "Set the importer batch size to 500.": "superseded",
        "Raise the importer batch size to 2000.": "current",
    }
    assert third.supersessions == {1: 5}


# ---------------------------------------------------------------------- hedges


def test_a_trailing_hedge_survives_the_cut() -> None:
    text = (
        "We'll move the nightly export of the reporting tables to the read replica, which "
        "frees the primary during the batch window and the weekly reconciliation run, "
        "although this may not hold at production scale."
    )
    summary = run([assistant(1, text)], summarizer=BuiltinSummarizer(max_item_chars=120))
    [item] = summary.sections["decisions"]
    assert item.unconfirmed
    assert item.text.endswith("… although this may not hold at production scale.")
    assert len(item.text) <= 130
    assert summary.render().startswith("## Decisions\n- [unconfirmed] We'll move the nightly")


def test_a_hedge_in_the_next_sentence_marks_the_item_and_is_no_item_of_its_own() -> None:
    summary = run([
        assistant(1, "We'll switch the exports to the read replica. "
                     "I haven't confirmed that it is faster."),
        user(2, "导出慢的原因必须先归到连接池上。不过这只是推测。"),
    ])
    assert [(i.text, i.unconfirmed) for i in summary.sections["decisions"]] == [
        ("We'll switch the exports to the read replica.", True)
    ]
    assert [(i.text, i.unconfirmed) for i in summary.sections["constraints"]] == [
        ("导出慢的原因必须先归到连接池上。", True)
    ]
    assert "goals" not in summary.sections
    assert "- [推测] 导出慢的原因必须先归到连接池上。" in summary.render()


def test_the_marker_is_carried_until_the_archive_confirms_it() -> None:
    first = run([assistant(1, "We'll switch the exports to the read replica. "
                              "This is unconfirmed so far.")])
    later = run([user(4, "Please tidy the parser module.")], previous=first)
    assert later.sections["decisions"][0].unconfirmed
    confirmed = run(
        [user(8, "Confirmed: switching the exports to the read replica made them faster.")],
        previous=later,
    )
    assert not confirmed.sections["decisions"][0].unconfirmed


def test_a_users_statement_and_its_hedge_are_one_guess_apart_from_the_request() -> None:
    summary = run([
        user(1, "The gateway memory growth is caused by the job queue. "
                "I haven't confirmed that. Look at the parser handler again."),
        user(2, "搜索的内存增长是任务队列导致的。不过这只是推测。请整理一下解析器模块。"),
    ])
    assert [(i.text, i.unconfirmed) for i in summary.sections["open_items"]] == [
        # the mark says what the hedge sentence said: the claim alone is kept
        ("The gateway memory growth is caused by the job queue.", True),
        ("搜索的内存增长是任务队列导致的。", True),
    ]
    # the requests stay goals of their own, with no hedge that is not theirs
    goals = [(i.text, i.unconfirmed) for i in summary.sections["goals"]]
    assert goals == [("Look at the parser handler again.", False),
                     ("请整理一下解析器模块。", False)]


def test_hedged_conclusions_outlast_routine_lines_and_old_artifacts_under_the_budget(
) -> None:
    """Guesses are kept, with their hedge, before files merely mentioned, tool activity
    and the oldest artifacts; the rules in force are kept before all of them."""
    messages = [user(1, "Never push to main.")]
    mid = 2
    for n in range(30):
        messages.append(assistant(mid, None, call(f"c{n}", "write_file",
                                                  path=f"src/pkg/module_{n}.py")))
        messages.append(result(mid + 1, f"c{n}", "ok"))
        messages.append(assistant(mid + 2, f"The slowdown {n} is probably due to cache {n}."))
        mid += 3
    whole = run(messages)
    tight = run(messages, budget=whole_size(whole) * 2 // 3)
    guesses = [i.text for i in tight.sections["open_items"]]
    assert all(i.unconfirmed for i in tight.sections["open_items"])
    assert "Never push to main." in [i.text for i in tight.sections["constraints"]]
    artifacts = tight.sections.get("artifacts", [])
    # more of the 30 guesses than of the 30 files written survive, the newest of each
    assert len(guesses) > len(artifacts)
    assert guesses[-1] == "The slowdown 29 is probably due to cache 29."
    assert "tool_activity" not in tight.sections or len(tight.sections["tool_activity"]) <= 1


def whole_size(summary: Summary) -> int:
    return len(summary.render()) // 3


# ------------------------------------------------------------------- artifacts


def test_artifacts_come_from_the_agents_own_calls_newest_first() -> None:
    summary = run([
        user(1, "Add the report module."),
        assistant(2, None,
                  call("c1", "write_file", path="src/app/report_v1.py", content="x"),
                  call("c2", "write_file", path="src/app/report_v2.py", content="x"),
                  call("c3", "run_shell", command="pytest -q")),
        result(3, "c1", "ok"),
        result(4, "c2", "Error: permission denied"),
        result(5, "c3", "tests/test_report.py::test_a PASSED\nconfigfile: pyproject.toml\n"
                        "1 passed"),
        assistant(6, None,
                  call("c4", "edit_file", path="src/app/report_v1.py", old="a", new="b"),
                  call("c5", "move_file", source="docs/old.md", destination="docs/report.md"),
                  call("c6", "run_shell", command="git commit -am 'report'")),
        result(7, "c4", "1 replacement"),
        result(8, "c5", "moved"),
        result(9, "c6", "[feature/report 3f9a2c1] report\n 2 files changed"),
        assistant(10, None,
                  call("c7", "run_shell", command="gh pr create --fill"),
                  call("c8", "run_shell", command="ci trigger")),
        result(11, "c7", "https://github.com/acme/app/pull/512"),
        result(12, "c8", "Triggered CI pipeline: job 48213977 queued"),
    ])
    assert [(i.text, i.subject) for i in summary.sections["artifacts"]] == [
        ("job 48213977", "job:48213977"),
        ("PR https://github.com/acme/app/pull/512", "pr:512"),
        ("commit 3f9a2c1", "3f9a2c1"),
        ("moved docs/old.md → docs/report.md", "docs/report.md"),
        ("edited src/app/report_v1.py", "src/app/report_v1.py"),
    ]
    files = [i.text for i in summary.sections["files"]]
    # what was only mentioned stays a file mention, not an artifact
    assert "pyproject.toml" in files and "tests/test_report.py" in files


def test_a_patch_names_the_files_it_changes() -> None:
    patch = (
        "*** Begin Patch\n*** Update File: src/app.py\n@@\n-a\n+b\n"
        "*** Add File: src/health.py\n+x = 1\n*** Delete File: src/old.py\n*** End Patch"
    )
    diff = "--- a/docs/guide.md\n+++ b/docs/guide.md\n@@ -1 +1 @@\n-a\n+b\n"
    summary = run([
        assistant(1, None, call("p1", "apply_patch", input=patch)),
        result(2, "p1", "Done!"),
        assistant(3, None, call("p2", "apply_diff", diff=diff)),
        result(4, "p2", "applied"),
    ])
    assert [i.text for i in summary.sections["artifacts"]] == [
        "edited docs/guide.md", "deleted src/old.py", "created src/health.py", "edited src/app.py"
    ]


def test_artifacts_of_a_chinese_session_and_a_failed_write() -> None:
    summary = run([
        user(1, "把报表模块提交一下，然后开个 PR。"),
        assistant(2, "好的。",
                  call("c1", "run_shell", command="git checkout -b feat/报表"),
                  call("c2", "write_file", path="src/报表/导出.py", content="x")),
        result(3, "c1", "Switched to a new branch 'feat/报表'"),
        result(4, "c2", "错误：磁盘已满"),
        assistant(5, None, call("c3", "run_shell", command="gh pr create --fill")),
        result(6, "c3", "Created pull request #77"),
    ])
    assert [i.text for i in summary.sections["artifacts"]] == ["PR #77", "branch feat/报表"]


# ------------------------------------------------- pointers, explain and search

# a long reply, so that summarizing it shrinks the context
DONE = "Done. " + "I went through the module and left the behaviour as it was. " * 8


def test_pointers_are_session_ordinals_mapped_exactly_in_explain(tmp_path: Path) -> None:
    engine = Engine(make_config(tmp_path, keep_messages=4))
    try:
        other = engine.create_session().session_id
        sid = engine.create_session().session_id
        ids: list[int] = []
        # three compactions: each counts its ordinals on from the last one's
        for i in range(36):
            # another session's messages in between make global ids run ahead
            engine.append(other, [{"role": "user", "content": f"noise {i}"}] * 3)
            text = (f"Set the importer batch size to {500 + i}." if i % 4 == 0
                    else f"Please tidy module {i} of the parser.")
            ids += engine.append(sid, [{"role": "user", "content": text},
                                       {"role": "assistant", "content": DONE}]).message_ids
            if i % 12 == 11:
                assert asyncio.run(engine.compact(sid)).effective
        ordinal = {mid: n for n, mid in enumerate(ids, start=1)}
        out = explain(engine, sid)
        assert out.broken_pointers == 0
        checked = 0
        for item in out.items:
            for src in item["sources"]:
                assert src["ordinal"] == ordinal[src["id"]]
                checked += 1
        assert checked >= 10
        rendered = engine.context_state(sid).summary.render()
        assert "- Set the importer batch size to 532. (was 528) #65" in rendered
        assert "[msg" not in rendered
        current = [i for i in out.items if i["section"] == "constraints"
                   and i["status"] == "current"]
        assert [(i["subject"], i["value"], i["was"]) for i in current] == [
            ("importer batch size", "532", "528")
        ]
    finally:
        engine.close()


def test_search_marks_a_superseded_statement_and_ranks_its_correction_above(
    tmp_path: Path,
) -> None:
    engine = Engine(make_config(tmp_path, keep_messages=2))
    try:
        sid = engine.create_session().session_id
        [old] = engine.append(sid, [{"role": "user", "content":
                                     "Set the importer batch size to 500 records."}]).message_ids
        engine.append(sid, [{"role": "assistant", "content": DONE}])
        [new] = engine.append(sid, [{"role": "user", "content":
                                     "Raise the importer batch size to 2000."}]).message_ids
        engine.append(sid, [{"role": "assistant", "content": DONE},
                            {"role": "user", "content": "Thanks, next the docs."},
                            {"role": "assistant", "content": "Ok."}])
        asyncio.run(engine.compact(sid))
        hits = engine.search("importer batch size", session_id=sid)
        assert [h.message_id for h in hits] == [new, old]
        assert hits[1].superseded_by == new and hits[0].superseded_by is msgspec.UNSET
        out = call_tool(engine, sid, "search_past_messages", {"query": "importer batch size"})
        assert f"superseded by msg {new}" in out.content

        zh = engine.create_session().session_id
        [old] = engine.append(zh, [{"role": "user", "content":
                                    "对账任务的批处理大小设为 500 条。"}]).message_ids
        engine.append(zh, [{"role": "assistant", "content": DONE}])
        [new] = engine.append(zh, [{"role": "user", "content":
                                    "对账任务的批处理大小改到 2000 条。"}]).message_ids
        engine.append(zh, [{"role": "assistant", "content": DONE},
                           {"role": "user", "content": "好的，接下来更新文档。"},
                           {"role": "assistant", "content": "好。"}])
        asyncio.run(engine.compact(zh))
        hits = engine.search("批处理大小", session_id=zh)
        assert [(h.message_id, h.superseded_by) for h in hits] == [
            (new, msgspec.UNSET), (old, new)
        ]
    finally:
        engine.close()
