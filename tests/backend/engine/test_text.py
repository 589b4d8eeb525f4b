"""Stop strings with held-back text: never emits a stop string or text after it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mkcode.backend.engine.text import TextAssembler


class _CharDetok:
    """Each token id is one character (ord), for testing the assembler alone."""

    def push(self, token_id: int) -> str:
        return chr(token_id)

    def flush(self) -> str:
        return ""


def _run(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    a = TextAssembler(_CharDetok(), stop)
    out = []
    for ch in text:
        out.append(a.push(ord(ch)))
        if a.stopped:
            break
    out.append(a.finish())
    return "".join(out), a.stopped


def test_stop_string_cut_and_held_back():
    a = TextAssembler(_CharDetok(), ("END",))
    assert a.push(ord("x")) == "x"
    assert a.push(ord("E")) == ""  # could start END
    assert a.push(ord("N")) == ""
    assert a.push(ord("D")) == "" and a.stopped


def test_false_alarm_released():
    assert _run("xENxEND", ("END",)) == ("xENx", True)
    assert _run("abE", ("END",)) == ("abE", False)


@given(
    st.text(alphabet="abcEND", max_size=40),
    st.lists(st.text(alphabet="abcEND", min_size=1, max_size=4), max_size=3),
)
def test_output_is_text_before_first_stop(text, stops):
    out, stopped = _run(text, tuple(stops))
    cuts = [text.find(s) for s in stops if s in text]
    if cuts:
        # the earliest position at which any stop string completes decides
        end = min(text.find(s) + len(s) for s in stops if s in text)
        prefix = text[:end]
        first = min(prefix.find(s) for s in stops if s in prefix)
        assert stopped and out == text[:first]
    else:
        assert not stopped and out == text
