"""What a run shows and how the engine process's output reaches the arms' logs.

The engine process here is a real Python process printing what the kit's engine process
prints (log lines, progress events, an `arm_done` per arm); vLLM itself runs in the engine
tests (test_repro_tiny.py).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

from rich.console import Console

from repro import progress, runner
from repro.display import RunDisplay


def test_an_event_line_is_split_from_log_text():
    event = {"event": "phase", "name": "booting the APC engine"}
    line = progress.MARK + json.dumps(event) + "\n"
    assert progress.split(line) == (None, event)
    # C code may leave a line unfinished just before an event arrives.
    assert progress.split("INFO half a line" + line) == ("INFO half a line\n", event)
    assert progress.split("plain vLLM output\n") == ("plain vLLM output\n", None)
    odd = progress.MARK + "not json\n"
    assert progress.split(odd) == (odd, None)


def test_events_are_emitted_only_when_asked(monkeypatch, capfd):
    monkeypatch.delenv(progress.ENV, raising=False)
    progress.emit("phase", name="x")
    assert capfd.readouterr().out == ""
    monkeypatch.setenv(progress.ENV, "1")
    progress.emit("phase", name="x")
    text, event = progress.split(capfd.readouterr().out)
    assert text is None and event["event"] == "phase" and event["name"] == "x"


def _plain_display(arms: list[str]) -> tuple[RunDisplay, io.StringIO]:
    out = io.StringIO()
    return RunDisplay(arms, console=Console(file=out, force_terminal=False, width=200)), out


def test_off_a_terminal_each_phase_and_wave_is_one_line():
    screen, out = _plain_display(["cold-race", "multi-turn"])
    with screen:
        screen.starting("cold-race")
        screen.event("cold-race", {"event": "phase", "name": "booting the APC engine"})
        screen.event("cold-race", {"event": "phase", "name": "APC run"})
        screen.event("cold-race", {"event": "wave", "run": "APC", "index": 1, "requests": 16})
        for done in range(1, 17):
            screen.event("cold-race", {"event": "done", "requests": done})
        screen.event("cold-race", {"event": "wave", "run": "APC", "index": 2, "requests": 8})
        for done in range(1, 9):
            screen.event("cold-race", {"event": "done", "requests": done})
        screen.finished("cold-race", "clean")
    lines = out.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "[repro] cold-race: starting the engine process",
        "[repro] cold-race: booting the APC engine",
        "[repro] cold-race: APC run",
        "[repro] cold-race: APC run, APC wave 1: 16 requests",
        "[repro] cold-race: APC run, APC wave 2: 8 requests",
        "[repro] cold-race: clean",
    ]
    assert screen.states["cold-race"].requests_done == 24
    assert screen.states["multi-turn"].phase == "waiting"


def test_on_a_terminal_the_live_table_shows_phase_wave_requests_and_elapsed():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    screen = RunDisplay(["cold-race", "multi-turn"], console=console)
    with screen:
        screen.starting("cold-race")
        screen.event("cold-race", {"event": "phase", "name": "APC run"})
        screen.event("cold-race", {"event": "wave", "run": "APC", "index": 1, "requests": 16})
        screen.event("cold-race", {"event": "done", "requests": 5})
        console.print(screen._table())
    text = out.getvalue()
    for column in ("arm", "phase", "wave", "requests", "elapsed"):
        assert column in text
    assert "APC wave 1: 5/16" in text and "waiting" in text


def test_engine_output_is_filed_per_arm_and_events_arrive_after_their_lines(tmp_path):
    # A real process writes what the engine process writes; the reader must file each line
    # into the arm that was running when it was printed, and close a log at its arm_done.
    script = (
        "import json, os, sys\n"
        f"MARK = {progress.MARK!r}\n"
        "def event(**e): os.write(1, (MARK + json.dumps(e) + '\\n').encode())\n"
        "print('importing vllm', flush=True)\n"
        "event(event='arm', arm='cold-race', started_at='t')\n"
        "print('cold-race engine line', flush=True)\n"
        "sys.stderr.write('cold-race warning\\n'); sys.stderr.flush()\n"
        "event(event='arm_done', arm='cold-race', outcome='written', message=None)\n"
        "print('between arms', flush=True)\n"
        "event(event='arm', arm='multi-turn', started_at='t')\n"
        "print('multi-turn engine line', flush=True)\n"
        "event(event='arm_done', arm='multi-turn', outcome='written', message=None)\n"
        "print('after the last arm', flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    (tmp_path / "logs").mkdir()
    screen, _ = _plain_display(["cold-race", "multi-turn"])
    reader = runner._EngineOutput(proc.stdout, ["cold-race", "multi-turn"], tmp_path, screen)
    reader.run()
    assert proc.wait() == 0
    events = []
    while (event := reader.events.get()) is not None:
        events.append((event["event"], event["arm"]))
    assert events == [
        ("arm", "cold-race"),
        ("arm_done", "cold-race"),
        ("arm", "multi-turn"),
        ("arm_done", "multi-turn"),
    ]
    logs = tmp_path / "logs"
    assert (logs / "cold-race.log").read_text() == (
        "importing vllm\ncold-race engine line\ncold-race warning\n"
    )
    assert (logs / "multi-turn.log").read_text() == "between arms\nmulti-turn engine line\n"
