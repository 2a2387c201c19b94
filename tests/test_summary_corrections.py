"""Corrections only where a value really changes.

A later statement that sets the same subject (a setting, a limit, a day, an owner, a
choice) to another value supersedes the earlier one, with or without correction words,
in English and Chinese, within one compaction or many compactions later. What only
looks like a correction is left alone: a numbered series of tasks, the same statement
repeated, `key=value` in pasted text or tool output, stack frames, screenshots, and
values of different subjects. Small hand-written sessions; the exact items asserted.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import make_config
from summary_builders import assistant, user
from summary_builders import summarize as run

from ctxd.daemon.engine import Engine
from ctxd.daemon.summary import Summary, SummaryItem


def statements(summary: Summary) -> dict[str, SummaryItem]:
    """Every item made of what someone wrote, by its text, whatever its section."""
    return {
        item.text: item
        for name, item in summary.items()
        if name not in ("files", "tool_activity", "artifacts")
    }


def correction_session(old: str, new: str) -> list[dict[str, Any]]:
    return [
        user(1, old),
        assistant(2, "Understood, will do."),
        user(3, "Please tidy the parser module."),
        user(4, new),
    ]


# ------------------------------------------------------------ real corrections

# (earlier statement, later statement, the "(was X)" note; None when the later one
# names the old value itself)
CORRECTIONS = [
    # without correction words
    ("Export batch 500 for the nightly job.", "Export batch 2000.", "500"),
    ("retries 2 for the upload client", "retries 4 for the upload client", "2"),
    ("The retro is on Thursday.", "Move the retro to Tuesday.", "Thursday"),
    ("Alice owns the billing migration.", "Bob owns the billing migration now.", "Alice"),
    ("The API rate limit is 100 requests per minute.",
     "Let's raise the API rate limit to 250 requests per minute.", "100"),
    ("Deploy window: Tuesday.", "Deploy window moves to Thursday.", "Tuesday"),
    ("Keep the log retention at 14 days.", "Log retention 30 days, please.", "14"),
    ("Set max_connections=50.", "Set max_connections=80.", "50"),
    ("The demo is Friday at 3pm.", "Demo moved to Monday at 10am.", "3pm, Friday"),
    ("The cache TTL is 5 minutes.", "Change the cache TTL to 10 minutes.", "5"),
    ("Use Redis for the job queue.", "Switch the job queue to RabbitMQ.", "Redis"),
    ("连接池上限 100。", "连接池上限 200。", "100"),
    ("缓存过期时间是 5 分钟。", "缓存过期时间换成 10 分钟。", "5"),
    ("并发数 8。", "并发数调成 16。", "8"),
    ("日志保留 7 天。", "日志保留改为 30 天。", "7"),
    ("熊猫团队负责审核。", "审核改由老虎团队负责。", "熊猫团队"),
    # with correction words
    ("Set the upload retries to 2.", "Actually, the upload retries should be 4.", "2"),
    ("Use Node 18.", "Actually use Node 20.", "18"),
    ("用 PostgreSQL 14。", "改用 PostgreSQL 16。", "14"),
    ("Run the cleanup at 02:00.", "Run the cleanup at 04:00 instead.", "02:00"),
    ("We deploy on Friday.", "Let's deploy on Monday instead.", "Friday"),
    ("复盘会周四开。", "复盘会改到周二。", "周四"),
    ("请求超时设为 30 秒。", "请求超时改为 60 秒。", "30"),
    ("导出批次大小用 500 条。", "不对，导出批次大小改成 2000 条。", "500"),
    ("部署用 Docker。", "部署不是用 Docker，而是用 Podman。", None),
    ("Set the invoice due window to 30 days.", "Make the invoice due window 45 days, not 30.",
     None),
    # no subject of its own: the one set last
    ("Set the export batch size to 500.", "Make it 2000.", "export batch size 500"),
    ("The export batch is 500.", "No, 2000.", "export batch 500"),
    ("每批导出上限设为 500 条。", "改成 2000 条。", "每批导出上限 500"),
]


@pytest.mark.parametrize(("old", "new", "was"), CORRECTIONS, ids=[c[1] for c in CORRECTIONS])
def test_a_later_value_of_the_same_subject_supersedes_the_earlier_one(
    old: str, new: str, was: str | None
) -> None:
    summary = run(correction_session(old, new))
    constraints = summary.sections["constraints"]
    assert [(i.text, i.status, i.was, i.sources) for i in constraints] == [
        (old, "superseded", None, [1]),
        (new, "current", was, [4]),
    ]
    assert summary.supersessions == {1: 4}
    # rendered once: the old value only as history, the new one unmarked
    rendered = summary.render()
    note = f" (was {was})" if was else ""
    assert f"\n- {new}{note} [msg 4]" in rendered
    assert f"\n- [superseded] {old} [msg 1]" in rendered


def test_only_the_subject_that_changed_is_superseded() -> None:
    summary = run([
        user(1, "Set the upload retries to 2."),
        user(2, "Set the download retries to 3."),
        user(3, "上传的重试次数设为 2 次。"),
        user(4, "下载的重试次数设为 3 次。"),
        user(5, "Raise the upload retries to 5."),
        user(6, "下载的重试次数改成 6 次。"),
    ])
    assert [(i.text, i.status, i.was) for i in summary.sections["constraints"]] == [
        ("Set the upload retries to 2.", "superseded", None),
        ("Set the download retries to 3.", "current", None),
        ("上传的重试次数设为 2 次。", "current", None),
        ("下载的重试次数设为 3 次。", "superseded", None),
        ("Raise the upload retries to 5.", "current", "2"),
        ("下载的重试次数改成 6 次。", "current", "3"),
    ]
    assert summary.supersessions == {1: 5, 4: 6}


def test_a_statement_without_its_subject_keeps_it_across_compactions() -> None:
    first = run([user(1, "Set the export batch size to 500.")])
    second = run([user(3, "Make it 2000.")], previous=first)
    third = run([user(5, "Make it 3000.")], previous=second)
    fourth = run([user(7, "Set the export batch size to 4000.")], previous=third)
    assert [(i.text, i.status, i.was, i.subject) for i in fourth.sections["constraints"]] == [
        ("Set the export batch size to 500.", "superseded", None, "export batch size"),
        ("Make it 2000.", "superseded", "export batch size 500", "export batch size"),
        ("Make it 3000.", "superseded", "export batch size 2000", "export batch size"),
        ("Set the export batch size to 4000.", "current", "3000", "export batch size"),
    ]
    assert fourth.supersessions == {1: 3, 3: 5, 5: 7}
    zh_first = run([user(1, "每批导出上限设为 500 条。")])
    zh = run([user(3, "改成 2000 条。")], previous=zh_first)
    zh = run([user(5, "每批导出上限改为 800 条。")], previous=zh)
    assert [(i.text, i.status) for i in zh.sections["constraints"]] == [
        ("每批导出上限设为 500 条。", "superseded"),
        ("改成 2000 条。", "superseded"),
        ("每批导出上限改为 800 条。", "current"),
    ]


def test_what_else_a_corrected_statement_said_stays_current() -> None:
    summary = run([
        user(1, "数据库迁移必须在周五之前完成，熊猫团队负责审核。"),
        user(2, "Use port 8080 for the dev server, and never expose it publicly."),
        user(3, "数据库迁移改到周四之前完成。"),
        user(4, "Actually, use port 9090 for the dev server."),
    ])
    assert [(i.text, i.status, i.was, i.sources) for i in summary.sections["constraints"]] == [
        ("数据库迁移必须在周五之前完成，熊猫团队负责审核。", "superseded", None, [1]),
        ("Use port 8080 for the dev server, and never expose it publicly.", "superseded",
         None, [2]),
        ("数据库迁移改到周四之前完成。", "current", "周五", [3]),
        ("熊猫团队负责审核", "current", None, [1]),
        ("Actually, use port 9090 for the dev server.", "current", "8080", [4]),
        ("never expose it publicly", "current", None, [2]),
    ]


def test_a_correction_word_without_a_changed_value_supersedes_nothing() -> None:
    summary = run([
        user(1, "Never run migrations on Mondays."),
        user(2, "Actually, run the migrations now."),
        user(3, "Set the importer batch size to 500."),
        user(4, "Actually, keep the importer batch size at 500."),
    ])
    assert {i.status for i in summary.sections["constraints"]} == {"current"}
    assert "Never run migrations on Mondays." in statements(summary)
    assert summary.supersessions == {}


# --------------------------------------------------------- what is no correction


NOT_CORRECTIONS = {
    "numbered series": [
        "turn 52: Please look at the queue handler for worker number 52.",
        "turn 53: Please look at the queue handler for worker number 53.",
        "Step 74: please check module m74.py and run its tests.",
        "Step 75: please check module m75.py and run its tests.",
        "第 3 步：请检查 m3 模块的测试。",
        "第 4 步：请检查 m4 模块的测试。",
    ],
    "numbered things": [
        "Page 3 looks off.",
        "Page 4 looks off.",
        "Line 42: missing semicolon.",
        "Line 57: missing semicolon.",
        "Issue #12 is about login.",
        "Issue #13 is about login.",
        "Pick up FW-005 first.",
        "Pick up FW-007 first.",
    ],
    "what happened": [
        "At 10:32 the export job failed.",
        "At 11:05 the export job failed.",
        "The test suite took 30 seconds.",
        "The test suite took 45 seconds.",
        "昨天周四开了复盘会。",
        "上周周二开了复盘会。",
    ],
    "placeholders": [
        "[Pasted text #1 +12 lines] len=335",
        "[Pasted text #2 +3 lines] len=41",
    ],
    "screenshots": [
        "[Image #1] screenshot 2024-01-02 at 10.11.12.png width=335",
        "[Image #2] screenshot 2024-01-02 at 10.12.15.png width=41",
    ],
    "stack frames": [
        'File "/app/worker.py", line 335, in run',
        'File "/app/worker.py", line 41, in run',
        "at com.example.Pool.take(Pool.java:88)",
        "at com.example.Pool.take(Pool.java:97)",
    ],
    "log lines": [
        "Here is the log:\nINFO pool size=10 ready\nDEBUG conn=5 timeout=30",
        "Again:\nINFO pool size=20 ready\nDEBUG conn=7 timeout=60",
        "2024-05-01 10:00:01 worker started, batch=500",
        "2024-05-01 10:05:09 worker started, batch=2000",
    ],
    "different subjects": [
        "Retries for upload 2.",
        "Retries for download 3.",
        "Set the billing batch size to 500.",
        "Set the billing page size to 200.",
        "上传的超时设为 30 秒。",
        "下载的超时设为 60 秒。",
    ],
}


@pytest.mark.parametrize("kind", list(NOT_CORRECTIONS))
def test_what_only_looks_like_a_correction_supersedes_nothing(kind: str) -> None:
    texts = NOT_CORRECTIONS[kind]
    summary = run([user(n, text) for n, text in enumerate(texts, start=1)])
    items = statements(summary)
    assert summary.supersessions == {}
    assert [i.text for i in items.values() if i.status != "current" or i.was] == []
    assert "[superseded]" not in summary.render()
    assert "(was " not in summary.render()
    if kind == "different subjects":
        # each its own item, none merged into another
        assert [items[t].sources for t in texts] == [[n] for n in range(1, len(texts) + 1)]


def test_key_value_in_tool_output_is_no_setting() -> None:
    call = {"id": "c1", "type": "function",
            "function": {"name": "run", "arguments": '{"command": "cat pool.cfg"}'}}
    call2 = {**call, "id": "c2"}
    summary = run([
        user(1, "Set the pool size to 10."),
        assistant(2, None, tool_calls=[call]),
        {"id": 3, "role": "tool", "tool_call_id": "c1", "content": "pool size=20 workers=8"},
        assistant(4, None, tool_calls=[call2]),
        {"id": 5, "role": "tool", "tool_call_id": "c2", "content": "pool size=30\ntimeout=60"},
        assistant(6, "The file says pool size=30 and timeout=60."),
    ])
    assert [(i.text, i.status, i.was) for i in summary.sections["constraints"]] == [
        ("Set the pool size to 10.", "current", None)
    ]
    assert summary.supersessions == {}


def test_the_same_statement_repeated_is_one_item_citing_both() -> None:
    summary = run([
        user(1, "Set the importer batch size to 500."),
        assistant(2, "Done."),
        user(3, "Set the importer batch size to 500."),
        user(4, "复盘会安排在周四。"),
        user(5, "复盘会安排在周四。"),
    ])
    assert [(i.text, i.status, i.was, i.sources) for i in summary.sections["constraints"]] == [
        ("Set the importer batch size to 500.", "current", None, [1, 3]),
        ("复盘会安排在周四。", "current", None, [4, 5]),
    ]
    assert summary.supersessions == {}


def test_a_value_set_back_is_current_again_and_not_superseded_by_its_repeat() -> None:
    first = run([user(1, "Set the importer batch size to 500.")])
    second = run([user(3, "Raise the importer batch size to 2000.")], previous=first)
    third = run([user(5, "Set the importer batch size to 500.")], previous=second)
    assert [(i.text, i.status, i.sources) for i in third.sections["constraints"]] == [
        ("Set the importer batch size to 500.", "current", [1, 5]),
        ("Raise the importer batch size to 2000.", "superseded", [3]),
    ]
    # message 1 states the current value: nothing superseded it for good
    assert third.supersessions == {3: 5}


# ------------------------------------------------- many compactions, a real Engine

FILLER = "Done. " + "I went through the module and left the behaviour as it was. " * 8


def _compacted_session(engine: Engine, texts: list[str], filler_zh: bool) -> tuple[str, list[int]]:
    """Each text in its own compaction, with filler turns between them."""
    sid = engine.create_session().session_id
    ids: list[int] = []
    for n, text in enumerate(texts):
        [mid] = engine.append(sid, [{"role": "user", "content": text}]).message_ids
        ids.append(mid)
        for k in range(3):
            ask = (f"请整理第 {n}{k} 个文件。" if filler_zh
                   else f"Please tidy file {n}{k} of the parser.")
            engine.append(sid, [{"role": "assistant", "content": FILLER},
                                {"role": "user", "content": ask},
                                {"role": "assistant", "content": FILLER}])
        assert asyncio.run(engine.compact(sid)).effective
    return sid, ids


def _summary_text(engine: Engine, sid: str) -> str:
    messages = engine.context_messages(sid)
    summaries = [m["content"] for m in messages
                 if m["role"] == "system" and "Constraints" in str(m["content"])]
    assert len(summaries) == 1
    return str(summaries[0])


@pytest.mark.parametrize(("old", "new", "old_value", "new_value"), [
    ("Export batch 500 for the nightly job.", "Export batch 2000.", "500", "2000"),
    ("Set the upload retries to 2.", "Actually, make the upload retries 4.", "2", "4"),
    ("连接池上限 100。", "连接池上限 200。", "100", "200"),
    ("复盘会周四开。", "复盘会改到周二。", "周四", "周二"),
])
def test_the_latest_value_wins_compactions_later(
    tmp_path: Path, old: str, new: str, old_value: str, new_value: str
) -> None:
    engine = Engine(make_config(tmp_path, keep_messages=2))
    try:
        zh = bool(re.search(r"[\u4e00-\u9fff]", old))
        # the old value in the first compaction, the new one three compactions later
        sid, ids = _compacted_session(
            engine, [old, "Never push to main.", "Keep the changelog short.", new], zh
        )
        text = _summary_text(engine, sid)
        current = [ln for ln in text.splitlines() if ln.startswith("- ")
                   and "[superseded]" not in ln]
        [line] = [ln for ln in current if new in ln]
        assert line.startswith(f"- {new} (was {old_value}) #")
        # the old value is nowhere current: only history or the "(was ...)" note
        value = re.compile(rf"(?<![\w#.]){re.escape(old_value)}(?![\w.])")
        for ln in current:
            assert not value.search(re.sub(r"\(was [^)]*\)", "", ln)), ln
        assert any(new_value in ln for ln in current)
        assert engine.context_state(sid).summary.supersessions[ids[0]] == ids[3]
        hits = engine.search(new_value if zh else new, session_id=sid)
        assert hits and hits[0].message_id == ids[3] and hits[0].superseded_by is msgspec.UNSET
        old_hits = [h for h in engine.search(old, session_id=sid) if h.message_id == ids[0]]
        assert [h.superseded_by for h in old_hits] == [ids[3]]
    finally:
        engine.close()


def test_a_numbered_series_and_a_repeat_are_not_marked_in_search(tmp_path: Path) -> None:
    engine = Engine(make_config(tmp_path, keep_messages=2))
    try:
        sid, ids = _compacted_session(engine, [
            "turn 52: Please look at the queue handler for worker number 52.",
            "Set the importer batch size to 500.",
            "turn 53: Please look at the queue handler for worker number 53.",
            "Set the importer batch size to 500.",
        ], filler_zh=False)
        text = _summary_text(engine, sid)
        assert "[superseded]" not in text and "(was " not in text
        assert engine.context_state(sid).summary.supersessions == {}
        for query in ("queue handler worker number", "importer batch size"):
            hits = engine.search(query, session_id=sid)
            assert len(hits) >= 2
            assert [h for h in hits if h.superseded_by is not msgspec.UNSET] == []
        [item] = [i for _, i in engine.context_state(sid).summary.items()
                  if i.text == "Set the importer batch size to 500."]
        assert item.sources == [ids[1], ids[3]] and item.status == "current"
    finally:
        engine.close()
