"""Text one party writes and another reads: characters that act (terminal escapes, CR,
bidi overrides, lone surrogates) are refused where a name or reason has no use for
them, and shown escaped wherever the client prints (pricing/text.py,
controller/terminal.py, controller/table.py)."""

from __future__ import annotations

import io
import json
import sys
import unicodedata
from pathlib import Path

import pytest

from controller import cli
from controller.statuses import bounded
from controller.table import render_table
from controller.terminal import SafeStream, guarded
from pricing import SpecError
from pricing.cluster import cluster_from_dict
from pricing.errors import Problem
from pricing.fields import unknown_keys
from pricing.text import UNSAFE, escape, label, printable_problem

# a job file's key as the audit sent it: writes "rm -rf ~/*" to the clipboard (OSC 52),
# retitles the window, and draws a fake line over the real one
HOSTILE = "x\x1b]52;c;cm0gLXJmIH4vKgo=\x07\x1b]0;PWNED\x07\r\x1b[2K j9 admitted \u202e"
SERVERS = [
    {"name": "w0", "kind": "worker", "capacity": {"gpu": 8, "bandwidth": 10}},
    {"name": "p0", "kind": "ps", "capacity": {"gpu": 0, "bandwidth": 10}},
]


def test_unsafe_is_exactly_the_control_format_surrogate_and_separator_categories() -> None:
    """Every code point of general category Cc, Cf, Cs, Zl or Zp (of this Python's
    Unicode tables) is matched, and nothing else: a CJK name or an accent shows. (A
    character a later Unicode made a format character is matched ahead of time: this
    Python may still read it as unassigned.)"""
    wanted = {"Cc", "Cf", "Cs", "Zl", "Zp"}
    missed: list[str] = []
    extra: list[str] = []
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        if (unicodedata.category(char) in wanted) != (UNSAFE.fullmatch(char) is not None):
            (missed if unicodedata.category(char) in wanted else extra).append(hex(code))
    assert missed == []
    assert [c for c in extra if unicodedata.category(chr(int(c, 16))) != "Cn"] == []


def test_escape_label_and_the_reason_given() -> None:
    assert escape("plain, 机器, é") == "plain, 机器, é"
    assert escape("a\x1b[2Kb\u202ec\ud800\U000e0041") == "a\\x1b[2Kb\\u202ec\\ud800\\U000e0041"
    assert escape("two\nlines\r", keep="\n") == "two\nlines\\x0d"
    assert label("gpu") == "gpu" and label("显卡") == "显卡"
    assert label("gp\x1bu") == "'gp\\x1bu'" and label(" ") == "' '" and label(3) == "3"
    assert printable_problem("disk swap") is None
    assert printable_problem("ok\x00") == (
        "must not hold control or invisible format characters, found '\\x00' at character 3"
    )


def test_a_key_of_a_job_file_is_shown_escaped_in_its_field_path() -> None:
    """Before: the key went into the field path raw, and a lone surrogate failed the
    UTF-8 of the gRPC status (UNKNOWN, and a 4 KB traceback logged per request)."""
    problems = unknown_keys({HOSTILE: 1, "\ud800": 2, "epoch": 3}, {"epochs"}, "job")
    fields = [p.field for p in problems]
    assert all(UNSAFE.search(f) is None for f in fields), fields
    assert fields[1] == "job.'\\ud800'" and fields[2] == "job.epoch"
    for p in bounded([*problems, Problem("job.\ud800", "raw \x1b")]):
        str(p).encode()  # every one is UTF-8 now, however it was built
        assert UNSAFE.search(str(p)) is None


def test_an_unknown_key_that_looks_like_a_known_one_says_what_differs() -> None:
    """``"еpochs"`` (a Cyrillic е, pasted from a chat) and ``"epochs "`` (a space at its
    end) were told "job.еpochs: unknown key; did you mean 'epochs'?": the key shown as
    it is, the user saw the name suggested to it, and no difference to mend."""
    cyrillic, spaced, plain = "\u0435pochs", "epochs ", "epoch"
    problems = unknown_keys({cyrillic: 1, spaced: 2, plain: 3}, {"epochs"}, "job")
    reasons = [p.reason for p in problems]
    assert reasons[0] == (
        "unknown key; did you mean 'epochs'? (it holds '\u0435' (U+0435) at character 1, not ASCII)"
    ), reasons[0]
    assert problems[1].field == "job.'epochs '", problems[1].field
    assert reasons[1] == "unknown key; did you mean 'epochs'? (it has spaces around it)"
    assert reasons[2] == "unknown key; did you mean 'epochs'?"  # a plain slip: as before


def test_names_in_a_cluster_show_as_they_are_written() -> None:
    cluster = cluster_from_dict(["gpu", "bandwidth"], SERVERS)
    with pytest.raises(SpecError) as err:
        cluster.demand_vector({HOSTILE: 1.0}, "job.worker")
    assert UNSAFE.search(err.value.problems[0].field) is None
    with pytest.raises(SpecError, match=r"servers\[0\]\.name: must not hold control .* at "
                       r"character 3"):  # fmt: skip
        cluster_from_dict(["gpu", "bandwidth"], [{**SERVERS[0], "name": "w0\x1b[2K"}, SERVERS[1]])
    with pytest.raises(SpecError, match=r"resources\[0\]: must not hold .*'\\u202e'"):
        cluster_from_dict(["g\u202epu", "bandwidth"], SERVERS)
    wide = cluster_from_dict(["gpu", "bandwidth"], [{**SERVERS[0], "name": "机器学习"}, SERVERS[1]])
    assert wide.worker_names == ("机器学习",)


def test_a_table_escapes_its_cells_and_pads_by_terminal_columns() -> None:
    table = render_table(["name", "state"], [["机器学习", "up"], ["w\x1b[2K", "down"]], {1})
    lines = table.splitlines()
    assert lines[2] == "机器学习     up" and lines[3] == "w\\x1b[2K   down"
    # a CJK character takes two columns: every line ends at the same column
    from controller.table import width

    assert len({width(line) for line in lines}) == 1


def test_the_client_streams_escape_what_would_act(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    stream = SafeStream(out)
    print(f"reason: {HOSTILE}\n\tnext", file=stream)
    assert out.getvalue() == f"reason: {escape(HOSTILE)}\n\tnext\n"
    assert "\x1b" not in out.getvalue()
    before = sys.stdout, sys.stderr
    with guarded():
        print("a\x1bb")
        print("c\x07d", file=sys.stderr)
    assert (sys.stdout, sys.stderr) == before
    captured = capsys.readouterr()
    assert captured.out == "a\\x1bb\n" and captured.err == "c\\x07d\n"


def test_a_stream_that_cannot_encode_a_character_writes_its_escape() -> None:
    """Before: under an ASCII locale (PYTHONIOENCODING=ascii) `oasis servers` died with
    a UnicodeEncodeError traceback on a server named in another script."""
    raw = io.BytesIO()
    ascii_out = io.TextIOWrapper(raw, encoding="ascii")
    saved = sys.stdout
    sys.stdout = ascii_out
    try:
        with guarded():
            print("机器 w0")
    finally:
        sys.stdout = saved
    ascii_out.flush()
    assert raw.getvalue() == b"\\u673a\\u5668 w0\n"


def test_oasis_prints_a_hostile_trace_key_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`oasis replay` of a trace someone else wrote: the unknown key is named, escaped."""
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({HOSTILE: 1, "resources": [], "servers": [], "jobs": []}))
    assert cli.main(["replay", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err and "\u202e" not in err
    assert "x\\x1b]52;c;" in err, err
