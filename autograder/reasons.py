"""The grader's reasons, in each edition of the lessons: why a test cell was not run, or failed on a limit.

``autograder/execute.py`` (and the watchdog of ``limits.py``, and the kernel transport of ``checks/kernel.py``)
says why with a ``Reason``: a key of ``REASONS`` and its values. Its English text is what the grader's record,
``report.json``, the notes of ``grade.py`` and the instructor see; the record also keeps the reason itself
(``Reason.record``), from which ``feedback.py`` writes it in the edition the student worked in.

Only reasons about limits and about cells that did not run reach feedback: a check's own message names hidden
inputs and stays in the grader's record.
"""

from __future__ import annotations

from dataclasses import dataclass

REASONS = {
    "en": {
        "missing_cell": "the test cell is not in the notebook",
        "check_not_run": "the grader's check did not run",
        "notebook_time": "the notebook's time limit ({seconds} s) was used up",
        "memory": "the memory limit ({gib} GiB) was exceeded",
        "processes": "more than {count} processes were started",
        "disk": "the disk limit ({gib} GiB or {files} files in its folders) was exceeded",
        "kernel_died": "the kernel died (os._exit, a crash or a signal)",
        "in_cell": "{why} in cell {cell}",
        "cell_stuck": "cell {cell} ran past its time limit ({seconds} s) and did not stop when interrupted",
        "broken_messages": "the kernel's messages are broken in cell {cell} ({detail})",
        "unresponsive": "the kernel stopped answering after cell {cell} ran past its time limit ({seconds} s)",
        "check_timeout": "the grader's check ran past the cell's time limit; the kernel was interrupted",
        "died_in_check": "the kernel died while the grader's check ran",
    },
    "ja": {
        "missing_cell": "テストのセルがノートブックにありません",
        "check_not_run": "採点のチェックが実行されませんでした",
        "notebook_time": "ノートブック全体の制限時間（{seconds} 秒）を使い切りました",
        "memory": "メモリの上限（{gib} GiB）を超えました",
        "processes": "{count} 個を超えるプロセスが起動されました",
        "disk": "ディスクの上限（フォルダ内で {gib} GiB または {files} 個のファイル）を超えました",
        "kernel_died": "カーネルが終了しました（os._exit、クラッシュ、またはシグナル）",
        "in_cell": "{why}（セル {cell}）",
        "cell_stuck": "セル {cell} が制限時間（{seconds} 秒）を超え、中断しても止まりませんでした",
        "broken_messages": "セル {cell} でカーネルのメッセージが壊れています（{detail}）",
        "unresponsive": "セル {cell} が制限時間（{seconds} 秒）を超えたあと、カーネルが応答しなくなりました",
        "check_timeout": "採点のチェックがセルの制限時間を超えたため、カーネルを中断しました",
        "died_in_check": "採点のチェックの実行中にカーネルが終了しました",
    },
}


@dataclass(frozen=True)
class Reason:
    """Why, as a key of ``REASONS`` and its values (plain data, or a ``Reason`` for ``in_cell``'s ``why``)."""

    key: str
    values: tuple[tuple[str, object], ...] = ()

    def text(self, language: str = "en") -> str:
        """The reason in ``language`` (English for a language without a catalogue)."""
        templates = REASONS.get(language, REASONS["en"])
        values = {name: value.text(language) if isinstance(value, Reason) else value for name, value in self.values}
        return templates[self.key].format(**values)

    def __str__(self) -> str:
        return self.text("en")

    def record(self) -> dict:
        """The reason as JSON data (kept in the grader's record of a cell)."""
        return {
            "key": self.key,
            "values": {name: value.record() if isinstance(value, Reason) else value for name, value in self.values},
        }

    @classmethod
    def from_record(cls, record: dict) -> Reason:
        values = record.get("values", {})
        return cls(
            record["key"],
            tuple((name, cls.from_record(v) if isinstance(v, dict) else v) for name, v in values.items()),
        )


def reason(key: str, **values: object) -> Reason:
    """A reason of ``REASONS`` with its values."""
    if key not in REASONS["en"]:
        raise KeyError(f"no reason {key!r}")
    return Reason(key, tuple(values.items()))


def text_of(entry: dict, language: str) -> str | None:
    """The reason of a cell's grading record in ``language``: from its ``why`` when the grader wrote one, else its
    English text."""
    why = entry.get("why")
    if isinstance(why, dict):
        try:
            return Reason.from_record(why).text(language)
        except (KeyError, TypeError, ValueError, IndexError):
            pass
    reason_text = entry.get("reason")
    return None if reason_text is None else str(reason_text)
