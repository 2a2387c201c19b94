"""Guesses in the built-in summary: kept with their hedge however it is worded, never
replaced by another guess, and shown compactly (one mark for several guesses, each
with its own #N) without losing any of them at the next compaction. English and
Chinese, small hand-written sessions.
"""

from __future__ import annotations

from typing import Any

from summary_builders import assistant, user
from summary_builders import summarize as run

from ctxd.daemon.summarizers.builtin import BuiltinSummarizer
from ctxd.daemon.summary import Summary, SummaryRequest


def guesses(summary: Summary, section: str = "open_items") -> list[tuple[str, bool, str]]:
    return [(i.text, i.unconfirmed, i.status) for i in summary.sections.get(section, [])]


def with_ordinals(
    messages: list[dict[str, Any]], previous: Summary | None = None, budget: int = 4000
) -> Summary:
    """One run with per-session ordinals (message id N is the N-th message), as the
    daemon calls it."""
    ids = [m["id"] for m in messages]
    if previous is not None:
        ids += [s for _, item in previous.items() for s in item.sources]
    request = SummaryRequest(
        session_id="s",
        previous=previous or Summary(),
        messages=messages,
        pins=[],
        instructions=None,
        budget_tokens=budget,
        count_tokens=lambda text: len(text) // 3,
        ordinals={i: i for i in ids},
    )
    return BuiltinSummarizer().summarize_sync(request)


def test_an_agent_statement_hedged_by_the_next_sentence_is_kept_as_a_guess() -> None:
    summary = run([
        assistant(1, "The search workers must stay on the read replica. "
                     "This is unconfirmed so far."),
        assistant(2, "支付的内存增长是事件总线导致的。我还没有验证过。"),
    ])
    assert guesses(summary) == [
        ("The search workers must stay on the read replica.", True, "current"),
        ("支付的内存增长是事件总线导致的。", True, "current"),
    ]
    rendered = summary.render()
    assert "- [unconfirmed] The search workers must stay on the read replica. [msg 1]" in (
        rendered
    )
    assert "- [推测] 支付的内存增长是事件总线导致的。 [msg 2]" in rendered


def test_a_later_guess_on_the_same_subject_replaces_no_earlier_guess() -> None:
    summary = run([
        user(1, "The ledger workers must stay on the job queue. This is unconfirmed so far."),
        user(2, "The ledger workers must stay on the read replica. This is unconfirmed so far."),
        user(3, "账本的工作进程必须留在连接池上。这一点尚未确认。"),
        user(4, "账本的工作进程必须留在任务队列上。这一点尚未确认。"),
    ])
    assert guesses(summary, "constraints") == [
        ("The ledger workers must stay on the job queue.", True, "current"),
        ("The ledger workers must stay on the read replica.", True, "current"),
        ("账本的工作进程必须留在连接池上。", True, "current"),
        ("账本的工作进程必须留在任务队列上。", True, "current"),
    ]
    # nothing of it reads as a correction
    assert "(was" not in summary.render()
    assert not summary.supersessions


def test_a_firm_setting_still_replaces_the_earlier_one() -> None:
    summary = run([
        user(1, "Set the billing batch size to 500 records."),
        user(2, "The billing batch size is probably 800 records, I haven't confirmed that."),
        user(3, "Raise the billing batch size to 2000 records."),
    ])
    by_text = {t: (u, s) for t, u, s in guesses(summary, "constraints")}
    assert by_text["Set the billing batch size to 500 records."] == (False, "superseded")
    assert by_text["Raise the billing batch size to 2000 records."] == (False, "current")


def test_a_hedge_with_words_of_its_own_stays_in_the_text() -> None:
    summary = run([
        assistant(1, "We'll switch the gateway reports to the job queue, though the gain "
                     "may not hold at production scale."),
        user(2, "我们决定把支付的报表切到只读副本，不过收益在生产规模下可能不成立。"),
    ])
    texts = [i.text for _, i in summary.items()]
    assert ("We'll switch the gateway reports to the job queue, though the gain may not "
            "hold at production scale.") in texts
    assert "我们决定把支付的报表切到只读副本，不过收益在生产规模下可能不成立。" in texts


def test_guesses_share_one_line_and_come_apart_at_the_next_compaction() -> None:
    messages = [
        assistant(1, "The checkout slowdown is probably due to the connection pool."),
        assistant(2, "I think the billing duplicate events come from the job queue retrying."),
        assistant(3, "搜索变慢可能是任务队列引起的。"),
    ]
    first = with_ordinals(messages)
    line, chinese = first.sections["open_items"]
    assert line.unconfirmed and line.sources == [1, 2]
    # a guess in the other script gets a line (and a mark) of its own
    assert chinese.unconfirmed and chinese.sources == [3]
    assert first.render().splitlines()[-2:] == [
        "- [unconfirmed] The checkout slowdown is probably due to the connection pool. #1; "
        "I think the billing duplicate events come from the job queue retrying. #2",
        "- [推测] 搜索变慢可能是任务队列引起的。 #3",
    ]
    # the next compaction reads the line back as separate guesses: each is kept,
    # trimmed or dropped on its own, and cites its own message
    later = with_ordinals([user(4, "Please tidy the parser module.")], previous=first)
    assert [(i.text, i.sources) for i in later.sections["open_items"]] == [
        (line.text, [1, 2]), (chinese.text, [3]),
    ]
    tight = with_ordinals([user(4, "Please tidy the parser module.")], previous=first,
                          budget=60)
    kept = tight.sections.get("open_items", [])
    assert all(i.unconfirmed for i in kept)
    # the oldest guess went first, alone: the one it shared a line with stays
    assert [i.sources for i in kept] == [[2], [3]], tight.render()
    # (shortened to its opening first: its mark still says it is a guess)
    assert kept[0].text.startswith("I think the billing duplicate events")
