"""A long Chinese sentence that sets a value, written short when the summary must shrink:
its subject and value, the reasons around them left to the archive."""

from __future__ import annotations

import re

from ctxd.daemon.summarizers.cues import _CJK_RUN, _CONSTRAINT
from ctxd.daemon.summarizers.settings import (
    _PUNCT,
    _VALUE,
    Setting,
    _norm_value,
    other_parts,
)

# the unit after a value: "88121 分钟", "500 条", "30 s"
_UNIT_AFTER = re.compile(
    r"\s*(?:毫秒|秒钟?|分钟|小时|天|周|个月|月|年|次|条|行|个|页|台|倍|人|字节|元"
    r"|%|ms|s|min|h|d|kb|mb|gb|tb|records|rows|days|seconds|minutes|hours|attempts)"
    r"(?![a-z])",
    re.IGNORECASE,
)
# what opens a Chinese subject without naming it: "我们认为库存的…" is about 库存的…
_OPINION_LEAD = re.compile(r"^(?:我们|我|大家)?(?:认为|觉得|决定|建议|打算|希望)")
# a compact form must save at least this share of the sentence to be worth it
_COMPACT_GAIN = 0.6


def compact_setting(text: str, setting: Setting | None) -> str | None:
    """A long Chinese sentence that sets a value, written as its subject and value:
    "经过和运维团队的讨论…我们认为库存的缓存过期时间需要从原来的 12205 调整到 88121 分钟
    才能满足峰值需求。" -> "库存的缓存过期时间：88121 分钟 (was 12205)". The reasons around
    the value are in the archive, which the item's pointer names; a sentence with
    deontic force ("必须在周五之前完成") is a rule and is never shortened this way. None
    when there is no such shorter form."""
    if setting is None or not setting.label or len(setting.values) != 1:
        return None
    if not _CJK_RUN.search(text) or _CONSTRAINT.search(text):
        return None
    if other_parts(text, setting):
        return None  # "…改到 500 条，熊猫团队负责审核": who reviews is more than a reason
    subject = _OPINION_LEAD.sub("", setting.label).strip(_PUNCT)
    if len(subject) < 2:
        return None
    [value] = setting.values
    low = text.casefold()
    at = -1
    for m in _VALUE.finditer(low):
        if _norm_value(m.group(0)) == value:
            at = m.start()
            written = text[m.start() : m.end()]
            unit = _UNIT_AFTER.match(text, m.end())
            if unit is not None:
                written += unit.group(0)
    if at < 0:
        return None
    short = f"{subject}：{written.strip()}"
    old = [v for v in sorted(setting.old) if v != value]
    if old:
        short += f" (was {', '.join(old[:2])})"
    return short if len(short) <= _COMPACT_GAIN * len(text) else None
