"""What `tttr record -- PROGRAM`, `tttr replay` and `tttr fork` of a recorded program print:
the program's own output (control characters shown), then one line per fact, or `--json`."""

from __future__ import annotations

import sys

from tttr.engine.replay.result import ProgramResult, ReplayResult


def print_result(res: ProgramResult, db: str, as_json: bool) -> None:
    import json

    from tttr.sessions.safe_text import visible

    if as_json:
        print(json.dumps(res.to_json()))
        return
    if res.stdout:  # the program's own output, as it would have printed it (control characters shown)
        sys.stdout.write(visible(res.stdout) + ("" if res.stdout.endswith("\n") else "\n"))
    if res.stderr:
        sys.stderr.write(visible(res.stderr) + ("" if res.stderr.endswith("\n") else "\n"))
    outcome = "" if res.passed is None else f", check {'passed' if res.passed else 'failed'}"
    limit = f", stopped: {res.limit_hit}" if res.limit_hit else ""
    print(visible(f"recorded run {res.run_id} into {db}: exit code {res.exit_code}, {res.calls} model calls"
                  f"{outcome}{limit}", newlines=False))
    if res.refused:
        print(f"note: the server answered {res.refused} of the program's model calls with an error, unrecorded "
              "(the program's stderr says why)", file=sys.stderr)
    elif res.calls == 0:
        print("note: the program made no model call (it was given OPENAI_BASE_URL)", file=sys.stderr)


def print_replay(res: ReplayResult, as_json: bool, verb: str = "replayed") -> None:
    import json

    from tttr.sessions.safe_text import visible

    if as_json:
        print(json.dumps(res.to_json()))
        return
    if res.stdout:
        sys.stdout.write(visible(res.stdout) + ("" if res.stdout.endswith("\n") else "\n"))

    def say(text: str) -> None:
        print(visible(text, newlines=False))

    say(f"{verb} run {res.run_id} (child of {res.parent}): exit code {res.exit_code}, "
        f"{res.calls_answered} steps answered from the recording")
    if "fork_site" in res.extra:
        say(f"forked at {res.extra['fork_site']}" + ("" if res.extra.get("forked") else " (the program never got there)")
            + f", {res.extra.get('calls_generated', 0)} model calls generated")
    if "fork_site" not in res.extra and res.extra.get("calls_generated"):
        say(f"{res.extra['calls_generated']} model calls generated after the divergence")
    if res.identical and res.extra.get("forked"):
        say("identical to the recording: the program did the same with the new value")
    else:
        say("identical to the recording" if res.identical else "differs from the recording")
    if res.divergence is not None:
        say(f"{verb.removesuffix('ed')} diverged at {res.divergence.describe()}"
            if verb == "replayed" else f"the program diverged after the fork at {res.divergence.describe()}")
        if res.sealed:
            say("sealed: nothing ran live from there; the program got an error for each later call "
                "(its exit code and output below are its own)")
    if not res.same_stdout:
        say("stdout differs from the recording")
    if res.recorded_exit_code is not None and res.exit_code != res.recorded_exit_code:
        say(f"exit code {res.recorded_exit_code} in the recording, {res.exit_code} here")
    if res.same_tree is not None:  # None: a trace's replay, no end tree to compare with
        say("end tree " + ("identical to the recording" if res.same_tree
                           else "differs from the recording"))
    if "compared" in res.extra:  # a program replayed against an imported trace: what was compared
        say(f"compared with trace run {res.extra.get('against_trace')}: {res.extra['compared']}")
    say(f"  logits computed: {res.logits_computed}, tools run: {res.tools_run}")


def print_fork(res: ReplayResult, as_json: bool) -> None:
    if as_json:
        print_replay(res, True)
        return
    print_replay(res, False, verb="forked")
